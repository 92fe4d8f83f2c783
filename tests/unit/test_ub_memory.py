"""Userbuffer memory (NOTE [userbuffer memory] in ``overlap/ub/handle.py``): one buffer whose
windows share bytes across kinds, within ``2 * T * H * 2`` bytes per rank; buffer windows
(NOTE [buffer windows]); a view read after another kind's op on shared bytes raises; an op
refuses an operand inside the bytes it communicates through. One rank, host transport; the
multi-rank checks are in ``tests/distributed/workers/ub_worker.py`` and the layers' pipeline
scenario."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.comm import Communicator, buffer_of  # noqa: E402
from overlap.errors import InvalidArgumentError, StaleBufferError, StateError  # noqa: E402
from overlap.gemm import gemm  # noqa: E402
from overlap.ops import GemmReduceScatter, ReduceScatterBesideGemm  # noqa: E402
from overlap.ub import GEMM_NAMES, GemmOverlapConfig, UbConfig, initialize_ub  # noqa: E402
from overlap.ub.handle import plan_buffer  # noqa: E402
from tests.unit.test_buffers import Solo  # noqa: E402

H = 8192  # Llama-3-70B: FFN 28672 and QKV 10240 are the weights' widths, not the buffers'
MIB2 = 2 << 20  # the cuda transport's allocation granule (NOTE [allocation granularity])


def llama_config(tokens: int, tp: int, fp8: bool) -> UbConfig:
    """What ``initialize_ub((tokens, H), group, torch.bfloat16, use_fp8=fp8)`` builds on a
    group of ``tp`` ranks (its methods chosen for that TP size: NOTE [ub tp 2])."""
    gemms = {n: GemmOverlapConfig(fp8=fp8) for n in GEMM_NAMES}
    return UbConfig(tokens, H, gemms=gemms, tp=tp)


# With S = T * H * 2 (a gathered BF16 activation): the column backward holds the gathered
# input (S, FP8 S / 2 + scale slots) beside the bulk reduce-scatter's (tp - 1) / tp * S; the row
# forward's GEMM+RS holds (2 tp - 1) / tp * S, the pipelined layout, at TP 4 as its method and
# at TP 2 as the alternate that a measured plan may run instead of the ring (S; NOTE [plan
# alternates] in overlap/ub/config.py).
EXPECTED_FRACTION_OF_S = {
    (2, False): 1.5,
    (4, False): 1.75,
    (8, False): 1.875,  # TP 8 (issue 33): 15 S / 8, the pipelined GEMM+RS
    (2, True): 1.5,
    (4, True): 1.75,
    (8, True): 1.875,
}


@pytest.mark.parametrize("tokens", [8192, 16384])
@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_llama_layer_is_within_the_bound(tokens: int, tp: int, fp8: bool) -> None:
    windows, size = plan_buffer(llama_config(tokens, tp, fp8), tp)
    s = tokens * H * 2
    bound = 2 * s
    assert size == pytest.approx(EXPECTED_FRACTION_OF_S[tp, fp8] * s, abs=4096)
    assert -(-size // MIB2) * MIB2 <= bound  # also as the cuda transport rounds it
    # Every GEMM name that overlaps runs on a window inside the buffer.
    names = {n for w in windows for n in w.names}
    assert len(names) == 10 and all(w.offset + w.nbytes <= size for w in windows)
    # FP8 gathers half the bytes: never more than BF16.
    if fp8:
        assert size <= plan_buffer(llama_config(tokens, tp, False), tp)[1]


def test_windows_of_the_bulk_pair_are_disjoint_and_the_rest_share() -> None:
    windows, size = plan_buffer(llama_config(8192, 4, False), 4)
    by_kind = {w.kind.value: w for w in windows}
    bag, brs = by_kind["bulk_ag"], by_kind["bulk_rs"]
    assert bag.offset + bag.nbytes <= brs.offset  # the gathered input survives the bulk RS
    assert by_kind["ring_ag"].offset == by_kind["pipeline_rs"].offset == bag.offset == 0
    assert brs.offset + brs.nbytes == size


# ---- windows ---------------------------------------------------------------------------------


def test_windows_share_memory_and_one_generation() -> None:
    comm = Communicator(Solo(), "host")
    try:
        buf = comm.create_buffer(4096, "root")
        a, b = buf.window(0, 2048, "a"), buf.window(2048, 2048, "b")
        assert (a.nbytes, b.nbytes, a.window_offset, b.window_offset) == (2048, 2048, 0, 2048)
        assert a.is_window and a.root is buf and not buf.is_window
        assert a.allocated_bytes == 0 and buf.allocated_bytes == 4096
        root_bytes = buf.view(torch.uint8, (4096,))
        assert b.view(torch.uint8, (8,)).data_ptr() == root_bytes.data_ptr() + 2048
        assert buffer_of(b.view(torch.uint8, (8,))) is buf  # the alias guard finds the root
        nested = b.window(256, 256)
        assert nested.root is buf and nested.window_offset == 2304
        # One op sequence: an op on one window moves every view's generation.
        seen = a.generation
        b.barrier()
        assert buf.epoch == a.epoch == b.epoch == 1
        with pytest.raises(StaleBufferError, match="overwritten since"):
            a.check_current(seen, "a view of a")
        seen = buf.generation
        a.note_local_write()
        with pytest.raises(StaleBufferError):
            b.check_current(seen, "a view of b")
        with pytest.raises(InvalidArgumentError, match="multiple of 256"):
            buf.window(100, 16)
        with pytest.raises(InvalidArgumentError, match="inside the buffer"):
            buf.window(2048, 4096)
        with pytest.raises(InvalidArgumentError, match="non-empty"):
            buf.window(0, 0)
        a.destroy()  # a window owns nothing: the root and its other windows stay usable
        assert not buf.destroyed and not b.destroyed
        b.barrier()
        buf.destroy()
        assert a.destroyed and b.destroyed
        with pytest.raises(StateError, match="destroyed"):
            b.barrier()
        with pytest.raises(StateError):
            buf.window(0, 256)
    finally:
        comm.destroy()


# ---- the handle ------------------------------------------------------------------------------


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def test_a_view_read_after_another_kind_overwrote_it_raises() -> None:
    """The AG+GEMM and GEMM+RS windows share bytes: a gathered input kept past a GEMM+RS is
    stale (typed), and the bytes really were overwritten (the check is what saves it)."""
    ub = initialize_ub((64, 32), Solo(), transport="host", register=False)
    try:
        qkv, proj = ub.get("qkv_fprop"), ub.get("proj_fprop")
        assert qkv.buffer.root is proj.buffer.root is ub.buffer
        x, w = rand(64, 32, seed=1), rand(24, 32, seed=2)
        assert torch.equal(qkv(x, w, keep_gathered=True), gemm(x, w, transb=True))
        assert torch.equal(qkv.gathered_input(), x)
        z, w2 = rand(64, 32, seed=3), rand(32, 32, seed=4)
        assert torch.equal(proj(z, w2), gemm(z, w2, transb=True))
        with pytest.raises(StaleBufferError, match="overwritten since"):
            qkv.gathered_input()
        assert not torch.equal(ub.buffer.view(torch.bfloat16, (64, 32)), x)
        # The bulk all-gather's gathered input too (one generation for every window).
        bag = ub.get("qkv_dgrad")
        dy, wd = rand(64, 24, seed=5), rand(24, 32, seed=6)
        bag(x, dy, wd)
        gathered = bag.gathered_input()
        assert torch.equal(gathered, x)
        proj(z, w2)
        with pytest.raises(StaleBufferError):
            bag.gathered_input()
    finally:
        ub.destroy()


def test_the_bulk_rs_side_gemm_may_read_the_gathered_input_but_not_its_own_bytes() -> None:
    """The column backward's wgrad reads the bulk all-gather's gathered input beside the bulk
    reduce-scatter: their windows are disjoint, so the core accepts it; a side GEMM operand in
    the bulk RS window's own bytes (e.g. a view of the GEMM+RS window) is refused, typed,
    before any communication (NOTE [bulk independence])."""
    ub = initialize_ub((64, 32), Solo(), transport="host", register=False)
    try:
        bag, brs = ub.get("qkv_dgrad"), ub.get("qkv_wgrad")
        assert isinstance(brs, ReduceScatterBesideGemm)
        x, dy, wd = rand(64, 32, seed=1), rand(64, 24, seed=2), rand(24, 32, seed=3)
        dgrad = bag(x, dy, wd)
        gathered = bag.gathered_input()
        dx, dw = brs(dgrad, dy, gathered, transa=True)
        assert torch.equal(dw, gemm(dy, x, transa=True)) and torch.equal(dx, dgrad)
        inside = ub.buffer.view(
            torch.bfloat16, (64, 32), offset=brs.buffer.window_offset - 64 * 32 * 2 + 256
        )
        with pytest.raises(InvalidArgumentError, match="overlaps the symmetric buffer"):
            brs(dgrad, dy, inside, transa=True)
        # The op is still usable after the refusal.
        bag(x, dy, wd)
        dx, dw = brs(dgrad, dy, bag.gathered_input(), transa=True)
        assert torch.equal(dw, gemm(dy, x, transa=True))
    finally:
        ub.destroy()


def test_gemm_rs_needs_no_receive_slot_for_its_own_rows() -> None:
    """NOTE [gemm_rs layout]: 2 tp - 1 slots (tp send, tp - 1 receive)."""
    slot = GemmReduceScatter.buffer_bytes(4, 64, 32, torch.bfloat16, "ring") // 4
    assert GemmReduceScatter.buffer_bytes(4, 64, 32, torch.bfloat16) == 7 * slot
    assert ReduceScatterBesideGemm.buffer_bytes(4, 64, 32, torch.bfloat16) == 3 * slot

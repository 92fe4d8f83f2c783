"""Overlap ops in one process (a 1-rank group on the host transport): buffer layouts, the
ops against a plain GEMM, and typed rejections that leave the op usable.

The multi-rank protocol (chunks, flags, delayed ranks, timeouts) is tested in
tests/distributed/test_overlap_ops.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from overlap._native import native  # noqa: E402
from overlap.comm import Communicator  # noqa: E402
from overlap.errors import (  # noqa: E402
    ConfigError,
    InvalidArgumentError,
    StateError,
    UnsupportedHardwareError,
)
from overlap.gemm import gemm  # noqa: E402
from overlap.ops import AllGatherGemm, GemmReduceScatter, RsMethod  # noqa: E402
from overlap.quantization import (  # noqa: E402
    BlockScalingConfig,
    CurrentScalingConfig,
    QuantizedTensor,
    cast_to_fp8,
    make_quantizer,
)
from tests.unit.test_buffers import Solo  # noqa: E402

E4M3 = torch.float8_e4m3fn


@pytest.fixture
def comm() -> Iterator[Communicator]:
    c = Communicator(Solo(), "host")
    yield c
    c.destroy()


def per_tensor(x: torch.Tensor) -> QuantizedTensor:
    return make_quantizer(CurrentScalingConfig(), columnwise=False).quantize(x)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("tp", [1, 2, 3, 8])
def test_layouts_are_aligned_and_disjoint(tp: int) -> None:
    ops = native().comm_ops
    for shard in (16, 1000, 4096, 12345):
        scale_offset, nbytes = ops.ag_gemm_layout(tp, shard, True)
        assert scale_offset % 256 == 0 and scale_offset >= tp * shard
        assert nbytes == scale_offset + 16 * tp
        assert ops.ag_gemm_layout(tp, shard, False) == (0, tp * shard)
        slot, recv, total = ops.gemm_rs_layout(tp, shard)
        assert slot % 256 == 0 and shard <= slot < shard + 256
        # No receive slot for this rank's own rows (NOTE [gemm_rs layout]).
        assert recv == tp * slot and total == recv + (tp - 1) * slot
        # The ring: one send slot, then one receive slot per hop (NOTE [gemm_rs_ring layout]).
        assert ops.gemm_rs_ring_layout(tp, shard) == (slot, slot, tp * slot)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_one_rank_ops_are_the_plain_gemm(comm: Communicator, fp8: bool) -> None:
    x, w = rand(37, 64, seed=1), rand(48, 64, seed=2) * 0.1
    xs, ws = (per_tensor(x), per_tensor(w)) if fp8 else (x, w)
    xd, xsi = (xs.rowwise_data, xs.rowwise_scale_inv) if fp8 else (x, None)
    wd, wsi = (ws.rowwise_data, ws.rowwise_scale_inv) if fp8 else (w, None)
    want = gemm(xd, wd, transb=True, a_scale_inv=xsi, b_scale_inv=wsi, out_dtype=torch.bfloat16)

    ag = AllGatherGemm(comm, 40, 64, E4M3 if fp8 else torch.bfloat16)
    out = torch.full((37, 48), float("nan"), dtype=torch.bfloat16)
    assert torch.equal(ag(xs, ws, out=out), want)
    with pytest.raises(StateError, match="keep_gathered=True"):  # not kept by default
        ag.gathered_input()
    assert torch.equal(ag(xs, ws, out=out, keep_gathered=True), want)
    gathered = ag.gathered_input()
    if fp8:
        assert torch.equal(gathered.rowwise_data.view(torch.uint8), xd.view(torch.uint8))
        assert torch.equal(gathered.rowwise_scale_inv, xsi)  # read from the buffer
    else:
        assert torch.equal(gathered, x)
    ag.destroy()

    for method, sub in (("pipelined", 2), ("ring", 1), ("ring", 3)):
        rs = GemmReduceScatter(comm, 40, 48, torch.bfloat16, method=method, ring_subchunks=sub)
        assert torch.equal(rs(xs, ws), want), (method, sub)
        rs.destroy()


@pytest.mark.parametrize("method", ["pipelined", "ring"])
def test_fp8_output_of_gemm_rs(comm: Communicator, method: str) -> None:
    x, w = rand(16, 32, seed=3), rand(16, 32, seed=4)
    rs = GemmReduceScatter(comm, 16, 16, E4M3, method=method)
    scale = torch.tensor([2.0])
    amax, scale_inv = torch.full((1,), float("nan")), torch.full((1,), float("nan"))
    got = rs(x, w, out_scale=scale, out_amax=amax, out_scale_inv=scale_inv)
    partial = gemm(x, w, transb=True)
    want, _ = cast_to_fp8(partial.float(), scale, fp8_dtype=E4M3)
    assert got.dtype == E4M3 and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert amax.item() == partial.float().abs().max().item() and scale_inv.item() == 0.5
    rs.destroy()


def test_rejections_are_typed_and_leave_the_op_usable(comm: Communicator) -> None:
    ag = AllGatherGemm(comm, 32, 64, torch.bfloat16)
    x, w = rand(8, 64), rand(16, 64)
    with pytest.raises(StateError, match="before the first call"):
        ag.gathered_input()
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(rand(8, 32), w)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(rand(33, 64), w)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        ag(rand(64, 8).t(), w)
    with pytest.raises(InvalidArgumentError, match="bare FP8"):
        ag(x.to(E4M3), w)
    with pytest.raises(InvalidArgumentError, match="2-D"):
        ag(x.view(-1), w)
    with pytest.raises(UnsupportedHardwareError, match="FP8 outputs"):
        ag(x, w, out_dtype=E4M3)
    block = make_quantizer(BlockScalingConfig(), columnwise=False).quantize(rand(8, 128))
    with pytest.raises(UnsupportedHardwareError, match="per-tensor FP8"):
        ag(block, w)
    with pytest.raises(InvalidArgumentError, match="compute_lanes"):
        AllGatherGemm(comm, 32, 64, torch.bfloat16, compute_lanes=5)
    want = gemm(x, w, transb=True)
    assert torch.equal(ag(x, w), want)  # still usable
    ag.destroy()
    with pytest.raises(StateError, match="destroyed"):
        ag(x, w)

    rs = GemmReduceScatter(comm, 32, 16, torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="must be \\[16, 64\\]"):
        rs(x, rand(8, 64))
    with pytest.raises(InvalidArgumentError, match="out must be"):
        rs(x, w, out=torch.empty(8, 16, dtype=torch.float32))
    with pytest.raises(InvalidArgumentError, match="out_dtype"):
        GemmReduceScatter(comm, 32, 16, torch.int32)
    with pytest.raises(InvalidArgumentError, match="method must be one of"):
        GemmReduceScatter(comm, 32, 16, torch.bfloat16, method="tree")
    with pytest.raises(InvalidArgumentError, match=r"ring_subchunks must be 1\.\.4"):
        GemmReduceScatter(comm, 32, 16, torch.bfloat16, method="ring", ring_subchunks=0)
    assert torch.equal(rs(x, w), want)
    rs.destroy()

    ring = GemmReduceScatter(comm, 32, 16, torch.bfloat16, method="ring")
    sizes = [GemmReduceScatter.buffer_bytes(1, 32, 16, torch.bfloat16, m) for m in RsMethod]
    # The ring: tp slots; the pipelined method: 2 tp - 1 (the same at one rank).
    assert ring.buffer.nbytes == sizes[1] <= sizes[0]
    assert GemmReduceScatter.buffer_bytes(4, 32, 16, torch.bfloat16, "ring") * 7 == (
        GemmReduceScatter.buffer_bytes(4, 32, 16, torch.bfloat16, "pipelined") * 4
    )
    with pytest.raises(InvalidArgumentError, match="must be \\[16, 64\\]"):
        ring(x, rand(8, 64))
    ring.ring_subchunks = 5  # past the constructor's check: the core refuses it
    with pytest.raises(ConfigError, match="ring_subchunks must be in \\[1, 4\\]"):
        ring(x, w)
    ring.ring_subchunks = 4
    assert torch.equal(ring(x, w), want)  # still usable
    ring.destroy()
    with pytest.raises(StateError, match="destroyed"):
        ring(x, w)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda c: AllGatherGemm(c, 32.0, 64, torch.bfloat16),
            "max_tokens must be an int, got 32.0",
        ),
        (lambda c: AllGatherGemm(c, "32", 64, torch.bfloat16), "max_tokens must be an int"),
        (lambda c: AllGatherGemm(c, 32, 64, "bfloat16"), r"dtype must be a torch dtype"),
        (lambda c: AllGatherGemm(c, 32, 64, torch.bfloat16, compute_lanes=1.5), "1..4, got 1.5"),
        (lambda c: AllGatherGemm(c, 32, 64, torch.bfloat16, staggered_puts=1), "True or False"),
        (lambda c: GemmReduceScatter(c, 32, 16.5, torch.bfloat16), "out_features must be an int"),
        (lambda c: GemmReduceScatter(c, 32, 16, torch.bfloat16, pieces=2.0), "pieces must be"),
        (
            lambda c: GemmReduceScatter(c, 32, 16, torch.bfloat16, reduce_max_blocks=-1),
            "reduce_max_blocks must be >= 0",
        ),
        (lambda c: GemmReduceScatter(c, 32, 16, torch.bfloat16, method="ring", pieces=2), "pieces"),
        (lambda c: GemmReduceScatter(c, 32, 16, torch.bfloat16, pull_shards=True), "ring method"),
    ],
)
def test_constructor_arguments_are_typed(comm: Communicator, make: object, match: str) -> None:
    # A string, a float or a bool where an int or a dtype belongs is an InvalidArgumentError
    # naming it, never a bare TypeError / AttributeError or a silent truncation.
    with pytest.raises(InvalidArgumentError, match=match):
        make(comm)  # type: ignore[operator]


def test_the_rs_method_crosses_the_binding_as_an_enum(comm: Communicator) -> None:
    ops = native().comm_ops
    assert RsMethod.RING.native == ops.RsMethod.RING
    assert RsMethod.of_native(ops.RsMethod.PIPELINED) is RsMethod.PIPELINED
    assert [m.name for m in RsMethod] == list(ops.RsMethod.__members__)
    rs = GemmReduceScatter(comm, 32, 16, torch.bfloat16)
    x, w = rand(32, 8), rand(16, 8)
    with pytest.raises(TypeError):  # a string is no RsMethod
        ops.gemm_rs(
            rs.buffer._core,
            x,
            w,
            torch.empty(32, 16, dtype=torch.bfloat16),
            transb=True,
            method="ring",
        )
    with pytest.raises(ConfigError, match="pieces are the pipelined method's"):
        ops.gemm_rs(
            rs.buffer._core,
            x,
            w,
            torch.empty(32, 16, dtype=torch.bfloat16),
            transb=True,
            method=ops.RsMethod.RING,
            pieces=2,
        )
    with pytest.raises(ConfigError, match="ring_subchunks and pull_shards are the ring"):
        ops.gemm_rs(
            rs.buffer._core,
            x,
            w,
            torch.empty(32, 16, dtype=torch.bfloat16),
            transb=True,
            pull_shards=True,
        )
    assert torch.equal(rs(x, w), gemm(x, w, transb=True))  # still usable
    rs.destroy()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_several_weights_share_one_gather(comm: Communicator, fp8: bool) -> None:
    x = rand(21, 64, seed=11)
    ws = [rand(n, 64, seed=12 + i) * (0.1 + i) for i, n in enumerate((48, 16, 32))]
    xs = per_tensor(x) if fp8 else x
    wq = [per_tensor(w) for w in ws] if fp8 else ws  # each weight with its own scale_inv
    biases = [rand(1, 48, seed=20).view(-1), None, rand(1, 32, seed=21).view(-1)]
    ag = AllGatherGemm(comm, 24, 64, E4M3 if fp8 else torch.bfloat16, compute_lanes=2)
    outs = tuple(torch.full((21, w.shape[0]), float("nan"), dtype=torch.bfloat16) for w in ws)
    got = ag(xs, wq, bias=biases, out=outs)
    assert isinstance(got, tuple) and all(g is o for g, o in zip(got, outs, strict=True))
    xd, xsi = (xs.rowwise_data, xs.rowwise_scale_inv) if fp8 else (x, None)
    for i, (g, w) in enumerate(zip(got, wq, strict=True)):
        wd, wsi = (w.rowwise_data, w.rowwise_scale_inv) if fp8 else (w, None)
        want = gemm(
            xd, wd, transb=True, a_scale_inv=xsi, b_scale_inv=wsi, bias=biases[i],
            out_dtype=torch.bfloat16,
        )  # fmt: skip
        assert torch.equal(g, want), i
    # A one-element list is a tuple of one; allocated outputs take out_dtype.
    (one,) = ag(xs, wq[1:2], out_dtype=torch.float32)
    assert one.dtype == torch.float32 and one.shape == (21, 16)
    ag.destroy()


def test_several_weights_are_all_checked_before_the_op(comm: Communicator) -> None:
    ag = AllGatherGemm(comm, 32, 64, torch.bfloat16)
    x, w = rand(8, 64, seed=30), rand(16, 64, seed=31)
    with pytest.raises(InvalidArgumentError, match="weight is an empty list"):
        ag(x, [])
    with pytest.raises(
        InvalidArgumentError, match=r"\(weight 2\): weight \(16, 32\) must be \[N, 64\]"
    ):
        ag(x, [w, w, rand(16, 32, seed=32)])
    with pytest.raises(
        InvalidArgumentError, match=r"ag_gemm \(weight 1\): input .* share one dtype"
    ):
        ag(x, (w, w.float()))
    with pytest.raises(InvalidArgumentError, match="bias must be None or a list/tuple of 2"):
        ag(x, [w, w], bias=[None])
    with pytest.raises(InvalidArgumentError, match="out must be None or a list/tuple of 2"):
        ag(x, [w, w], out=torch.empty(8, 16, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match=r"\(weight 1\): out must be \[8, 16\]"):
        ag(x, [w, w], out=[torch.empty(8, 16, dtype=torch.bfloat16), torch.empty(8, 8)])
    # The core's own checks name the weight: a float32 bias for bfloat16 outputs.
    with pytest.raises(InvalidArgumentError, match=r"ag_gemm \(weight 1\): gemm: the bias"):
        ag(x, [w, w], bias=[None, torch.zeros(16)])
    with pytest.raises(UnsupportedHardwareError, match=r"\(weight 0\): FP8 outputs"):
        ag(x, [w, w], out_dtype=E4M3)
    got = ag(x, [w, w * 2])  # still usable
    want = gemm(x, w, transb=True)
    assert torch.equal(got[0], want) and torch.equal(got[1], gemm(x, w * 2, transb=True))
    ag.destroy()

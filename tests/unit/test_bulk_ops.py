"""Bulk overlap ops in one process (a 1-rank group on the host transport): the layout, the
collective and the side GEMM against a plain GEMM, and typed rejections (independence of the
GEMM from the collective included) that leave the op usable.

The multi-rank protocol (pushes, flags, delayed ranks, timeouts) is tested in
tests/distributed/test_bulk.py.
"""

from __future__ import annotations

import re
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
from overlap.ops import AllGatherBesideGemm, AllGatherGemm, ReduceScatterBesideGemm  # noqa: E402
from overlap.ops.bulk import bulk_rs_defaults, bulk_rs_max_blocks  # noqa: E402
from overlap.quantization import (  # noqa: E402
    BlockScalingConfig,
    CurrentScalingConfig,
    QuantizedTensor,
    cast_to_fp8,
    make_quantizer,
)
from tests.unit.test_buffers import Solo  # noqa: E402

E4M3 = torch.float8_e4m3fn
NAN = float("nan")


@pytest.fixture
def comm() -> Iterator[Communicator]:
    c = Communicator(Solo(), "host")
    yield c
    c.destroy()


def per_tensor(x: torch.Tensor) -> QuantizedTensor:
    return make_quantizer(CurrentScalingConfig(), columnwise=False).quantize(x)


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("tp", [1, 2, 3, 8])
def test_bulk_rs_layout_is_aligned(tp: int) -> None:
    for partial in (16, 1000, 4096, 12345):
        slot, total = native().comm_ops.bulk_rs_layout(tp, partial)
        assert slot % 256 == 0 and partial <= slot < partial + 256
        # One slot per peer (one at TP 1): none for this rank's own partial (NOTE [bulk_rs
        # layout]).
        assert total == max(tp - 1, 1) * slot


def test_ag_buffer_is_ag_gemms(comm: Communicator) -> None:
    for dtype in (torch.bfloat16, E4M3):
        assert AllGatherBesideGemm.buffer_bytes(4, 100, 48, dtype) == AllGatherGemm.buffer_bytes(
            4, 100, 48, dtype
        )


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_one_rank_all_gather_beside_gemm(comm: Communicator, fp8: bool) -> None:
    x = rand(24, 64, seed=1)
    # dgrad-like side GEMM: dX [40, 32] = dY [40, 48] @ W [48, 32] (W not transposed); FP8
    # operands take the TN layout (a linear layer's forward) instead.
    dy, w = rand(40, 48, seed=2), rand(48, 32, seed=3) * 0.1
    ag = AllGatherBesideGemm(comm, 32, 64, E4M3 if fp8 else torch.bfloat16)
    out = torch.full((40, 32), NAN, dtype=torch.bfloat16)
    if fp8:
        xs, dys, wts = per_tensor(x), per_tensor(dy), per_tensor(w.t().contiguous())
        got = ag(xs, dys, wts, transb=True, out=out)
        want = gemm(
            dys.rowwise_data,
            wts.rowwise_data,
            transb=True,
            a_scale_inv=dys.rowwise_scale_inv,
            b_scale_inv=wts.rowwise_scale_inv,
        )
        gathered = ag.gathered_input()
        assert torch.equal(
            gathered.rowwise_data.view(torch.uint8), xs.rowwise_data.view(torch.uint8)
        )
        assert torch.equal(gathered.rowwise_scale_inv, xs.rowwise_scale_inv)  # from the buffer
        assert torch.equal(ag.gathered_scale_invs(), xs.rowwise_scale_inv)
    else:
        got = ag(x, dy, w, out=out)
        want = gemm(dy, w)
        assert torch.equal(ag.gathered_input(), x)
    assert got is out and torch.equal(got, want)
    ag.destroy()


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, E4M3], ids=["bf16", "fp8"])
def test_one_rank_reduce_scatter_beside_gemm(comm: Communicator, out_dtype: torch.dtype) -> None:
    partial = rand(16, 40, seed=4) * 3
    # wgrad-like side GEMM: dW [24, 32] = dY^T [24, 64] @ X [64, 32], accumulated (beta = 1)
    # into a float32 main_grad.
    dy, x = rand(64, 24, seed=5), rand(64, 32, seed=6)
    main_grad = torch.randn(24, 32, generator=torch.Generator().manual_seed(7))
    want_grad = gemm(dy, x, transa=True, out=main_grad.clone(), beta=1.0)
    rs = ReduceScatterBesideGemm(comm, 16, 40, torch.bfloat16)
    extra: dict = {}
    if out_dtype == E4M3:
        scale = torch.tensor([4.0])
        extra = {"out_scale": scale, "out_amax": torch.full((1,), NAN)}
        extra["out_scale_inv"] = torch.full((1,), NAN)
        out = torch.full((16, 40), 0x7F, dtype=torch.uint8).view(E4M3)  # NaN codes
        want, _ = cast_to_fp8(partial.float(), scale, fp8_dtype=E4M3)
    else:
        out = torch.full((16, 40), NAN, dtype=torch.bfloat16)
        want = partial
    got, grad = rs(
        partial,
        dy,
        x,
        out=out,
        out_dtype=out_dtype,
        transa=True,
        gemm_out=main_grad,
        beta=1.0,
        **extra,
    )
    assert got is out and grad is main_grad
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(grad, want_grad)
    if out_dtype == E4M3:
        assert extra["out_amax"].item() == partial.float().abs().max().item()
        assert extra["out_scale_inv"].item() == 0.25
    rs.destroy()


def test_all_gather_rejections_leave_the_op_usable(comm: Communicator) -> None:
    ag = AllGatherBesideGemm(comm, 32, 64, torch.bfloat16)
    x, a, b = rand(8, 64, seed=1), rand(16, 24, seed=2), rand(24, 8, seed=3)
    with pytest.raises(StateError, match="before the first call"):
        ag.gathered_input()
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(rand(8, 32, seed=4), a, b)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(rand(33, 64, seed=4), a, b)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        ag(rand(64, 8, seed=4).t(), a, b)
    with pytest.raises(InvalidArgumentError, match="bare FP8"):
        ag(x.to(E4M3), a, b)
    with pytest.raises(InvalidArgumentError, match="without a_scale_inv"):
        ag(x, a.to(E4M3), b.to(E4M3))
    with pytest.raises(InvalidArgumentError, match="only for a bare FP8"):
        ag(x, a, b, a_scale_inv=torch.ones(1))
    with pytest.raises(InvalidArgumentError, match="share one dtype"):
        ag(x, a, b.float())
    with pytest.raises(InvalidArgumentError, match=r"beta=1\.0 accumulates"):
        ag(x, a, b, beta=1.0)
    with pytest.raises(InvalidArgumentError, match=r"out must be \[16, 8\]"):
        ag(x, a, b, out=torch.empty(8, 16, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match="inner dimensions differ"):
        ag(x, a, rand(16, 8, seed=5))  # op(a) [16, 24] @ op(b) [16, 8]: K mismatch (core)
    block = make_quantizer(BlockScalingConfig(), columnwise=False).quantize(rand(8, 128, seed=6))
    with pytest.raises(UnsupportedHardwareError, match="per-tensor FP8"):
        ag(x, block, b)
    with pytest.raises(InvalidArgumentError, match="dtype must be"):
        AllGatherBesideGemm(comm, 32, 64, torch.int32)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        AllGatherBesideGemm(comm, 0, 64, torch.bfloat16)
    # NOTE [bulk independence]: the GEMM must not touch the buffer the peers write into, e.g.
    # by multiplying the previous call's gathered input (a view of the buffer).
    ag(x, a, b)
    with pytest.raises(InvalidArgumentError, match="input a overlaps the symmetric buffer"):
        ag(x, ag.gathered_input(), rand(64, 8, seed=7))
    view = ag.buffer.view(torch.bfloat16, (16, 8))
    with pytest.raises(InvalidArgumentError, match="output overlaps the symmetric buffer"):
        ag(x, a, b, out=view)
    with pytest.raises(InvalidArgumentError, match="output overlaps the shard"):
        ag(x, rand(8, 24, seed=8), rand(24, 64, seed=9), out=x)
    # Still usable, with exact results.
    y = rand(8, 64, seed=10)
    assert torch.equal(ag(y, a, b), gemm(a, b))
    assert torch.equal(ag.gathered_input(), y)
    ag.destroy()
    with pytest.raises(StateError, match="destroyed"):
        ag(x, a, b)


def test_reduce_scatter_rejections_leave_the_op_usable(comm: Communicator) -> None:
    rs = ReduceScatterBesideGemm(comm, 32, 40, torch.bfloat16)
    x, a, b = rand(16, 40, seed=1), rand(12, 24, seed=2), rand(24, 8, seed=3)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        rs(rand(33, 40, seed=4), a, b)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        rs(rand(16, 24, seed=4), a, b)
    with pytest.raises(InvalidArgumentError, match=r"2-D torch\.bfloat16"):
        rs(x.float(), a, b)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        rs(rand(40, 16, seed=4).t(), a, b)
    with pytest.raises(InvalidArgumentError, match="out_dtype must be"):
        rs(x, a, b, out_dtype=torch.float32)
    with pytest.raises(InvalidArgumentError, match="needs out_scale"):
        rs(x, a, b, out_dtype=E4M3)
    with pytest.raises(InvalidArgumentError, match=r"out must be torch.bfloat16\[16, 40\]"):
        rs(x, a, b, out=torch.empty(8, 40, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match="take none"):  # core: scale for bf16 out
        rs(x, a, b, out_scale=torch.ones(1))
    with pytest.raises(InvalidArgumentError, match="must be >= 0"):
        ReduceScatterBesideGemm(comm, 32, 40, torch.bfloat16, gemm_sm_margin=-1)
    assert (rs.gemm_sm_margin, rs.pieces) == bulk_rs_defaults(1) == (8, 2)
    assert bulk_rs_defaults(2) == (8, 4) and bulk_rs_defaults(4) == bulk_rs_defaults(None) == (8, 2)
    # One source (NOTE [bulk_rs defaults]): the core's BulkRsConfig, which the binding's keyword
    # defaults and the Python op both read (tests/unit/test_defaults.py checks every op).
    assert rs.reduce_max_blocks == bulk_rs_max_blocks() == 64
    d = native().comm_ops.bulk_rs_defaults(0)
    assert (d.reduce_max_blocks, d.gemm_sm_margin, d.pieces) == (64, 8, 2)
    assert native().comm_ops.bulk_rs_defaults(2).pieces == 4
    signature = native().comm_ops.reduce_scatter_beside_gemm.__doc__.splitlines()[0]
    for arg, value in zip(
        ("reduce_max_blocks", "gemm_sm_margin", "pieces"), (64, 8, 2), strict=True
    ):
        assert re.search(rf"\b{arg}: [^=,]+ = {value}\b", signature), (arg, signature)
    for pieces in (0, 5, True):
        with pytest.raises(InvalidArgumentError, match=r"pieces must be 1\.\.4"):
            ReduceScatterBesideGemm(comm, 32, 40, torch.bfloat16, pieces=pieces)
    rs.pieces = 9  # set after construction: the core refuses it before any work
    with pytest.raises(ConfigError, match=r"pieces must be in \[1, 4\], got 9"):
        rs(x, a, b)
    rs.pieces = 1
    with pytest.raises(InvalidArgumentError, match="partial sums"):
        ReduceScatterBesideGemm(comm, 32, 40, E4M3)
    # NOTE [bulk independence]
    with pytest.raises(InvalidArgumentError, match="output overlaps the reduce-scatter's input"):
        rs(x, rand(16, 24, seed=5), rand(24, 40, seed=6), gemm_out=x)
    out = torch.empty(16, 40, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="input a overlaps the reduce-scatter's output"):
        rs(x, out, rand(40, 8, seed=7), out=out)
    with pytest.raises(InvalidArgumentError, match="reduce-scatter's output overlaps the"):
        rs(x, a, b, out=x)
    with pytest.raises(InvalidArgumentError, match="output overlaps the symmetric buffer"):
        rs(x, a, b, gemm_out=rs.buffer.view(torch.bfloat16, (12, 8)))
    # Still usable, with exact results.
    got, y = rs(x, a, b)
    assert torch.equal(got, x) and torch.equal(y, gemm(a, b))
    rs.destroy()
    with pytest.raises(StateError, match="destroyed"):
        rs(x, a, b)


def test_shared_and_given_buffers(comm: Communicator) -> None:
    ag = AllGatherBesideGemm(comm, 32, 64, torch.bfloat16)
    # An RS on the AG's buffer (NOTE [shared op buffers]): fits, runs, leaves the buffer alone.
    rs = ReduceScatterBesideGemm(comm, 32, 64, torch.bfloat16, buffer=ag.buffer)
    x, a, b = rand(32, 64, seed=1), rand(8, 16, seed=2), rand(16, 8, seed=3)
    got, _ = rs(x, a, b)
    assert torch.equal(got, x)
    rs.destroy()
    assert not ag.buffer.destroyed
    with pytest.raises(InvalidArgumentError, match="cannot hold this op"):
        ReduceScatterBesideGemm(comm, 64, 64, torch.bfloat16, buffer=ag.buffer)
    ag.destroy()


def test_native_rejects_unknown_gemm_keys(comm: Communicator) -> None:
    ag = AllGatherBesideGemm(comm, 8, 16, torch.bfloat16)
    a, b = rand(4, 8, seed=1), rand(8, 4, seed=2)
    g = {"a": a, "b": b, "out": torch.empty(4, 4, dtype=torch.bfloat16), "tranb": True}
    with pytest.raises(InvalidArgumentError, match="unknown GEMM argument 'tranb'"):
        native().comm_ops.all_gather_beside_gemm(ag.buffer._core, rand(8, 16, seed=3), g)
    ag.destroy()


def test_config_errors_are_typed() -> None:
    with pytest.raises(ConfigError, match="gemm_sm_margin"):
        from overlap.ub import GemmOverlapConfig

        GemmOverlapConfig(gemm_sm_margin=-2)

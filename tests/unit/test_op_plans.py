"""The overlap ops' plans (NOTE [op plans] in overlap/ops/_operands.py): a call with the
signature of an earlier checked call takes the fast path and gives the checked path's result;
a changed shape, dtype, stride, format, argument (value or type) or keyword is checked again
(the typed error a fresh op raises, or a new plan), bad input still raises before the native
op runs, each call's own FP8 scale_inv reaches the GEMM, and a destroyed buffer is still
refused. AG+GEMM (BF16, FP8, several weights), GEMM+RS and the bulk pair, one rank; the
multi-rank versions are the "plans" scenarios of tests/distributed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import overlap.ops.ag_gemm as ag_module  # noqa: E402
import overlap.ops.bulk as bulk_module  # noqa: E402
import overlap.ops.gemm_rs as rs_module  # noqa: E402
from overlap._native import native  # noqa: E402
from overlap.comm import Communicator  # noqa: E402
from overlap.errors import InvalidArgumentError, OverlapError  # noqa: E402
from overlap.gemm import gemm  # noqa: E402
from overlap.ops import (  # noqa: E402
    AllGatherBesideGemm,
    AllGatherGemm,
    GemmReduceScatter,
    ReduceScatterBesideGemm,
    RsMethod,
)
from overlap.ops._operands import call_key, stream_getter, stream_of  # noqa: E402
from overlap.quantization import (  # noqa: E402
    CurrentScalingConfig,
    QuantizedTensor,
    make_quantizer,
)
from tests.unit.test_buffers import Solo  # noqa: E402


@pytest.fixture
def comm() -> Iterator[Communicator]:
    c = Communicator(Solo(), "host")
    yield c
    c.destroy()


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def counting_native(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Replaces ``module``'s ``native()`` by one whose ``comm_ops.<name>`` counts its calls."""
    real = native().comm_ops
    calls: list[int] = []

    def op(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return getattr(real, name)(*args, **kwargs)

    ops = SimpleNamespace(**{name: op})
    monkeypatch.setattr(module, "native", lambda: SimpleNamespace(comm_ops=ops))
    return calls


def forbid_checks(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    """Makes the checked path fail: a call that still succeeds took the fast path."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the checked path ran")

    monkeypatch.setattr(module, "weight_transposed", refuse)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_ag_gemm_fast_path_matches_the_checked_path(
    comm: Communicator, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    ag = AllGatherGemm(comm, 32, 64, dtype)
    q = make_quantizer(CurrentScalingConfig(), columnwise=False)
    prep = q.quantize if fp8 else (lambda t: t)
    x0, w = prep(rand(8, 64)), prep(rand(16, 64, seed=1))
    first = ag(x0, w).clone()  # checked, plans
    assert ag._plan is not None
    forbid_checks(monkeypatch, ag_module)
    for seed in (0, 2, 3):
        x = prep(rand(8, 64, seed=seed))
        fast = ag(x, w)
        fresh = AllGatherGemm(comm, 32, 64, dtype)  # a new op's first call is checked
        monkeypatch.undo()
        want = fresh(x, w)
        forbid_checks(monkeypatch, ag_module)
        fresh.destroy()
        assert torch.equal(fast, want)
        if seed == 0:
            assert torch.equal(fast, first)
    with pytest.raises(AssertionError, match="checked path"):
        ag(x0, [w, w])  # another signature is checked
    monkeypatch.undo()
    ag.destroy()


def test_ag_gemm_changed_signature_is_checked_again(
    comm: Communicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    ag = AllGatherGemm(comm, 32, 64, torch.bfloat16)
    x, w = rand(8, 64), rand(16, 64, seed=1)
    ag(x, w)
    calls = counting_native(monkeypatch, ag_module, "ag_gemm")
    # Shape, stride, dtype, weight and argument changes: typed errors before the native op.
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(rand(33, 64), w)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        ag(rand(64, 8).t(), w)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        ag(x.float(), w)
    with pytest.raises(InvalidArgumentError, match="must be"):
        ag(x, rand(16, 32))
    with pytest.raises(InvalidArgumentError, match="weight_layout"):
        ag(x, w, weight_layout="kk")
    with pytest.raises(InvalidArgumentError, match="out must be"):
        ag(x, w, out=torch.empty(4, 16, dtype=torch.bfloat16))
    assert calls == []
    # A valid new signature re-plans and gives the plain GEMM's result.
    y = ag(rand(4, 64), w)
    assert calls == [1] and ag._plan.key[0][0][1] == torch.Size([4, 64])
    assert torch.equal(y, gemm(rand(4, 64), w, transb=True))
    # Back to the first signature: a new plan again, the same result.
    assert torch.equal(ag(x, w), gemm(x, w, transb=True))
    ag.destroy()


def test_ag_gemm_plan_does_not_outlive_its_buffer(comm: Communicator) -> None:
    ag = AllGatherGemm(comm, 32, 64, torch.bfloat16)
    x, w = rand(8, 64), rand(16, 64, seed=1)
    ag(x, w)
    ag(x, w)  # the fast path
    ag.destroy()
    with pytest.raises(OverlapError):
        ag(x, w)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_gemm_rs_fast_path_matches_the_checked_path(
    comm: Communicator, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    rs = GemmReduceScatter(comm, 32, 16, torch.bfloat16)
    q = make_quantizer(CurrentScalingConfig(), columnwise=False)
    prep = q.quantize if fp8 else (lambda t: t)
    w = prep(rand(16, 64, seed=1))
    rs(prep(rand(8, 64)), w)
    assert rs._plan is not None
    forbid_checks(monkeypatch, rs_module)
    for seed in (0, 2):
        x = prep(rand(8, 64, seed=seed))
        fast = rs(x, w)
        monkeypatch.undo()
        fresh = GemmReduceScatter(comm, 32, 16, torch.bfloat16)
        want = fresh(x, w)
        fresh.destroy()
        forbid_checks(monkeypatch, rs_module)
        assert torch.equal(fast, want)
    with pytest.raises(AssertionError, match="checked path"):
        rs(prep(rand(4, 64)), w)  # a new shape is checked
    monkeypatch.undo()
    rs.destroy()


def test_gemm_rs_changed_signature_is_checked_again(
    comm: Communicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    rs = GemmReduceScatter(comm, 32, 16, torch.bfloat16)
    x, w = rand(8, 64), rand(16, 64, seed=1)
    rs(x, w)
    calls = counting_native(monkeypatch, rs_module, "gemm_rs")
    with pytest.raises(InvalidArgumentError, match="rows"):
        rs(rand(40, 64), w)
    with pytest.raises(InvalidArgumentError, match="must be"):
        rs(x, rand(8, 64))
    with pytest.raises(InvalidArgumentError, match="out must be"):
        rs(x, w, out=torch.empty(4, 16, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError):
        rs(x, w.float())
    assert calls == []
    assert torch.equal(rs(x, w), gemm(x, w, transb=True))
    assert calls == [1]
    rs.destroy()


# ---- FP8 and several weights (AG+GEMM), the bulk ops --------------------------------------------


def counted(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Counts the calls of ``module.<name>``, a function only the checked path calls."""
    real = getattr(module, name)
    calls: list[int] = []

    def wrapper(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def same_error(planned: Callable[[], object], fresh: Callable[[], object]) -> None:
    """Both raise, the same typed error with the same message."""
    errors = []
    for call in (planned, fresh):
        with pytest.raises(OverlapError) as info:
            call()
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1]), errors


def quantize(t: torch.Tensor, fp8: str = "e4m3") -> QuantizedTensor:
    return make_quantizer(CurrentScalingConfig(fp8=fp8), columnwise=False).quantize(t)


def test_ag_gemm_fp8_fast_path_reads_every_calls_scale_inv(
    comm: Communicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan holds no scale_inv: each call's own (new tensor, new value) reaches the GEMM."""
    ag = AllGatherGemm(comm, 32, 64, torch.float8_e4m3fn)
    w = quantize(rand(16, 64, seed=1))
    ag(quantize(rand(8, 64)), w)
    checked = counted(monkeypatch, ag_module, "weight_transposed")
    for seed, scale in ((2, 1.0), (3, 300.0), (4, 0.01)):
        x = quantize(rand(8, 64, seed=seed) * scale)
        fast = ag(x, w)
        fresh = AllGatherGemm(comm, 32, 64, torch.float8_e4m3fn)
        want = fresh(x, w)
        fresh.destroy()
        assert torch.equal(fast, want)
        assert torch.equal(fast, gemm(x.rowwise_data, w.rowwise_data, transb=True,
                                      a_scale_inv=x.rowwise_scale_inv,
                                      b_scale_inv=w.rowwise_scale_inv))  # fmt: skip
    assert checked == [1, 1, 1]  # the fresh ops' first calls only
    # The same scale_inv tensor with a new value, read by the fast path too.
    x = quantize(rand(8, 64, seed=5))
    before = ag(x, w).clone()
    x.rowwise_scale_inv.mul_(2.0)
    assert torch.equal(ag(x, w), before * 2.0) and checked == [1, 1, 1]
    ag.destroy()


def test_ag_gemm_fp8_changes_are_checked(
    comm: Communicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    ag = AllGatherGemm(comm, 32, 64, torch.float8_e4m3fn)
    x, w = quantize(rand(8, 64)), quantize(rand(16, 64, seed=1))
    ag(x, w)
    checked = counted(monkeypatch, ag_module, "weight_transposed")
    fresh = AllGatherGemm(comm, 32, 64, torch.float8_e4m3fn)
    # Typed errors of the checked path, as a fresh op raises them.
    for bad in (
        lambda op: op(x.rowwise_data, w),  # a bare FP8 tensor
        lambda op: op(quantize(rand(40, 64)), w),  # more rows than max_tokens
        lambda op: op(quantize(rand(8, 48)), w),  # another K
        lambda op: op(x, quantize(rand(16, 48, seed=1))),  # the weight's K
        lambda op: op(x, rand(16, 64)),  # a high-precision weight
        lambda op: op(x, w, weight_layout="kk"),
        lambda op: op(x, w, out=torch.empty(16, 16, dtype=torch.float16)),
    ):
        same_error(lambda bad=bad: bad(ag), lambda bad=bad: bad(fresh))
    assert len(checked) == 14
    # Another encoding, uint8 data, another argument (of another type): checked, then the
    # fast path, both equal to a fresh op's result.
    del checked[:]
    for call in (
        lambda op: op(quantize(rand(8, 64), "e5m2"), w),
        lambda op: op(raw_bytes(x), w),
        lambda op: op(x, w, alpha=2),  # an int: not the float 2.0 of a plan
        lambda op: op(x, w, alpha=2.0),
        lambda op: op(x, w, out_dtype=torch.float32),
    ):
        first, again = call(ag).clone(), call(ag)
        assert torch.equal(first, again) and torch.equal(again, call(fresh))
    assert len(checked) == 2 * 5  # the first call of each op on each new key
    fresh.destroy()
    ag.destroy()


def raw_bytes(q: QuantizedTensor) -> QuantizedTensor:
    """``q`` with its rowwise data as uint8 bytes (the data is viewed back to its encoding)."""
    return QuantizedTensor(
        shape=q.shape,
        dtype=q.dtype,
        rowwise_format=q.rowwise_format,
        columnwise_format=q.columnwise_format,
        rowwise_data=q.rowwise_data.view(torch.uint8),
        rowwise_scale_inv=q.rowwise_scale_inv,
    )


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_ag_gemm_several_weights_fast_path(
    comm: Communicator, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    prep = quantize if fp8 else (lambda t: t)
    ag = AllGatherGemm(comm, 32, 64, dtype)
    ws = [prep(rand(n, 64, seed=n)) for n in (16, 32, 48)]
    ag(prep(rand(8, 64)), ws)
    checked = counted(monkeypatch, ag_module, "weight_transposed")
    fresh = AllGatherGemm(comm, 32, 64, dtype)
    for seed in (2, 3):
        x = prep(rand(8, 64, seed=seed))
        outs = [torch.full((8, n), float("nan"), dtype=torch.bfloat16) for n in (16, 32, 48)]
        fast = ag(x, ws, out=[outs[0], None, outs[2]])
        assert len(checked) == seed - 1  # a new out signature: checked once, then planned
        fast_again = ag(x, tuple(ws), out=[outs[0], None, outs[2]])
        assert len(checked) == seed - 1 and fast[0] is outs[0] and fast[2] is outs[2]
        want = fresh(x, ws)
        for got, again, ref in zip(fast, fast_again, want, strict=True):
            assert torch.equal(got, ref) and torch.equal(again, ref)
    del checked[:]
    # One weight changes: checked, the same typed error as a fresh op's (naming the weight).
    bad = [*ws[:1], prep(rand(32, 48, seed=5)), ws[2]]
    x = prep(rand(8, 64))
    same_error(lambda: ag(x, bad), lambda: fresh(x, bad))
    same_error(lambda: ag(x, ws, bias=[None, None]), lambda: fresh(x, ws, bias=[None, None]))
    mixed = [*ws[:2], rand(48, 64, seed=6).float()]
    same_error(lambda: ag(x, mixed), lambda: fresh(x, mixed))
    assert len(checked) == 4  # the _per_weight error is raised before either path
    fresh.destroy()
    ag.destroy()


def bulk_checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return counted(monkeypatch, bulk_module, "plan_side_gemm")


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_bulk_all_gather_fast_path(
    comm: Communicator, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    prep = quantize if fp8 else (lambda t: t)
    ag = AllGatherBesideGemm(comm, 32, 64, dtype)
    a, b = prep(rand(24, 48, seed=1)), prep(rand(40, 48, seed=2))
    ag(prep(rand(8, 64)), a, b, transb=True)
    checked = bulk_checked(monkeypatch)
    fresh = AllGatherBesideGemm(comm, 32, 64, dtype)
    for seed in (3, 4):
        x = prep(rand(8, 64, seed=seed))
        a = prep(rand(24, 48, seed=seed + 10))  # new tensors (and scale_invs) every call
        y = ag(x, a, b, transb=True)
        assert len(checked) == seed - 3  # the fresh op's first call only
        gathered = ag.gathered_input().rowwise_data if fp8 else ag.gathered_input()
        gathered = gathered.clone()
        want = fresh(x, a, b, transb=True)
        want_gathered = fresh.gathered_input().rowwise_data if fp8 else fresh.gathered_input()
        assert torch.equal(y, want) and torch.equal(gathered.view(torch.uint8),
                                                    want_gathered.view(torch.uint8))  # fmt: skip
    del checked[:]
    x = prep(rand(8, 64))
    # Changes of an operand, a keyword's value, type or presence: checked, as a fresh op.
    for bad in (
        lambda op: op(prep(rand(8, 48)), a, b, transb=True),
        lambda op: op(x, a, prep(rand(40, 32, seed=2)), transb=True),
        lambda op: op(x, a, b),  # transb dropped: inner dimensions
        lambda op: op(x, a, b, transb=True, beta=1.0),  # beta without out
        lambda op: op(x, a, b, transb=True, out=torch.empty(24, 41, dtype=torch.bfloat16)),
        lambda op: op(x, a, b, transb=True, a_scale_inv=torch.ones(1)),
    ):
        same_error(lambda bad=bad: bad(ag), lambda bad=bad: bad(fresh))
    for good in (
        lambda op: op(x, a, b, transb=1),  # an int: not the plan's bool
        lambda op: op(x, a, b, alpha=0.5, transb=True),  # keywords in another order
        lambda op: op(x, a, b, transb=True, alpha=0.5),
        lambda op: op(x, a, b, transb=True, out_dtype=torch.float32),
        lambda op: op(x, a, b, transb=True, bias=rand(40, seed=7)),
    ):
        assert torch.equal(good(ag), good(fresh))
    assert len(checked) == 2 * 5 + 2 * 5  # x_shard's own check comes before the GEMM's
    fresh.destroy()
    ag.destroy()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_bulk_reduce_scatter_fast_path(
    comm: Communicator, fp8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    prep = quantize if fp8 else (lambda t: t)
    rs = ReduceScatterBesideGemm(comm, 32, 64, torch.bfloat16)
    a, b = prep(rand(24, 48, seed=1)), prep(rand(40, 48, seed=2))
    rs(rand(16, 64), a, b, transb=True)
    checked = bulk_checked(monkeypatch)
    fresh = ReduceScatterBesideGemm(comm, 32, 64, torch.bfloat16)
    for seed in (3, 4):
        x, b = rand(16, 64, seed=seed), prep(rand(40, 48, seed=seed + 10))
        out, y = rs(x, a, b, transb=True)
        assert len(checked) == seed - 3  # the fresh op's first call only
        want, want_y = fresh(x, a, b, transb=True)
        assert torch.equal(out, want) and torch.equal(y, want_y)
    rs.pieces = 2  # the op's tuning is read by every call: same result
    assert all(map(torch.equal, rs(x, a, b, transb=True), fresh(x, a, b, transb=True)))
    assert len(checked) == 1
    del checked[:]
    scale = torch.tensor([4.0])
    for bad in (
        lambda op: op(rand(40, 64), a, b, transb=True),  # more rows than max_tokens
        lambda op: op(x.float(), a, b, transb=True),
        lambda op: op(x, a, b, transb=True, out_dtype=torch.float8_e4m3fn),  # no out_scale
        lambda op: op(x, a, b, transb=True, out=torch.empty(8, 64, dtype=torch.bfloat16)),
        lambda op: op(x, a, b, transb=True, gemm_out=torch.empty(4, 4, dtype=torch.bfloat16)),
    ):
        same_error(lambda bad=bad: bad(rs), lambda bad=bad: bad(fresh))
    assert len(checked) == 2  # the out checks come first; the GEMM's out: the side plan
    del checked[:]
    for good in (
        lambda op: op(x, a, b, transb=True, out_dtype=torch.float8_e4m3fn, out_scale=scale),
        lambda op: op(x, a, b, transb=True, gemm_out_dtype=torch.float32),
        lambda op: op(x, a, b, transb=True, out=torch.empty(16, 64, dtype=torch.bfloat16)),
    ):
        for _ in range(2):  # checked, then fast: equal to a fresh op's (checked) result
            assert all(map(torch.equal, good(rs), good(fresh)))
    assert len(checked) == 2 * 3  # the first call of each op on each new key
    fresh.destroy()
    rs.destroy()


def test_plan_keys_refuse_other_argument_types(comm: Communicator) -> None:
    """Equal values of other types (1 and 1.0 and True) make other keys; a tensor or an
    array argument makes none (NOTE [op plans])."""
    x, w = rand(8, 64), rand(16, 64, seed=1)
    keys = {call_key((x, w), (v,)) for v in (1, 1.0, True)}
    assert len(keys) == 3
    assert call_key((x, w), (torch.tensor(1.0),)) is None
    assert call_key((x, 3), ()) is None and call_key((x, None), ()) is not None
    assert call_key((x, w), ("nk", torch.bfloat16, None, RsMethod.RING)) is not None


def test_stream_getter_is_stream_of() -> None:
    assert stream_getter(torch.device("cpu"))() == stream_of(torch.device("cpu")) == 0
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        side = torch.cuda.Stream(device)
        for stream in (torch.cuda.current_stream(device), side):
            with torch.cuda.stream(stream):
                assert stream_getter(device)() == stream_of(device) == stream.cuda_stream

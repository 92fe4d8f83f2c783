"""The overlap ops' plans (NOTE [op plans] in overlap/ops/_operands.py): a call with the
signature of an earlier checked call takes the fast path and gives the checked path's result;
a changed shape, dtype, stride or argument is checked again (typed error or a new plan), bad
input still raises before the native op runs, and a destroyed buffer is still refused."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import overlap.ops.ag_gemm as ag_module  # noqa: E402
import overlap.ops.gemm_rs as rs_module  # noqa: E402
from overlap._native import native  # noqa: E402
from overlap.comm import Communicator  # noqa: E402
from overlap.errors import InvalidArgumentError, OverlapError  # noqa: E402
from overlap.gemm import gemm  # noqa: E402
from overlap.ops import AllGatherGemm, GemmReduceScatter  # noqa: E402
from overlap.quantization import CurrentScalingConfig, make_quantizer  # noqa: E402
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

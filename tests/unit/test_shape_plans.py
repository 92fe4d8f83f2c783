"""Plans by shape (NOTE [shape plans] in overlap/ub/plans.py): the decision, its inputs and
its record, on CPU with stand-in paths. The layers' use of them under mpirun:
tests/distributed/test_layers.py (scenario "plans")."""

from __future__ import annotations

import time

import pytest

from overlap.errors import ConfigError
from overlap.ub import PlanPolicy, ShapeKey, ShapePlans
from overlap.ub.plans import OP, SEQUENTIAL, UNTIMED_CALLS

KEY = ShapeKey("fc1_fprop", 8192, 8192, 7168, False)


class _Path:
    """One path of a call: counts its calls, each taking ``ms``."""

    def __init__(self, ms: float) -> None:
        self.ms, self.calls = ms, 0

    def __call__(self) -> None:
        self.calls += 1
        time.sleep(self.ms / 1e3)


def _same(values: list[float]) -> list[float]:
    return values


def _paths(op: _Path, seq: _Path, **alternates: _Path) -> dict[str, _Path]:
    """The op first, its alternates, sequential last (ShapePlans.choose's order)."""
    return {OP: op, **alternates, SEQUENTIAL: seq}


def test_the_default_policy_is_measured_on_gpus_and_always_on_the_host_transport() -> None:
    assert PlanPolicy.default_for("cuda") is PlanPolicy.MEASURED
    assert PlanPolicy.default_for("host") is PlanPolicy.ALWAYS


def test_always_runs_the_op_without_timing_anything() -> None:
    plans = ShapePlans()
    op, seq = _Path(0), _Path(0)
    assert plans.policy is PlanPolicy.ALWAYS
    assert plans.choose(KEY, _paths(op, seq), _same, cuda=False) == OP
    assert (op.calls, seq.calls) == (0, 0)
    assert "policy always" in plans.plans()[0].reason


@pytest.mark.parametrize(("op_ms", "seq_ms", "overlap"), [(1, 8, True), (8, 1, False)])
def test_measured_keeps_the_faster_path_and_times_each_shape_once(op_ms, seq_ms, overlap):
    plans = ShapePlans("measured", timed_calls=3)
    op, seq = _Path(op_ms), _Path(seq_ms)
    path = OP if overlap else SEQUENTIAL
    assert plans.choose(KEY, _paths(op, seq), _same, cuda=False) == path
    n = UNTIMED_CALLS + 3  # the untimed calls and three timed, each path
    assert (op.calls, seq.calls) == (n, n)
    assert plans.choose(KEY, _paths(op, seq), _same, cuda=False) == path  # a lookup now
    assert (op.calls, seq.calls) == (n, n) and plans.planned(KEY) == path
    (plan,) = plans.plans()
    assert plan.overlap is overlap and plan.path == path
    assert plan.op_ms is not None and plan.sequential_ms is not None
    assert (plan.op_ms < plan.sequential_ms) is overlap
    assert "measured" in plan.reason and plan.key == KEY
    other = ShapeKey("fc1_fprop", 4096, 8192, 7168, False)  # another M: timed again
    assert plans.planned(other) is None
    plans.choose(other, _paths(op, seq), _same, cuda=False)
    assert op.calls == 2 * n and len(plans) == 2


def test_measured_runs_the_fastest_alternate_setting() -> None:
    """NOTE [plan alternates]: an alternate setting of the op that beats the op as configured
    and the sequential path is what the shape runs; every path is timed once."""
    plans = ShapePlans("measured", timed_calls=1)
    op, seq, lanes1, ring = _Path(6), _Path(8), _Path(1), _Path(4)
    paths = _paths(op, seq, **{"ring_ag lanes=1": lanes1, "ring_rs lanes=1": ring})
    assert plans.choose(KEY, paths, _same, cuda=False) == "ring_ag lanes=1"
    (plan,) = plans.plans()
    assert plan.overlap and list(plan.times_ms) == list(paths)
    assert all(p.calls == UNTIMED_CALLS + 1 for p in paths.values())
    assert "ring_ag lanes=1" in plans.describe()[1]


def test_a_plan_needs_the_op_and_the_sequential_path() -> None:
    plans = ShapePlans("measured", timed_calls=1)
    with pytest.raises(ValueError, match="sequential"):
        plans.choose(KEY, {OP: _Path(0)}, _same, cuda=False)
    with pytest.raises(ValueError, match="op"):
        plans.choose(KEY, {SEQUENTIAL: _Path(0)}, _same, cuda=False)
    assert len(plans) == 0


def test_the_decision_uses_the_group_maximum_not_this_ranks_times() -> None:
    """Locally the op is faster; another rank found it slower: the maximum over the group
    decides, so every rank takes the same path."""
    plans = ShapePlans("measured", timed_calls=1)
    seen = []

    def group_max(values: list[float]) -> list[float]:
        seen.append(values)
        if len(values) == 1:  # the barrier before each path is timed
            return values
        return [values[0] + 50.0, values[1]]  # a slower rank's op time

    assert plans.choose(KEY, _paths(_Path(0), _Path(2)), group_max, cuda=False) == SEQUENTIAL
    assert [len(v) for v in seen] == [1, 1, 2]  # aligned before each path, then the times
    assert seen[2][0] < seen[2][1]
    assert plans.plans()[0].op_ms == pytest.approx(seen[2][0] + 50.0)


def test_a_tie_goes_to_the_earlier_path() -> None:
    plans = ShapePlans("measured", timed_calls=1)
    tie = lambda v: [1.0] * len(v)  # noqa: E731
    assert plans.choose(KEY, _paths(_Path(0), _Path(0)), tie, cuda=False) == OP
    other = ShapeKey("proj_fprop", 8192, 8192, 8192, False)
    paths = {OP: _Path(0), "b": _Path(0), "a": _Path(0), SEQUENTIAL: _Path(0)}
    two = lambda v: [1.0] * len(v) if len(v) == 1 else [2.0, 1.0, 1.0, 1.0]  # noqa: E731
    assert plans.choose(other, paths, two, cuda=False) == "b"


def test_describe_lists_every_shape_with_its_reason() -> None:
    plans = ShapePlans("measured", timed_calls=1)
    plans.choose(KEY, _paths(_Path(0), _Path(0)), lambda v: [2.0, 1.0][: len(v)], cuda=False)
    lines = plans.describe()
    assert lines[0] == "shape plans (policy measured): 1 shapes"
    assert "fc1_fprop M=8192 K=8192 N=7168 high precision: sequential" in lines[1]
    assert "op 2.000 ms, sequential 1.000 ms" in lines[1]


@pytest.mark.parametrize("bad", ["auto", 3, None])
def test_an_unknown_policy_is_a_config_error(bad) -> None:
    with pytest.raises(ConfigError, match="shape_plans"):
        ShapePlans(bad)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_timed_calls_must_be_a_positive_int(bad) -> None:
    with pytest.raises(ConfigError, match="timed_calls"):
        ShapePlans("measured", timed_calls=bad)


def test_initialize_ub_refuses_an_unknown_policy_before_anything_collective() -> None:
    from overlap import initialize_ub

    with pytest.raises(ConfigError, match="shape_plans"):
        initialize_ub((64, 32), object(), shape_plans="sometimes", register=False)


def test_the_device_barrier_is_only_queued_on_gpus() -> None:
    """``barrier`` (a device-side collective queued behind the spin, NOTE [shape plans]) is a
    CUDA device's: on the host the wall clock times the calls and nothing is queued."""
    queued = []
    plans = ShapePlans("measured", timed_calls=3)
    plans.choose(
        KEY, _paths(_Path(0), _Path(0)), _same, cuda=False, barrier=lambda: queued.append(1)
    )
    assert queued == []

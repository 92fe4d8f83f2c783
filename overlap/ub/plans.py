"""Plans by shape: which setting of its overlap op, or the sequential path, a GEMM of a given
shape runs.

NOTE [shape plans]: overlap does not win on every shape. Where the GEMM dwarfs the collective
(an MLP's fc1 at large token counts: T_comm / T_gemm ~ 0.14 at TP 4), the chunked GEMMs and
the copies beside them cost about what the collective would, and the overlap op ties with an
all-gather (or reduce-scatter) followed by one GEMM; on other shapes it loses (small GEMMs,
where its fixed costs exceed the collective it hides). Which side wins depends on the shape,
the dtype, the TP size and the machine, so it is measured, not guessed: under
:attr:`PlanPolicy.MEASURED` the first call of each ``(GEMM name, M, K, N, FP8)`` times the op,
its alternate settings (another lane count, the other GEMM+RS method: NOTE [plan alternates]
in ``overlap/ub/config.py``) and the layer's sequential path (NCCL collective + cuBLASLt GEMM)
on every rank, takes the maximum over the TP group of each, and from then on runs whichever
was fastest (ties go to the earlier path: the op as configured first, sequential last).
Every rank reaches the same decision because every rank compares the same all-reduced
numbers; a shape first met while a CUDA graph is being captured cannot be timed (no
synchronisation in a capture), so it runs the op and says so. :attr:`PlanPolicy.ALWAYS` runs
the op on every call, as before this note. ``initialize_ub``'s default is MEASURED on GPUs and
ALWAYS on the host transport (:meth:`PlanPolicy.default_for`). Each decision is logged once and
listed by :meth:`ShapePlans.describe` (and ``Userbuffers.describe()``) with its times: overlap
never silently does not happen.

How a path is timed matters more than it seems. The first version timed each path right after
one untimed call, with no alignment of the ranks: on 4 GPUs every shape of a TransformerLayer
then measured the op 1.2-6x slower than the sequential path (qkv 14.0 ms against 2.3 for a GEMM
of about 0.1 ms), because a collective op waits for its latest peer, and the op, timed first,
absorbed the ranks' skew (performance log [shape plans]). So each path now runs
:data:`UNTIMED_CALLS` untimed calls (GEMM tuning, collective set-up), the ranks meet in an
all-reduce, and the timed calls queue behind a GPU spin and a device-side barrier (a
one-element all-reduce queued on the stream behind the spin, so that every GPU starts the timed
calls when the last one gets there), each call timed on its own and the median kept: the figure
is the paths' GPU time, what a graphed step or any GPU-bound step pays. (With the host-side
alignment alone, each rank's spin started when its host got there, and the earliest rank's
first timed call absorbed the skew: in the broad suite's first GPU run of the planned column,
4xH200 TP 4, the plan timed sequential paths up to 2.4x the benchmark's T_seq of the same call,
0.275 against 0.114 ms, and 11 of 224 rows ran the op where it was slower than sequential; with
the barrier, the next run's ratio was 1.006 in the median and 1.18 at most, and 6 rows ran the
op where it was slower, by at most 1.115x; performance log [broad suite] planned column.) A
host-bound eager step pays the host's time instead, which the plan does not see (graphs remove
it, NOTE [graphed layers]). Verdict: a measured plan should never run slower than the
sequential path by more than the timing noise of its first call. Measured on 4xH100
(performance log [shape plans], second run): the timed figures now match the GEMMs' own times
(a 4096 x 4096 x 1536 FP8 qkv GEMM: op 0.107 ms against 0.119 sequential), every shape of a
Llama-3-70B layer at T = 8192 keeps the op, and the small Llama-3-8B shapes at T = 4096 drop to
the sequential path where it is faster (fc1 FP8: 0.303 ms op, 0.252 sequential). So MEASURED
became the default on GPUs: a plan that can lose to the sequential path is no longer what a
user gets without asking.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

from overlap._logging import logger
from overlap.errors import ConfigError

__all__ = ["OP", "SEQUENTIAL", "PlanPolicy", "ShapeKey", "ShapePlan", "ShapePlans"]


class PlanPolicy(enum.Enum):
    """How a :class:`~overlap.ub.Userbuffers` handle decides, per shape, between a GEMM's
    overlap op and the sequential path (NOTE [shape plans])."""

    ALWAYS = "always"  #: every call of an overlapped GEMM runs its op
    MEASURED = "measured"  #: the first call of a shape times both; the faster runs from then on

    @classmethod
    def default_for(cls, transport: str) -> PlanPolicy:
        """The default of :func:`~overlap.ub.initialize_ub`: MEASURED on GPUs (``"cuda"``),
        ALWAYS on the host transport, which exists to run the protocol on CPUs (its timings
        say nothing about a GPU, and its tests must run every op)."""
        return cls.MEASURED if transport == "cuda" else cls.ALWAYS

    @classmethod
    def of(cls, value: PlanPolicy | str) -> PlanPolicy:
        """``value`` as a policy: a PlanPolicy or its name (``"always"``, ``"measured"``).

        Raises:
            ConfigError: anything else.
        """
        if isinstance(value, PlanPolicy):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(
                f"shape_plans: {value!r} is not one of {[p.value for p in cls]}"
            ) from None


@dataclasses.dataclass(frozen=True)
class ShapeKey:
    """One GEMM call's shape: ``[M, K] x [K, N]`` of GEMM name ``name`` (``M`` the gathered
    tokens of an AG+GEMM, the tokens before the reduce-scatter of a GEMM+RS; ``N`` this rank's
    share of the weight's rows), FP8 inputs or not."""

    name: str
    m: int
    k: int
    n: int
    fp8: bool

    def label(self) -> str:
        inputs = "fp8" if self.fp8 else "high precision"
        return f"{self.name} M={self.m} K={self.k} N={self.n} {inputs}"


#: The label of a GEMM's overlap op as configured, among a plan's paths.
OP = "op"
#: The label of the sequential path (NCCL collective + cuBLASLt GEMM) among a plan's paths.
SEQUENTIAL = "sequential"


@dataclasses.dataclass(frozen=True)
class ShapePlan:
    """What the calls of one shape run, and why.

    Attributes:
        key: the shape.
        path: the label of the path they run: :data:`OP` (the op as configured), an
            alternate setting of it (``Userbuffers.alternates``, e.g. ``"pipeline_rs
            lanes=1"``) or :data:`SEQUENTIAL`.
        reason: one line saying why (the policy, or the measured times).
        times_ms: each timed path's time (ms per call, median of the timed calls, max over
            ranks), by label, in the order they were timed; empty when nothing was timed.
    """

    key: ShapeKey
    path: str
    reason: str
    times_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def overlap(self) -> bool:
        """Whether the calls run an overlap op (the configured one or an alternate)."""
        return self.path != SEQUENTIAL

    @property
    def op_ms(self) -> float | None:
        """The configured op's measured time (None: not timed)."""
        return self.times_ms.get(OP)

    @property
    def sequential_ms(self) -> float | None:
        """The sequential path's measured time (None: not timed)."""
        return self.times_ms.get(SEQUENTIAL)


class ShapePlans:
    """The plans of one handle's GEMM calls by shape (NOTE [shape plans]).

    Args:
        policy: :class:`PlanPolicy` (or its name).
        timed_calls: calls of each path timed at a shape's first call (after
            :data:`UNTIMED_CALLS` untimed ones, which tune its GEMMs); >= 1.

    Raises:
        ConfigError: an unknown policy or ``timed_calls`` < 1.
    """

    def __init__(self, policy: PlanPolicy | str = PlanPolicy.ALWAYS, timed_calls: int = 5):
        self.policy = PlanPolicy.of(policy)
        if not isinstance(timed_calls, int) or isinstance(timed_calls, bool) or timed_calls < 1:
            raise ConfigError(f"shape_plans: timed_calls must be an int >= 1, got {timed_calls!r}")
        self.timed_calls = timed_calls
        self._plans: dict[ShapeKey, ShapePlan] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def plans(self) -> list[ShapePlan]:
        """Every plan made so far, in the order their shapes were first met."""
        return list(self._plans.values())

    def planned(self, key: ShapeKey) -> str | None:
        """The label of the path shape ``key`` runs, or None before its first call (one dict
        lookup: what every later call of the shape costs)."""
        plan = self._plans.get(key)
        return None if plan is None else plan.path

    def choose(
        self,
        key: ShapeKey,
        paths: Mapping[str, Callable[[], Any]],
        reduce_max: Callable[[list[float]], list[float]],
        *,
        cuda: bool,
        barrier: Callable[[], Any] | None = None,
    ) -> str:
        """The label of the path that the call of shape ``key`` runs.

        The first call of a shape under ``MEASURED`` runs every path ``UNTIMED_CALLS +
        timed_calls`` times (COLLECTIVE over the TP group: every rank must meet the same
        shapes, with the same paths, in the same order, as it must call the same ops) and
        keeps the fastest (a tie goes to the earlier path); later calls are one dict lookup.
        Under ``ALWAYS``, and for a shape first met inside a CUDA graph capture, the plan is
        :data:`OP` and nothing runs.

        Args:
            key: the call's shape.
            paths: one call of each path by label (results dropped): :data:`OP` first, then
                any alternate settings of the op, then :data:`SEQUENTIAL`.
            reduce_max: the element-wise maximum of a list of floats over the TP group (also
                the barrier that aligns the ranks before each path is timed).
            cuda: the paths run on the current CUDA stream (timed by CUDA events; a capture in
                progress is detected); else they are timed by the host clock.
            barrier: on cuda, enqueues a collective over the TP group on the current stream
                without waiting for it (a device-side barrier): the timed calls queue behind
                it, so every rank's GPU starts them together (NOTE [shape plans]); None: the
                ranks are aligned on the host only.

        Raises:
            ValueError: ``paths`` lacks :data:`OP` or :data:`SEQUENTIAL`.
        """
        plan = self._plans.get(key)
        if plan is not None:
            return plan.path
        if OP not in paths or SEQUENTIAL not in paths:
            raise ValueError(f"shape plans: the paths must include {OP!r} and {SEQUENTIAL!r}")
        if self.policy is PlanPolicy.ALWAYS:
            plan = ShapePlan(key, OP, "policy always: the overlap op on every shape")
        elif cuda and _capturing():
            plan = ShapePlan(
                key, OP,
                "first met inside a CUDA graph capture, where nothing can be timed: the op "
                "(run the shape once eagerly before capturing to measure it)",
            )  # fmt: skip
        else:

            def align() -> None:
                reduce_max([0.0])

            labels = list(paths)
            local = [
                _median_ms(paths[label], self.timed_calls, cuda, align, barrier) for label in labels
            ]
            times = dict(zip(labels, reduce_max(local), strict=True))
            best = min(labels, key=lambda label: (times[label], labels.index(label)))
            listed = ", ".join(f"{label} {ms:.3f} ms" for label, ms in times.items())
            plan = ShapePlan(
                key, best,
                f"measured: {listed} (GPU time, median of {self.timed_calls} back to back, "
                f"max over the TP group): {best}",
                times,
            )  # fmt: skip
        self._plans[key] = plan
        logger.info("shape plan %s: %s (%s)", key.label(), plan.path, plan.reason)
        return plan.path

    def describe(self) -> list[str]:
        """One line per shape met so far: what it runs and why."""
        head = f"shape plans (policy {self.policy.value}): {len(self._plans)} shapes"
        return [head] + [f"  {p.key.label()}: {p.path} ({p.reason})" for p in self._plans.values()]


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


#: Untimed calls of each path before it is timed: the first tunes its GEMMs
#: (NOTE [gemm autotune]) and sets up its collective; the second runs as every later one.
UNTIMED_CALLS = 2
#: The GPU spin queued ahead of the timed calls, so that they are all enqueued before the first
#: runs and their GPU time is measured, not the host's (about 2 ms on H100/H200 clocks: longer
#: than issuing a few calls of any op).
SPIN_CYCLES = 4_000_000


def _median_ms(
    fn: Callable[[], Any],
    calls: int,
    cuda: bool,
    align: Callable[[], Any],
    barrier: Callable[[], Any] | None,
) -> float:
    """Median ms of ``calls`` calls of ``fn`` issued back to back, after
    :data:`UNTIMED_CALLS` untimed ones, with every rank of the group aligned first (``align``,
    a collective): a collective op waits for its slowest peer, so a rank that arrived late
    (still tuning, or busy with Python) would otherwise count its lateness as the op's time.
    On a GPU the calls queue behind a spin and then ``barrier`` (a device-side collective),
    so the figure is their GPU time (what a graphed step, or any GPU-bound one, pays) with
    every GPU starting them together; on the host, the wall clock. Each call is timed on its
    own and the median kept: one call that absorbs what is left of the ranks' skew does not
    move it."""
    import statistics

    import torch

    for _ in range(UNTIMED_CALLS):
        fn()
    if cuda:
        torch.cuda.synchronize()
    align()
    if not cuda:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()  # the alignment's own collective has finished on this GPU
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    torch.cuda._sleep(SPIN_CYCLES)
    if barrier is not None:
        barrier()
    events[0].record()
    for i in range(calls):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(float(a.elapsed_time(b)) for a, b in itertools.pairwise(events))

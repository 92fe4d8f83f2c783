"""What the benchmarks share (the docs/design.md §6 protocol), for every benchmark module of
``benchmarks/`` (the overlap ops today; whole layers next):

* launching: :func:`add_launch_arg` / :func:`launch_workers` (``--launch N`` reruns the module
  on N ranks under mpirun), :func:`mpirun_module` (what ``benchmarks.run`` starts);
* timing: :func:`time_op` (one call, median of the timed iterations), :func:`time_in_passes`
  (several calls in alternating passes), :func:`add_timing_args` / :func:`check_timing_args`
  (``--iters``, ``--warmup``, ``--timing``, ``--heat-ms``, ``--passes``) and
  :class:`RankTimer` (those settings, the maximum over ranks, the JSON's ``timing``);
* collectives of the harness: :func:`max_over_ranks`, :func:`first_error`;
* reporting: :class:`Progress` lines, :func:`environment` (the JSON's machine fields),
  :func:`format_table`, :func:`write_outputs` (JSON and table), :func:`plot_times` (PNG) and
  :func:`print_paths`.

Times are medians of >= 20 timed iterations after warm-up, measured with CUDA events on GPUs
(wall clock on the host transport), then the maximum over ranks.

One file: every benchmark module takes its launching, timing and reporting from here, so the
docs/design.md §6 protocol stays in one place (the parts share the rank collectives).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.plot import plot_times  # noqa: F401 (re-exported: one import point)
from overlap.launch import mpirun_command

REPO = Path(__file__).resolve().parents[1]
TIMING_MODES = ("e2e", "gpu", "sustained")

# GPU clock cycles per millisecond of the spin queued by time_op(queued=True) (H100/H200 SM
# clocks are about 2 GHz; at lower clocks the spin only lasts longer).
_SPIN_CYCLES_PER_MS = 2_000_000
# At most this many heating calls per timed call (NOTE [sustained timing]): bounds the host's
# enqueueing (and the spin ahead of it) for calls of a few microseconds.
_MAX_HEAT_CALLS = 10_000


def spin_gpu(ms: float) -> None:
    """Queue a GPU spin of about ``ms`` milliseconds (at least; longer at lower clocks) on the
    current stream, so that the host can enqueue work behind it without the GPU waiting."""
    import torch

    torch.cuda._sleep(int(ms * _SPIN_CYCLES_PER_MS))


def time_in_passes(
    calls: dict[str, Callable[[], object]],
    timer: Callable[[Callable[[], object]], float],
    passes: int,
    samples: dict[str, list[float]] | None = None,
) -> dict[str, float]:
    """``timer(call)`` of every call, the median over ``passes`` passes (NOTE [timing passes]);
    each pass's times in ``samples`` (by call name), when given.

    NOTE [timing passes]: what a benchmark compares (an overlap row's T_gemm, T_comm, T_seq,
    every variant and torch's op; ours and torch's GEMM) is timed one after another, and an
    H200 running GEMMs back to back slows down by up to ~15% within seconds (power and
    temperature; benchmarks/gemm.py measured it), which would charge the drift to whatever is
    timed last. So every call is timed once per pass, odd passes in reverse order (A B, B A,
    ...): with two passes, a drift that is linear in time falls on every call alike.
    """
    names = list(calls)
    samples = {} if samples is None else samples
    samples.update({name: [] for name in names})
    for p in range(passes):
        for name in names if p % 2 == 0 else names[::-1]:
            samples[name].append(timer(calls[name]))
    return {name: statistics.median(samples[name]) for name in names}


def time_op(
    fn: Callable[[], object],
    *,
    cuda: bool,
    warmup: int = 5,
    iters: int = 20,
    queued: bool = False,
    align: Callable[[], object] | None = None,
    host_ms: list[float] | None = None,
    heat_ms: float = 0.0,
    agree: Callable[[int], int] | None = None,
) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after ``warmup`` runs.

    With ``cuda``, CUDA events around each call; the GPU is idle when the start event is
    recorded, so the time includes the host's work to enqueue ``fn`` (Python, argument checks,
    launch calls) wherever that is longer than the GPU's own start. With ``queued`` as well,
    the ``iters`` calls run back to back behind one GPU spin (``torch.cuda._sleep``) that
    lasts longer than the host needs to enqueue them all (1.5 x the median warm-up call's
    host time per call, plus 1 ms), with an event between consecutive calls: each sample is
    then the GPU's time for one call (its kernels and the gaps between them) without the
    host's enqueueing, as in a training step whose host runs ahead of its GPU. ``align``
    (with ``queued``; e.g. :func:`device_barrier`) is enqueued ahead of the spin: a
    device-side barrier across the ranks, so that every rank's spin ends at about the same
    time. The first call after the spin may pay for links that went idle during it; the
    median of the samples leaves it out. ``host_ms`` (when given) receives the host's time to
    enqueue one call (ms, the median of the warm-up calls after the first): where it exceeds
    the GPU time, a caller that does not capture the calls into a CUDA graph is host-bound.

    NOTE [sustained timing]: with ``queued`` and ``heat_ms > 0``, calls of ``fn`` itself run
    back to back for about ``heat_ms`` ms between the spin and the timed calls, so that the
    timed calls see the clocks the GPU holds under sustained load, as in a training step: an
    H200 running GEMMs back to back is power-limited within milliseconds, its GEMMs up to 20%
    slower than from idle (NOTE [gemm autotune] in csrc/gemm/cuda/autotune.h), while its
    copy-engine transfers keep their speed; what that changes for overlap is small (measured:
    docs/performance-log.md [sustained timing]). The number of heating calls comes from the
    GPU time of three calls queued behind a spin; ``agree`` (e.g. the maximum over ranks)
    makes every rank issue the same number, as collective calls must. The spin lasts until
    the host has enqueued the heating and the timed calls alike, so that they run back to
    back even where the host is slower to enqueue a call than the GPU to run it (NOTE
    [host-bound rows] in benchmarks/overlap_ops.py); host-bound calls still measure worse here
    than in the ``gpu`` mode. Verdict: heat for sustained clocks, and a spin long enough for
    every enqueued call.
    """
    host = [0.0]
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    host_s = statistics.median(host[1:] or host)  # seconds the host takes to enqueue one call
    if host_ms is not None:
        host_ms.append(host_s * 1e3)
    samples = []
    if cuda and queued:
        import torch

        heat = 0
        if heat_ms > 0:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spin_gpu(1.5 * host_s * 1e3 * 3 + 1.0)
            start.record()
            for _ in range(3):
                fn()
            end.record()
            end.synchronize()
            per_call = max(start.elapsed_time(end) / 3, 1e-3)
            heat = min(math.ceil(heat_ms / per_call), _MAX_HEAT_CALLS)
            heat = agree(heat) if agree is not None else heat
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        if align is not None:
            align()
        spin_gpu(1.5 * host_s * 1e3 * (heat + iters) + 1.0)  # the host enqueues all of them
        for _ in range(heat):  # NOTE [sustained timing]
            fn()
        events[0].record()
        for i in range(iters):
            fn()
            events[i + 1].record()
        events[-1].synchronize()
        samples = [events[i].elapsed_time(events[i + 1]) for i in range(iters)]
    elif cuda:
        import torch

        torch.cuda.synchronize()
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


@dataclass(frozen=True)
class StepTiming:
    """:func:`time_training_steps`' result: median GPU ms per step, median host ms to issue
    one, and the GPU's mean SM clock (MHz) while the steps ran (NaN where NVML is missing)."""

    ms: float
    host_ms: float
    sm_mhz: float


class _ClockSampler:
    """Samples this process's GPU's SM clock through NVML every 10 ms on a thread, while it
    is entered. NOTE [step timing]: a long compute-bound step runs below the boost clock
    (the board's power limit), and overlapping copies with GEMMs draws more power than
    running them apart; the clock beside each column says where that, not the schedule,
    decides a comparison."""

    def __init__(self, device: int) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device))
            self._read = lambda: pynvml.nvmlDeviceGetClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
        except Exception:  # NVML missing or not usable: no clock column
            self._read = None

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.samples.append(int(self._read()))

    def __enter__(self) -> _ClockSampler:
        if self._read is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._read is not None:
            self._stop.set()
            self._thread.join()

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else float("nan")


def _nvml_index(device: int) -> int:
    """NVML's index of CUDA device ``device`` (they differ under CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v.strip() for v in visible.split(",")]
        if device < len(entries) and entries[device].isdigit():
            return int(entries[device])
    return device


def as_after_optimizer_step(params: Any) -> None:
    """Drop ``params``' gradients and mark them changed in place, as an optimizer step would.

    NOTE [weights change every step]: the benchmarks time forward + backward without the
    optimizer, so the weights never change between their steps. An FP8 layer then reuses the
    FP8 casts of its weights (NOTE [layer fp8 state] in overlap/layers/fp8.py: re-quantized
    when the weight's version changes), which a training step with one micro-batch per
    optimizer step never can: it pays the weights' amax and cast every step (about 1 ms of a
    21 ms Llama-3-70B FP8 layer step at TP 2; a graphed layer re-quantizes at every replay
    anyway). Bumping each weight's version counter, which costs no GPU work, makes every step
    re-quantize as in training. Verdict: the timed step is a training step, weight casts
    included.
    """
    import torch

    for p in params:
        p.grad = None
        torch.autograd.graph.increment_version(p)


def time_training_steps(
    step: Callable[[], None],
    *,
    iters: int,
    warmup: int,
    cuda: bool,
    before: Callable[[], None] | None = None,
) -> StepTiming:
    """The median GPU time of one training step, the median host time to issue one and the
    mean SM clock while they ran, after ``warmup`` steps.

    NOTE [step timing]: the steps run back to back, as a training loop runs them: no
    synchronization between steps, so the host may issue step i + 1 while the GPU runs step
    i, and a CUDA event recorded between steps marks each step's end on the GPU. A step's
    time is the interval between consecutive events: its GPU time where the host keeps ahead,
    the host's time where it does not (then ``host_ms`` is about ``ms``: the row is bound by
    the host, not by the GPU). Synchronizing around every step instead would charge each step
    the host's time to issue its first kernels and, with several ranks, the ranks' skew at
    every start. ``before`` (not timed) runs ahead of every step, e.g. to drop gradients. On
    the host transport (no GPU) both times are the wall-clock time of a step.
    """
    import torch

    for _ in range(warmup):
        if before is not None:
            before()
        step()
    host: list[float] = []
    if not cuda:
        for _ in range(iters):
            if before is not None:
                before()
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e3)
        return StepTiming(statistics.median(host), statistics.median(host), float("nan"))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    torch.cuda.synchronize()
    with _ClockSampler(torch.cuda.current_device()) as clock:
        events[0].record()
        for i in range(iters):
            if before is not None:
                before()
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e3)
            events[i + 1].record()
        torch.cuda.synchronize()
    gpu = [events[i].elapsed_time(events[i + 1]) for i in range(iters)]
    return StepTiming(statistics.median(gpu), statistics.median(host), clock.mean)


def device_barrier(group: Any = None) -> Callable[[], None]:
    """A device-side barrier of ``group`` (torch.distributed, NCCL) for :func:`time_op`'s
    ``align``: an all-reduce of one element, which the current stream waits for. It ends on
    every GPU at about the same time (NCCL's latency, microseconds)."""
    import torch
    import torch.distributed as dist

    one = torch.ones(1, device=torch.device("cuda", torch.cuda.current_device()))

    def barrier() -> None:
        dist.all_reduce(one, group=group)

    return barrier


def timing_protocol(
    *,
    cuda: bool,
    queued: bool,
    warmup: int,
    iters: int,
    aligned: bool = False,
    heat_ms: float = 0.0,
) -> dict[str, Any]:
    """What :func:`time_op` measured, for a benchmark's JSON (its ``timing`` entry)."""
    if not cuda:
        clock = "wall clock (time.perf_counter) around each call; the host transport is synchronous"
        mode = "host"
    elif queued:
        clock = (
            "CUDA events between back-to-back calls, all queued behind one GPU spin that "
            "outlasts the host's enqueueing: the GPU's time per call alone (kernels and the "
            "gaps between them), without the host's enqueueing"
        )
        if aligned:
            clock += (
                "; the spin follows a device-side barrier of all ranks (an NCCL all-reduce of "
                "one element), so every rank starts at about the same time"
            )
        mode = "gpu"
        if heat_ms > 0:
            clock += (
                f"; after the spin, the call itself back to back for about {heat_ms:g} ms "
                "before the timed calls, so that they see the clocks of a GPU under sustained "
                "load (power-limited; NOTE [sustained timing] in benchmarks/common.py)"
            )
            mode = "sustained"
    else:
        clock = (
            "CUDA events around each call on an idle GPU: includes the host's work to enqueue "
            "the call (Python, argument checks, launches) wherever that is longer than the "
            "GPU's own start"
        )
        mode = "e2e"
    return {
        "mode": mode,
        "clock": clock,
        "warmup": warmup,
        "iters": iters,
        "statistic": "median of the timed iterations on each rank, then the maximum over ranks",
    }


PASSES_NOTE = (
    "every time of a row is the median over this many passes, each timing all of the row's "
    "calls once, odd passes in reverse order (NOTE [timing passes] in benchmarks/common.py)"
)


def add_timing_args(parser: argparse.ArgumentParser) -> None:
    """The timing options of a benchmark worker (check them with :func:`check_timing_args`;
    the parser needs a ``--cuda`` flag too)."""
    parser.add_argument("--iters", type=int, default=None, help="default: 20 (cuda), 3 (host)")
    parser.add_argument("--warmup", type=int, default=None, help="default: 5 (cuda), 1 (host)")
    parser.add_argument(
        "--timing",
        choices=TIMING_MODES,
        default="gpu",
        help="gpu (default): ranks aligned by a device-side barrier, each call queued behind a "
        "GPU spin (the GPU's time alone); e2e: CUDA events on an idle GPU, host enqueueing "
        "included where it is longer than the GPU's start; sustained: gpu, each call first run "
        "back to back for --heat-ms (the clocks of a GPU under sustained load); without --cuda: "
        "the wall clock (host transport)",
    )
    parser.add_argument(
        "--heat-ms",
        type=float,
        default=50.0,
        help="with --timing sustained: ms of back-to-back calls before the timed ones "
        "(default: 50)",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=None,
        help="time each row's calls in this many passes, odd ones in reverse order, and keep "
        "the median (NOTE [timing passes]); default: 2 (cuda), 1 (host)",
    )


def check_timing_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rejects impossible timing options (``parser.error``) and fills in the defaults of
    ``--iters``, ``--warmup`` and ``--passes`` for the transport (``args.cuda``)."""
    if args.timing == "sustained" and not args.cuda:
        parser.error("--timing sustained heats GPUs: it needs --cuda")
    if not 0 < args.heat_ms <= 10_000:
        parser.error(f"--heat-ms must be in (0, 10000], got {args.heat_ms}")
    args.iters = args.iters or (20 if args.cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if args.cuda else 1)
    args.passes = args.passes or (2 if args.cuda else 1)
    if args.iters < 1 or args.warmup < 0 or args.passes < 1:
        parser.error("--iters and --passes must be >= 1 and --warmup >= 0")


class RankTimer:
    """``timer(call, host)``: the milliseconds of ``call`` by :func:`time_op` with a
    benchmark's timing settings, the maximum over ranks. COLLECTIVE over torch.distributed's
    world: every rank times the same calls in the same order. On GPUs it also appends the
    host's time to enqueue one call (ms, the maximum over ranks) to the list ``host`` where
    one is given (NOTE [host-bound rows] in benchmarks/overlap_ops.py); the host transport's
    calls are synchronous, so there it appends nothing.

    Build it once torch.distributed is up: in the ``gpu`` and ``sustained`` modes every timed
    run starts with a device-side barrier of the whole world (``align``), since all TP groups
    run each call at once (NOTE [TP below the world size] in benchmarks/overlap_ops.py).
    """

    def __init__(
        self,
        *,
        cuda: bool,
        warmup: int,
        iters: int,
        timing: str = "gpu",
        passes: int = 1,
        heat_ms: float = 0.0,
    ) -> None:
        self.cuda, self.warmup, self.iters, self.passes = cuda, warmup, iters, passes
        self.queued = cuda and timing in ("gpu", "sustained")
        self.heat_ms = heat_ms if cuda and timing == "sustained" else 0.0
        self.align = device_barrier() if self.queued else None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RankTimer:
        """From the options of :func:`add_timing_args` (after :func:`check_timing_args`)."""
        return cls(
            cuda=args.cuda,
            warmup=args.warmup,
            iters=args.iters,
            timing=args.timing,
            passes=args.passes,
            heat_ms=args.heat_ms,
        )

    def __call__(self, fn: Callable[[], object], host: list[float] | None = None) -> float:
        enqueue: list[float] = []
        ms = time_op(
            fn,
            cuda=self.cuda,
            warmup=self.warmup,
            iters=self.iters,
            queued=self.queued,
            align=self.align,
            host_ms=enqueue,
            heat_ms=self.heat_ms,
            agree=lambda n: int(max_over_ranks(n)),
        )
        if self.cuda and host is not None:  # NOTE [host-bound rows]
            host.append(max_over_ranks(enqueue[0]))
        return max_over_ranks(ms)

    def protocol(self) -> dict[str, Any]:
        """The JSON's ``timing`` entry: :func:`timing_protocol` and the passes."""
        return {
            **timing_protocol(
                cuda=self.cuda,
                queued=self.queued,
                warmup=self.warmup,
                iters=self.iters,
                aligned=self.queued,
                heat_ms=self.heat_ms,
            ),
            "passes": self.passes,
            "passes_note": PASSES_NOTE,
        }


class Progress:
    """Progress lines on stderr for long sweeps: ``[label] i/N message | elapsed, ETA``.

    The ETA assumes the remaining steps take as long as the finished ones did on average.
    Disabled (silent) on all but one rank."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: Any = None):
        self.total = total
        self.label = label
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.t0 = time.perf_counter()

    def step(self, message: str) -> None:
        """One step finished."""
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        print(
            f"[{self.label}] {self.done}/{self.total} {message} | "
            f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}",
            file=self.stream,
            flush=True,
        )


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over all ranks (collective over torch.distributed's world)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return max(out)


def min_clock(mhz: float) -> float | None:
    """The lowest over ranks of an SM clock sample mean (COLLECTIVE); None without NVML."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mhz)
    known = [v for v in out if not math.isnan(v)]
    return min(known) if known else None


def first_error(error: str | None) -> str | None:
    """COLLECTIVE over the world: the lowest rank's error, or None when every rank is fine
    (so that every rank skips, or times, something together)."""
    import torch.distributed as dist

    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None), None)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, the message cut to 300 characters (for n/a notes)."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def add_shape_plans_arg(parser: argparse.ArgumentParser) -> None:
    """``--shape-plans``: the layer benchmarks' ``initialize_ub(shape_plans=...)``."""
    parser.add_argument(
        "--shape-plans", default=None, choices=("always", "measured"),
        help="initialize_ub(shape_plans=...) of ours (default: initialize_ub's, measured on "
        "GPUs): 'measured' times each planned GEMM shape's overlap op against the sequential "
        "path at its first call and keeps the faster, 'always' runs the op (NOTE [shape "
        "plans]); the decisions go to the JSON rows (shape_plans)",
    )  # fmt: skip


# --- launching ---------------------------------------------------------------------------------


def add_launch_arg(parser: argparse.ArgumentParser) -> None:
    """``--launch N``: see :func:`launch_workers`."""
    parser.add_argument(
        "--launch",
        type=int,
        default=0,
        metavar="N",
        help="start N ranks under mpirun, each running the same options without --launch "
        "(without it, this process is one rank of a job that mpirun started)",
    )


def mpirun_module(nprocs: int, module: str, args: Sequence[str]) -> list[str]:
    """The command running ``python -m module args`` on ``nprocs`` local ranks under mpirun
    (overlap.launch.mpirun_command: the no-multicast variables included), with the repository
    on ``PYTHONPATH`` and untagged output."""
    return mpirun_command(
        nprocs,
        [sys.executable, "-u", "-m", module, *args],
        env={"PYTHONPATH": str(REPO)},
        tag_output=False,
    )


def launch_workers(module: str, nprocs: int, argv: Sequence[str]) -> int:
    """Runs ``module`` with ``argv`` less ``--launch N`` on ``nprocs`` ranks under mpirun;
    returns mpirun's exit status."""
    argv = list(argv)
    worker_argv = [a for i, a in enumerate(argv) if not _is_launch_arg(argv, i)]
    return subprocess.call(mpirun_module(nprocs, module, worker_argv), env=os.environ.copy())


def _is_launch_arg(argv: Sequence[str], i: int) -> bool:
    """``--launch N`` / ``--launch=N`` (the launcher's own option, not the workers')."""
    return argv[i].startswith("--launch") or (i > 0 and argv[i - 1] == "--launch")


# --- reporting ---------------------------------------------------------------------------------


def environment(cuda: bool) -> dict[str, Any]:
    """What a benchmark's JSON says about the machine: ``host``, ``gpu`` (None on the host
    transport), ``torch`` and ``overlap_build``."""
    import torch

    from overlap.info import summary

    return {
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "overlap_build": summary(),
    }


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A fixed-width text table; ``columns`` are (key, header) pairs."""
    cells = [[h for _, h in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k)) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.1f}"
    return str(v)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def write_outputs(
    out_dir: Path, name: str, payload: dict[str, Any], text: str
) -> tuple[Path, Path]:
    """Writes ``payload`` to ``out_dir/<name>.json`` and ``text`` (the table with its notes) to
    ``out_dir/<name>.txt``, prints ``text``; returns (JSON path, table path)."""
    json_path = out_dir / f"{name}.json"
    write_json(json_path, payload)
    table_path = out_dir / f"{name}.txt"
    table_path.write_text(text + "\n")
    print("\n" + text, flush=True)
    return json_path, table_path


def print_paths(json_path: Path, seconds: float, table_path: Path, plot: Path | None) -> None:
    """The closing lines of a benchmark: where its JSON, table and plot are."""
    print(f"\nJSON: {json_path} ({seconds:.0f} s)\ntable: {table_path}")
    print(f"plot: {plot}" if plot is not None else "plot: none (matplotlib not installed)")


def profile_host(step: Callable[[], None], steps: int = 5) -> str:
    """cProfile of ``steps`` steps after two warm-up steps: where the host's time to issue a
    step goes (the functions by own time, then by cumulative time). The GPU is synchronized
    after each step, outside the profile."""
    import cProfile
    import io
    import pstats

    import torch

    cuda = torch.cuda.is_available()
    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
    prof = cProfile.Profile()
    for _ in range(steps):
        prof.enable()
        step()
        prof.disable()
        if cuda:
            torch.cuda.synchronize()
    out = io.StringIO()
    out.write(f"host profile of {steps} steps\n")
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumtime").print_stats(60)
    return out.getvalue()

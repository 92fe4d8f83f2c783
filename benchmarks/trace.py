"""GPU timelines of benchmarked calls (``python -m benchmarks.overlap_ops --cuda --trace``).

After a row is timed, its best variant and torch's op each run ``calls`` times back to back
under ``torch.profiler`` (CUPTI activity records of every stream, the ops' side streams
included), queued behind a GPU spin so that the host never paces them. Every rank's kernels
and copies go onto one time axis in ``DIR/traces/<row>.txt``: each rank's times count from
the end of the device-side barrier ahead of the spin (an NCCL all-reduce, which ends at about
the same moment on every rank; each rank's own clock), so the ranks line up to within that
barrier's skew even where a host queued its spin late and its calls start later; under a
per-call breakdown per rank: the
span, the time in kernels and in copies (they overlap each other), and the idle time (no
kernel and no copy running). That is how a row that misses its target gets explained
(docs/design.md §6: "where a row misses, say why").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, spin_gpu

# Chrome-trace categories of GPU activity, and what the timeline calls them.
_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# The harness's spin kernel (torch.cuda._sleep), which queues the traced calls: it and
# everything before it (the aligning barrier) are left out of the timeline.
_SPIN_KERNEL = "spin_kernel"
# The aligning barrier's kernels (benchmarks.common.device_barrier: an NCCL all-reduce).
_BARRIER_KERNEL = "nccl"


@dataclass(frozen=True)
class Activity:
    """One kernel or copy of one rank: start and duration in microseconds (the start on that
    rank's clock, or counted from its aligning barrier's end, :func:`activities_of`), the
    stream it ran on, its kind (kernel, memcpy or memset) and name."""

    rank: int
    start_us: float
    dur_us: float
    stream: str
    kind: str
    name: str

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def activities_of(trace: Mapping[str, Any], rank: int) -> list[Activity]:
    """The GPU activities of a chrome trace (``torch.profiler``'s export) that start after the
    harness's last spin kernel ended (all of them if there is none), in start order, their
    times counted from the end of the aligning barrier (the last NCCL kernel that ended before
    that spin started; without one, from the first of the activities)."""
    acts = []
    for e in trace.get("traceEvents", []):
        kind = _KINDS.get(e.get("cat", ""))
        if kind is None:
            continue
        stream = str(e.get("args", {}).get("stream", "?"))
        name = str(e.get("name", ""))
        acts.append(Activity(rank, float(e["ts"]), float(e.get("dur", 0.0)), stream, kind, name))
    spins = [a for a in acts if a.kind == "kernel" and _SPIN_KERNEL in a.name]
    after = max((a.end_us for a in spins), default=float("-inf"))
    kept = sorted((a for a in acts if a.start_us >= after), key=lambda a: a.start_us)
    spin_start = max((a.start_us for a in spins), default=float("-inf"))
    barrier = [
        a.end_us
        for a in acts
        if a.kind == "kernel" and _BARRIER_KERNEL in a.name.lower() and a.end_us <= spin_start
    ]
    origin = max(barrier, default=kept[0].start_us if kept else 0.0)
    return [replace(a, start_us=a.start_us - origin) for a in kept]


def breakdown(acts: Sequence[Activity], calls: int) -> dict[str, float]:
    """Per call (``calls`` calls traced back to back), in microseconds: the span of the
    activities, the time spent in kernels and in copies (summed over streams, so they may
    add up to more than the span), and the idle time (neither running anywhere); and the
    number of activities recorded (all calls together)."""
    if not acts:
        return {"span_us": 0.0, "kernel_us": 0.0, "copy_us": 0.0, "idle_us": 0.0, "activities": 0}
    ordered = sorted(acts, key=lambda a: a.start_us)
    begin = ordered[0].start_us
    end = max(a.end_us for a in ordered)
    busy, cur_lo, cur_hi = 0.0, ordered[0].start_us, ordered[0].end_us
    for a in ordered[1:]:
        if a.start_us > cur_hi:
            busy += cur_hi - cur_lo
            cur_lo, cur_hi = a.start_us, a.end_us
        else:
            cur_hi = max(cur_hi, a.end_us)
    busy += cur_hi - cur_lo
    span = end - begin
    return {
        "span_us": span / calls,
        "kernel_us": sum(a.dur_us for a in acts if a.kind == "kernel") / calls,
        "copy_us": sum(a.dur_us for a in acts if a.kind != "kernel") / calls,
        "idle_us": (span - busy) / calls,
        "activities": len(acts),
    }


def busy_us(acts: Sequence[Activity]) -> float:
    """The time (us) at least one of ``acts`` runs: the union of their intervals."""
    busy, hi = 0.0, float("-inf")
    for a in sorted(acts, key=lambda a: a.start_us):
        if a.end_us > hi:
            busy += a.end_us - max(a.start_us, hi)
            hi = a.end_us
    return busy


def by_stream_and_kernel(acts: Sequence[Activity], calls: int, top: int = 12) -> str:
    """Where one rank's GPU time goes, per call: per stream its busy time (union of its
    activities) and activity count; then the ``top`` kernel/copy names by summed duration
    (names cut at 70 characters, so one GEMM's configurations stay apart). A stream that
    carries the compute (the busiest) and is idle for a while during the span is where a
    communication is exposed."""
    streams: dict[str, list[Activity]] = {}
    names: dict[tuple[str, str], list[float]] = {}
    for a in acts:
        streams.setdefault(a.stream, []).append(a)
        names.setdefault((a.name[:70], a.stream), []).append(a.dur_us)
    rows = [
        {"stream": st, "busy_us": busy_us(xs) / calls, "n": len(xs) / calls}
        for st, xs in sorted(streams.items(), key=lambda kv: -busy_us(kv[1]))
    ]
    lines = [format_table(rows, [("stream", "stream"), ("busy_us", "busy/call"),
                                 ("n", "activities/call")])]  # fmt: skip
    ranked = sorted(names.items(), key=lambda kv: -sum(kv[1]))[:top]
    lines.append("")
    lines.append(f"{'us/call':>9} {'count':>6}  name [stream]")
    for (name, st), durs in ranked:
        lines.append(f"{sum(durs) / calls:9.1f} {len(durs) // calls:>6}  {name} [{st}]")
    return "\n".join(lines)


def timeline_text(label: str, traced: Mapping[str, Sequence[Activity]], calls: int) -> str:
    """The trace file of one row: per traced call a breakdown table (one line per rank),
    then every rank's activities on one axis (:func:`activities_of`'s times, shifted so that
    the earliest activity of any rank is at 0)."""
    lines = [f"GPU timeline of {label}: {calls} calls back to back per traced call (us)"]
    for name, acts in traced.items():
        ranks = sorted({a.rank for a in acts})
        rows = [{"rank": r, **breakdown([a for a in acts if a.rank == r], calls)} for r in ranks]
        lines += ["", f"== {name}", ""]
        lines.append(
            format_table(
                rows,
                [
                    ("rank", "rank"),
                    ("span_us", "span/call"),
                    ("kernel_us", "kernels/call"),
                    ("copy_us", "copies/call"),
                    ("idle_us", "idle/call"),
                    ("activities", "activities"),
                ],
            )
        )
        counts = sorted({row["activities"] for row in rows})
        if len(counts) > 1:
            lines.append(
                f"warning: the ranks recorded different numbers of activities ({counts[0]}.."
                f"{counts[-1]}): where a rank did the same work, the profiler dropped records "
                "and that rank's per-call times are too low"
            )
        first = [a for a in acts if a.rank == ranks[0]] if ranks else []
        lines += ["", f"GPU time of rank {ranks[0] if ranks else '-'} by stream and kernel:", ""]
        lines.append(by_stream_and_kernel(first, calls))
        lines.append("")
        t0 = min((a.start_us for a in acts), default=0.0)
        lines.append(f"{'rank':>4} {'start':>9} {'dur':>8} {'end':>9}  stream  kind    name")
        for a in sorted(acts, key=lambda a: (a.start_us, a.rank)):
            s = a.start_us - t0
            lines.append(
                f"{a.rank:>4} {s:9.1f} {a.dur_us:8.1f} {s + a.dur_us:9.1f}  {a.stream:>6}  "
                f"{a.kind:<6}  {a.name[:90]}"
            )
    return "\n".join(lines)


def row_label(row: Mapping[str, Any]) -> str:
    """A file-name-safe name of a benchmark row."""
    return f"{row['op']}-{row['shape']}-M{row['M']}-tp{row['tp']}-{row['dtype']}"


class Tracer:
    """Records GPU timelines of calls on every rank (COLLECTIVE over torch.distributed's
    world: every rank calls :meth:`record` with the same names) and writes them on rank 0.

    Args:
        out_dir: the benchmark's output directory; traces go to ``out_dir / "traces"``.
        align: a device-side barrier of the world (benchmarks.common.device_barrier).
        calls: calls traced back to back per traced callable (>= 1).
    """

    def __init__(self, out_dir: Path, align: Callable[[], object], calls: int = 3) -> None:
        if calls < 1:
            raise ValueError(f"calls must be >= 1, got {calls}")
        self.dir = Path(out_dir) / "traces"
        self.align = align
        self.calls = calls

    def record(self, label: str, calls: Mapping[str, Callable[[], object]]) -> dict[str, Any]:
        """Traces every callable of ``calls``; returns, by name, the largest per-call span over
        the ranks and each rank's breakdown (:func:`breakdown`), and writes the timeline to
        ``traces/<label>.txt`` on rank 0 (its path under ``"file"``)."""
        import torch.distributed as dist

        traced: dict[str, list[Activity]] = {}
        for name, fn in calls.items():
            mine = [asdict(a) for a in self._trace(fn)]
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            traced[name] = [Activity(**a) for acts in everyone for a in acts]
        result: dict[str, Any] = {}
        for name, acts in traced.items():
            per_rank = [
                {"rank": r, **breakdown([a for a in acts if a.rank == r], self.calls)}
                for r in sorted({a.rank for a in acts})
            ]
            result[name] = {
                "span_us": max((b["span_us"] for b in per_rank), default=0.0),
                "ranks": per_rank,
            }
        path = self.dir / f"{label}.txt"
        if dist.get_rank() == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            path.write_text(timeline_text(label, traced, self.calls) + "\n")
        result["file"] = str(path)
        return result

    def _trace(self, fn: Callable[[], object]) -> list[Activity]:
        import torch
        import torch.distributed as dist
        from torch.profiler import ProfilerActivity, profile

        for _ in range(2):  # warm: nothing first-time (tuning, allocation) in the timeline
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.align()  # every rank's spin ends at about the same time
            spin_gpu(2.0)  # the host queues every call before the GPU starts them
            for _ in range(self.calls):
                fn()
            torch.cuda.synchronize()
            time.sleep(0.05)  # CUPTI hands its last records over asynchronously
        fd, tmp = tempfile.mkstemp(suffix=".json", prefix="overlap-trace-")
        os.close(fd)
        try:
            prof.export_chrome_trace(tmp)
            with open(tmp) as f:
                return activities_of(json.load(f), dist.get_rank())
        finally:
            os.unlink(tmp)

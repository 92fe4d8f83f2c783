"""Timing and reporting helpers shared by the benchmarks (DESIGN.md §6 protocol).

Times are medians of >= 20 timed iterations after warm-up, measured with CUDA events on GPUs
(wall clock on the host transport), then the maximum over ranks.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# GPU clock cycles of the spin queued ahead of a timed op by time_op(queued=True): about
# 0.5 ms at H100/H200 clocks, far longer than the host needs to enqueue the op and its events.
_QUEUE_SPIN_CYCLES = 1_000_000


def time_op(
    fn: Callable[[], object],
    *,
    cuda: bool,
    warmup: int = 5,
    iters: int = 20,
    queued: bool = False,
) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after ``warmup`` runs.

    With ``cuda``, CUDA events around each call; the GPU is idle when the start event is
    recorded, so the time includes the host's work to enqueue ``fn`` (Python, argument checks,
    launch calls) wherever that is longer than the GPU's own start. With ``queued`` as well, a
    GPU spin (``torch.cuda._sleep``) is enqueued first, so that the start event, ``fn`` and
    the end event are all queued before the GPU reaches them: the time is then the GPU's
    alone (the kernels and the gaps between them), without the host's enqueueing.
    """
    for _ in range(warmup):
        fn()
    samples = []
    if cuda:
        import torch

        torch.cuda.synchronize()
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(_QUEUE_SPIN_CYCLES)
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


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over all ranks (collective over torch.distributed's world)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return max(out)


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

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


def plot_times(
    rows: Sequence[dict[str, Any]],
    label_keys: Sequence[str],
    series: Sequence[tuple[str, str]],
    path: Path,
    title: str,
) -> Path | None:
    """A grouped bar chart (PNG) of times per row: one group per row (labelled by
    ``label_keys``), one bar per ``series`` entry (key, legend label), values normalised to
    the row's ``floor`` when it has one. Returns ``path``, or None (with a printed reason)
    when matplotlib is not installed; missing values are skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"[plot] matplotlib is not installed: no plot at {path}")
        return None
    labels = ["\n".join(str(r[k]) for k in label_keys) for r in rows]
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows)), 4.0))
    for i, (key, legend) in enumerate(series):
        xs, ys = [], []
        for j, r in enumerate(rows):
            value, floor = r.get(key), r.get("floor")
            if isinstance(value, (int, float)):
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                ys.append(value / floor if floor else value)
        if ys:  # a series with no value (e.g. a peer that could not run) gets no legend entry
            ax.bar(xs, ys, width=width, label=legend, color=f"C{i}")
    normalised = any(r.get("floor") for r in rows)
    if normalised:
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.10, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("time / floor" if normalised else "ms")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""Timing and reporting helpers shared by the benchmarks (DESIGN.md §6 protocol).

Times are medians of >= 20 timed iterations after warm-up, measured with CUDA events on GPUs
(wall clock on the host transport), then the maximum over ranks.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
    copy-engine transfers keep their speed. That changes what overlap costs (dev probe,
    2026-11-22, two H200s, 32 MB copies to or from the peer back to back beside torch's
    GEMMs): from idle the GEMMs ran 3.6-4.8% slower beside the copies (te8192 chunk bf16
    0.342 -> 0.354 / 0.357 ms), power-limited within 0.3% (0.408 either way). Yet the overlap
    ops gained nothing from it on the whole TP 4 suite (4xH200, same day): T_gemm 1-14% higher
    than in the ``gpu`` mode, ours / floor about the same (median 1.065 against 1.061, 17 of
    24 rows <= 1.10 in both; the comm-bound GEMM+RS rows 1-3% nearer the floor, several
    GEMM-bound AG rows up to 5% further). The number of heating calls comes from the GPU time
    of three calls queued behind a spin; ``agree`` (e.g. the maximum over ranks) makes every
    rank issue the same number, as collective calls must. The spin lasts until the host has
    enqueued the heating and the timed calls alike, so that they run back to back even where
    the host is slower to enqueue a call than the GPU to run it (NOTE [host-bound rows] in
    benchmarks/overlap_ops.py). Host-bound calls still measure worse here than in the ``gpu``
    mode: torch's FP8 all-gather op on the te4096 row (host 0.87 ms per call, GPU 0.22)
    measured 0.78 ms (with a spin sized for the timed calls only, torch's qkv and proj FP8
    rows measured about 2x slower too; with this spin they agree).
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
    *,
    hatched: Sequence[str] = (),
    target: float = 1.10,
    rows_per_panel: int = 16,
    y_max: float = 3.0,
) -> Path | None:
    """A grouped bar chart (PNG) of times per row: one group per row (labelled by
    ``label_keys``), one bar per ``series`` entry (key, legend label), values normalised to
    the row's ``floor`` when it has one, with lines at 1.0 (the floor) and ``target``.

    Series in ``hatched`` are drawn hatched (references not measured by this run); series
    without any value are left out; long sweeps are cut into panels of ``rows_per_panel``
    rows, stacked; normalised bars above ``y_max`` are clipped and labelled with their value.
    Returns ``path``, or None (with a printed reason) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print(f"[plot] matplotlib is not installed: no plot at {path}")
        return None

    def value(r: dict[str, Any], key: str) -> float | None:
        v, floor = r.get(key), r.get("floor")
        if not isinstance(v, (int, float)):
            return None
        return v / floor if floor else float(v)

    # (colour index, key, legend) of the series with a value: a series keeps its colour
    active = [(c, k, leg) for c, (k, leg) in enumerate(series) if any(value(r, k) for r in rows)]
    normalised = any(r.get("floor") for r in rows)
    panels = [rows[i : i + rows_per_panel] for i in range(0, len(rows), rows_per_panel)] or [[]]
    width = 0.8 / max(1, len(active))
    fig_w = max(6.0, 0.22 * min(len(rows), rows_per_panel) * (len(active) + 1))
    fig, axes = plt.subplots(len(panels), 1, figsize=(fig_w, 3.2 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        top = 0.0
        for i, (colour, key, _) in enumerate(active):
            xs, ys = [], []
            for j, r in enumerate(panel):
                v = value(r, key)
                if v is not None:
                    xs.append(j + (i - (len(active) - 1) / 2) * width)
                    ys.append(v)
            shown = [min(y, y_max) for y in ys] if normalised else ys
            ax.bar(
                xs,
                shown,
                width=width,
                color=f"C{colour}",
                hatch="//" if key in hatched else None,
                alpha=0.6 if key in hatched else 1.0,
            )
            for x, y in zip(xs, ys, strict=True):
                if normalised and y > y_max:
                    ax.text(x, y_max, f"{y:.1f}", ha="center", va="bottom", fontsize=6)
            top = max([top, *shown])
        if normalised:
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.axhline(target, color="gray", linewidth=0.8, linestyle="--")
            ax.set_ylim(0, max(target, top) * 1.12)
        labels = ["\n".join(str(r[k]) for k in label_keys) for r in panel]
        ax.set_xticks(range(len(panel)), labels, fontsize=7)
        ax.set_xlim(-0.6, max(len(panel), 4) - 0.4)
        ax.set_ylabel("time / floor" if normalised else "ms")
    axes[0, 0].set_title(title, fontsize=9)
    handles = [
        Patch(
            facecolor=f"C{c}", label=leg, **({"hatch": "//", "alpha": 0.6} if k in hatched else {})
        )
        for c, k, leg in active
    ]
    axes[0, 0].legend(handles=handles, fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

"""The benchmarks' bar chart (PNG, with matplotlib when it is installed): times per row,
normalised to each row's floor. Also importable from :mod:`benchmarks.common`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def tick_label(row: dict[str, Any], keys: Sequence[str]) -> str:
    """A row's x label: one line per key, numbers with their field's name (``M=8192``,
    ``tp=4``), names as they are (``ag_gemm``, ``fc1``, ``bf16``)."""
    lines = []
    for key in keys:
        value = row.get(key)
        named = isinstance(value, (int, float)) and not isinstance(value, bool)
        lines.append(f"{key}={value}" if named else str(value))
    return "\n".join(lines)


def plot_times(
    rows: Sequence[dict[str, Any]],
    label_keys: Sequence[str],
    series: Sequence[tuple[str, str]],
    path: Path,
    title: str,
    *,
    hatched: Sequence[str] = (),
    target: float | None = 1.10,
    rows_per_panel: int = 16,
    y_max: float = 3.0,
) -> Path | None:
    """A grouped bar chart (PNG) of times per row: one group per row (labelled by
    ``label_keys``, see :func:`tick_label`; the x axis names them), one bar per ``series``
    entry (key, legend label), values normalised to the row's ``floor`` when it has one, with
    lines at 1.0 (the floor) and at ``target`` (None: no target line).

    Series in ``hatched`` are drawn hatched (references not measured by this run); series
    without any value are left out; long sweeps are cut into panels of ``rows_per_panel``
    rows, stacked; normalised bars above ``y_max`` are clipped and labelled with their value.
    The legend sits to the right of the first panel, off the bars.
    Returns ``path``, or None (with a printed reason) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
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
    # the bars' width, and 2.6 inches for the legend beside them
    fig_w = max(6.0, 0.22 * min(len(rows), rows_per_panel) * (len(active) + 1)) + 2.6
    label_h = 0.13 * len(label_keys)  # inches of tick labels, one line per key
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(fig_w, (2.6 + label_h) * len(panels)), squeeze=False
    )
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
            if target is not None:
                ax.axhline(target, color="gray", linewidth=0.8, linestyle="--")
            ax.set_ylim(0, max(target or 1.0, top) * 1.12)
        ax.set_xticks(range(len(panel)), [tick_label(r, label_keys) for r in panel], fontsize=7)
        ax.set_xlim(-0.6, max(len(panel), 4) - 0.4)
        ax.set_ylabel("time / floor" if normalised else "ms")
    axes[-1, 0].set_xlabel("rows: " + ", ".join(label_keys), fontsize=8)
    axes[0, 0].set_title(title, fontsize=9)
    handles = [
        Patch(
            facecolor=f"C{c}", label=leg, **({"hatch": "//", "alpha": 0.6} if k in hatched else {})
        )
        for c, k, leg in active
    ]
    if normalised:
        handles.append(Line2D([], [], color="black", linewidth=0.8, label="the floor"))
        if target is not None:
            dashed = {"color": "gray", "linewidth": 0.8, "linestyle": "--"}
            handles.append(Line2D([], [], **dashed, label=f"{target:.2f} x floor"))
    axes[0, 0].legend(
        handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path

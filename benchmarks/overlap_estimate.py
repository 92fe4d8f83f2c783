"""Planning a run of the overlap ops benchmark (:mod:`benchmarks.overlap_ops` ``--list``): the
rows a selection runs, the rows it leaves out and why, and an estimate of the GPU time the run
will take on H100s, so that a suite can be cut to the device time there is (``--families``,
``--tokens``, ``--shapes``, ``--dtypes``, ``--methods``, ``--iters``, ``--passes``).

The estimate is a model (:class:`GpuModel`), not a measurement: round figures of cuBLASLt's
and NCCL's speeds and of the benchmark's own costs per timed call and per row. Every call of
a row (benchmarks/overlap_runner.py: the GEMM whole and chunked, NCCL's collective, the
sequential run, our collective, the GEMM beside our copies twice, every applicable variant and
torch's op) runs ``warmup + iters`` times per pass behind a spin sized by the host's enqueue
time (``time_op`` in benchmarks/common.py), and each row builds its operands, buffers and
autotuned GEMMs once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

from benchmarks.common import format_table
from benchmarks.methods import BULK_OPS, Case, Variant
from benchmarks.overlap_suite import ROW_COLUMNS, Suite, skipped_lines
from overlap.ub.plans import UNTIMED_CALLS, ShapePlans


@dataclass(frozen=True)
class GpuModel:
    """What :func:`estimate_row_seconds` assumes of H100 SXM GPUs (NVLink 4 through NVSwitch)
    and of the benchmark: an estimate within a factor of about 1.5.

    Attributes:
        bf16_tflops, fp8_tflops: dense GEMM throughput that cuBLASLt reaches on large GEMMs.
        gemm_min_ms: the shortest GEMM (launch and tail of a small problem).
        bus_gbps: the bus bandwidth of NCCL's all-gather and reduce-scatter.
        collective_min_ms: the shortest collective.
        host_ms: the host's time to enqueue one call of an overlap op (ours or torch's;
            issue 30 measured 0.27-0.38 ms): the spin ahead of a timed call's ``iters`` calls
            lasts ``1 + 1.5 host_ms iters`` ms (benchmarks/common.py).
        baseline_host_ms: the same for a bare GEMM or NCCL collective.
        call_ms: the rest of a timed call's cost (synchronisation, the maximum over ranks).
        row_s: building a row (operands, buffers, torch's symmetric memory) besides tuning.
        tuned_gemms, tune_calls: GEMM shapes autotuned per row (whole, chunk, pieces) and
            the GEMM calls each tuning costs (NOTE [gemm autotune] in
            csrc/gemm/cuda/autotune.h; keys shared between rows and variants are tuned once,
            which this per-row figure averages over).

    ``row_s`` and ``tune_calls``, the least known figures, are fitted to three measured runs
    of the broad suite (docs/performance-log.md [broad suite] planned column: within 15% of
    each, never short). Compare a run's ``estimated_gpu_seconds`` with its ``seconds``
    (JSON) to correct them again.
    """

    bf16_tflops: float = 600.0
    fp8_tflops: float = 1000.0
    gemm_min_ms: float = 0.015
    bus_gbps: float = 360.0
    collective_min_ms: float = 0.015
    host_ms: float = 0.3
    baseline_host_ms: float = 0.05
    call_ms: float = 2.0
    row_s: float = 0.15
    tuned_gemms: int = 5
    tune_calls: int = 8

    def gemm_ms(self, row: Mapping[str, Any]) -> float:
        """The row's GEMM alone: its rank's M x K x N."""
        tflops = self.fp8_tflops if row["dtype"] == "fp8" else self.bf16_tflops
        return max(2.0 * row["M"] * row["K"] * row["N"] / (tflops * 1e9), self.gemm_min_ms)

    def comm_ms(self, row: Mapping[str, Any]) -> float:
        """The row's collective alone: ``(tp - 1) / tp`` of the gathered input over the bus
        (AG+GEMM, in FP8 for FP8 rows), or of the bf16 partial sums (GEMM+RS); bulk rows
        move ``[M, K]``."""
        if row["op"] in ("ag_gemm", "bulk_ag"):
            nbytes = row["M"] * row["K"] * (1 if row["dtype"] == "fp8" else 2)
        else:
            nbytes = row["M"] * (row["N"] if row["op"] == "gemm_rs" else row["K"]) * 2
        moved = nbytes * (row["tp"] - 1) / row["tp"]
        return max(moved / (self.bus_gbps * 1e6), self.collective_min_ms)


H100 = GpuModel()


def applicable_variants(row: Mapping[str, Any], variants: Sequence[Variant], cuda: bool) -> int:
    """How many of ``variants`` a row times: their ``when`` looks at the op, the transport and
    the TP size only, so a stand-in communicator (and no operands) does."""
    comm: Any = SimpleNamespace(group=SimpleNamespace(size=row["tp"]))
    fp8 = row["dtype"] == "fp8"
    case = Case(row["op"], comm, row["M"], row["K"], row["N"], None, None, None, fp8, cuda)
    return sum(v.applies(case) for v in variants)


def estimate_row_seconds(
    row: Mapping[str, Any],
    variants: int,
    *,
    warmup: int,
    iters: int,
    passes: int,
    heat_ms: float = 0.0,
    model: GpuModel = H100,
) -> float:
    """Seconds the benchmark spends on ``row`` (real shapes) with ``variants`` variants timed,
    ``heat_ms`` more per timed call under ``--timing sustained``, under ``model``."""
    g, c = model.gemm_ms(row), model.comm_ms(row)
    op = (1.1 * max(g, c), model.host_ms)  # (GPU ms, host ms) of an overlap op: near the floor
    base = model.baseline_host_ms
    if row["op"] in BULK_OPS:  # the side GEMM, the collective, one then the other, NCCL beside
        calls = [(g, base), (c, base), (g + c, base), op]
    else:  # GEMM whole and chunked, NCCL, sequential, ours, the GEMM beside copies x 2, torch
        calls = [(g, base), (g, base), (c, base), (g + c, base), (c, base), op, op, op]
    calls += [op] * variants
    per_pass = sum(
        warmup * max(t, host) + (1.0 + 1.5 * host * iters) + heat_ms + iters * t + model.call_ms
        for t, host in calls
    )
    # NOTE [planned column]: the shape plan runs the default and the sequential path once per
    # row, UNTIMED_CALLS + its timed calls each
    plan = (UNTIMED_CALLS + ShapePlans().timed_calls) * (op[0] + g + c) if variants else 0.0
    return model.row_s + (model.tuned_gemms * model.tune_calls * g + passes * per_pass + plan) / 1e3


def estimate_run(
    rows: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    *,
    warmup: int,
    iters: int,
    passes: int,
    heat_ms: float = 0.0,
    model: GpuModel = H100,
) -> dict[str, Any]:
    """The estimate of a GPU run of ``rows`` (real shapes): ``seconds`` in all and ``by_tp``
    (all TP groups of a TP size run each row at once, so the TP sizes add up), the median
    ``variants`` timed per row, and per row (in order) ``est_gemm_ms``, ``est_comm_ms``,
    ``variants`` and ``est_s``; ``model``: the assumptions."""
    per_row = []
    by_tp: dict[str, float] = {}
    for r in rows:
        n = applicable_variants(r, variants, cuda=True)
        s = estimate_row_seconds(
            r, n, warmup=warmup, iters=iters, passes=passes, heat_ms=heat_ms, model=model
        )
        g, c = model.gemm_ms(r), model.comm_ms(r)
        per_row.append({"est_gemm_ms": g, "est_comm_ms": c, "variants": n, "est_s": s})
        by_tp[str(r["tp"])] = by_tp.get(str(r["tp"]), 0.0) + s
    return {
        "seconds": math.fsum(by_tp.values()),
        "by_tp": by_tp,
        "variants": statistics.median(e["variants"] for e in per_row) if per_row else 0,
        "rows": per_row,
        "model": asdict(model),
    }


LIST_COLUMNS = [
    *ROW_COLUMNS,
    ("est_gemm_ms", "est T_gemm"),
    ("est_comm_ms", "est T_comm"),
    ("est_ratio", "comm/gemm"),
    ("variants", "variants"),
    ("est_s", "est s"),
]


def listing_text(suite: Suite, estimate: dict[str, Any] | None) -> str:
    """``--list``: the rows of a selection (with their estimate on GPUs where ``estimate`` is
    given), the rows it leaves out grouped by reason, and the totals."""
    per_row = estimate["rows"] if estimate else [{} for _ in suite.rows]
    shown = [
        {**r, **e, "est_ratio": e["est_comm_ms"] / e["est_gemm_ms"] if e else None}
        for r, e in zip(suite.rows, per_row, strict=True)
    ]
    columns = LIST_COLUMNS if estimate else ROW_COLUMNS
    tps = sorted({r["tp"] for r in suite.rows})
    lines = [
        f"{suite.name} suite: {len(suite.rows)} rows (TP {tps}), {len(suite.skipped)} left out",
        "",
        format_table(shown, columns),
    ]
    lines += skipped_lines(suite.skipped, shown=4)
    if estimate:
        by_tp = ", ".join(f"TP {tp} {s / 60:.1f}" for tp, s in estimate["by_tp"].items())
        lines += [
            "",
            f"estimated GPU time on H100s: {estimate['seconds'] / 60:.1f} min ({by_tp}; a "
            f"median of {estimate['variants']} variants a row); a model within a factor of "
            "about 1.5 (benchmarks/overlap_estimate.py), not a measurement",
        ]
    return "\n".join(lines)

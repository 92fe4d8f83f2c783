"""Worker (run under mpirun): the comm-GEMM overlap ops against their floor (DESIGN.md §6).

Per op x shape x dtype x TP size, in one run on the same devices:

* ``T_gemm``: the best of the whole GEMM and the ``tp`` chunked GEMMs, no communication (both
  are in the JSON);
* ``T_comm``: the collective alone (NCCL on GPUs, gloo on the host transport);
* ``T_seq``: the collective, then the GEMM (NCCL + cuBLASLt; :mod:`overlap.ops.reference`'s
  reduce-scatter for GEMM+RS);
* ``T_ours``: every variant of every registered method (:mod:`benchmarks.methods`; all of them
  in the JSON, the best in the table with its name), and ``T_default``, the variant that runs
  what ``initialize_ub()`` configures by default for the row (``default/floor`` in the table,
  its own counts in the summary line: NOTE [default variant] in benchmarks/methods.py);
* torch's async-TP (``torch.ops.symm_mem.fused_all_gather_matmul`` /
  ``fused_matmul_reduce_scatter``, their ``_scaled`` variants for FP8), or "n/a" with the
  reason where it fails;
* ``T_ours / floor`` with ``floor = max(T_gemm, T_comm)``, the overlap efficiency
  ``1 - (T_ours - T_gemm) / (T_seq - T_gemm)``, ``vs torch = T_ours / T_torch`` and, on the
  rows that match DESIGN.md §6's TransformerEngine table (TP = 4, M = 8192), ``vs TE =
  T_ours / TE best``, where "TE best" is the time MEASURED ON 4xH200 and copied from
  DESIGN.md (a reference column, not measured by this run).

Timing: median of ``--iters`` (>= 20 on GPUs) timed runs after warm-up, CUDA events (wall
clock on the host transport), max over all ranks; every call of a row is timed in ``--passes``
passes (2 on GPUs), odd ones in reverse order, and the median kept (NOTE [timing passes]).
``--timing gpu`` (default) measures the GPU alone: every rank first passes a device-side
barrier (an NCCL all-reduce of one element), then queues a GPU spin, then the timed calls back
to back with an event between consecutive calls, so all ranks start at about the same time and
the host's enqueueing is hidden, as in a training step whose host runs ahead of its GPU.
``--timing e2e`` records the start event on an idle GPU, so the time includes the host's
enqueueing where that is longer than the GPU's start (benchmarks/common.py; the JSON records
which). ``--timing sustained`` is ``gpu`` with every call first run back to back for
``--heat-ms`` (default 50) ms, so that the timed calls see the power-limited clocks of a GPU
under sustained load, as in training, rather than the higher clocks of a GPU coming from idle
(NOTE [sustained timing] in benchmarks/common.py); the DESIGN.md §6 targets are stated for
``gpu``.

NOTE [pipeline floor]: where a row misses the floor, how far is it from what its schedule can
reach? Our AG+GEMM and GEMM+RS cut the GEMM into one chunk per rank (M / tp rows, the chunked
GEMM's): an AG+GEMM's last chunk can only be multiplied once the last shard has landed, and a
GEMM+RS's first transfer can only start once its chunk is computed, and the op ends with the
transfers and the reduction. With ``T_comm_ours``, our runtime's own collective alone (the
all-gather of the shard; the reduce-scatter of the ``[M, N]`` partial sums in place in a
buffer, pulls and reduction, as a GEMM+RS's GEMMs leave them), neither op beats
``pipeline_floor = max(T_gemm, T_gemm_chunked / tp + T_comm_ours)`` unless its transfers run
faster beside the GEMMs than alone. ``ours/pipe`` in the table: near 1, a row is as fast as a
pipeline of one chunk per rank over our transport gets, and what remains above the floor is
that chunk's GEMM and ``T_comm_ours`` itself (a faster transport, or a GEMM that communicates
from its own epilogue, would be needed); well above 1, the overlap itself loses time.
Variants in pieces (half or quarter chunks) may go below it: a yardstick, not a bound on
every method, and not a target (the DESIGN.md §6 floor is).

NOTE [concurrent floor]: how much of a miss is the hardware's rather than any schedule's?
``T_concurrent`` issues the row's GEMM (whole, and as the chunked GEMMs: the faster counts) and
our transport moving the row's bytes at once on two streams, with no dependency between them
(other data than the GEMM reads or writes): an overlap whose data dependencies cost nothing,
over our copy engines and cuBLASLt. What it loses against the floor is contention alone: the
GEMM's kernels slowed by the copies' NVLink and HBM traffic (power, memory), and the copies
slowed by the GEMM. The bytes moved: an AG+GEMM row's all-gather of the shard (as
``T_comm_ours``); for a GEMM+RS row, our all-gather of an ``[M / tp, N]`` slice of the partial
sums, which sends and receives per rank exactly the bytes the reduce-scatter pulls, without
its reduction. The reduction is left out on purpose: it is an SM kernel, which beside a GEMM
that holds every SM waits for the GEMM's end (measured: our whole reduce-scatter beside the
GEMM, no dependency, ran about as long as one after the other, e.g. proj bf16 TP 4 0.657 ms
against 0.358 + 0.341), so it would measure the SM scheduler, not contention; every
deterministic GEMM+RS pays it on top (about 0.04 ms for proj bf16 TP 4). ``conc/floor`` in the
table: where it exceeds 1.10, no schedule of these cuBLASLt GEMMs beside these copies meets
the DESIGN.md §6 target on that row; ``ours_over_concurrent`` (JSON) is what our schedule (and
a GEMM+RS's reduction) adds to it. A yardstick rather than a strict bound: a schedule that
spreads the transfers differently over the GEMM contends differently, and the all-gather's end
handshake (one small kernel) may wait for an SM until the GEMM's blocks retire, which can add
a few microseconds to it. On the host transport, which has no streams, the two run one after
the other.

Measured on 4xH200 (``--full``, 2026-11-22; TP 4 on all four GPUs, TP 2 on two groups):
``conc/floor`` was at most 1.082 at TP 4 (median 1.029) and 1.102 at TP 2 (median 1.031),
so even an overlap whose dependencies cost nothing sits at the median target. The AG+GEMMs
came within a few percent of it (``ours_over_concurrent`` 0.98-1.05 at TP 4, 0.98-1.03 at
TP 2): their misses are contention. The comm-bound GEMM+RSs did not (TP 4 proj bf16 M 8192
0.447 ms against 0.387, te4096 FP8 0.248 against 0.208): their bytes exist only once the
GEMM has computed them, and the reduction follows (NOTE [gemm_rs pieces] in
csrc/comm/overlap/gemm_rs.cpp), so ``pipeline_floor`` is the nearer yardstick there.

NOTE [host-bound rows]: on GPUs every call's host enqueue time is measured too (the median of
its warm-up calls, max over ranks): ``host`` in the table (the best variant's), and
``host_ms_by_variant`` / ``host_ms_torch`` in the JSON. Where it exceeds the GPU time of the
call, a training step that issues the op eagerly (no CUDA graph) is bound by the host, not by
the GPU, whatever ``--timing gpu`` reports; the summary counts those rows for us and for torch.

Shapes (Llama-3-70B-like, hidden 8192, FFN 28672, GQA QKV 10240):

* quick (default, seconds): M = 8192 at TP = world size: fc1 bf16, qkv fp8 (AG+GEMM), fc2
  bf16, proj fp8 (GEMM+RS), and the bulk rows qkv fp8 (bulk_ag) and fc1 bf16 (bulk_rs);
* ``--full``: fc1, qkv, fc2, proj x M = 8192, 16384 x TP = 2, 4 (those that divide the world
  size, and the world size) x bf16, fp8, plus TE's shapes (AG+GEMM and GEMM+RS with
  K = N = hidden, hidden 8192 and 4096, M = 8192) at each TP size, plus the bulk rows;
* bulk rows (NOTE [bulk rows]): the backward of qkv and fc1, M = 8192, 16384, bf16 and FP8
  side GEMMs. ``--ops`` keeps some ops only (e.g. ``bulk_ag,bulk_rs``).

NOTE [bulk rows]: bulk overlap (issue 6, item 3) runs a collective beside an unrelated GEMM.
In a sequence-parallel layer's backward (qkv or fc1, local N = QKV / tp or 2 FFN / tp):

* ``bulk_ag``: the layer input's shard ``[M / tp, hidden]`` (FP8 rows: per-tensor FP8) is
  gathered for wgrad while dgrad runs: ``[M, N] @ [hidden, N].T -> [M, hidden]``;
* ``bulk_rs``: dgrad's bfloat16 partial sums ``[M, hidden]`` are reduce-scattered while wgrad
  runs: ``[N, M] @ [hidden, M].T -> [N, hidden]`` (FP8 rows: FP8 operands).

The side GEMMs take TN operands as a linear layer's transposed copies are (FP8 needs TN on
Hopper). ``T_gemm`` is the side GEMM alone, ``T_comm`` the NCCL collective alone, ``T_seq``
one then the other, and the "torch" column what plain PyTorch overlaps with: the NCCL
collective issued on a side stream while the GEMM runs on the current one. The DESIGN.md §6
targets are for the AG+GEMM and GEMM+RS rows; the bulk rows have their own summary line.

NOTE [TP below the world size]: a TP size smaller than the world (TP = 2 on 4 GPUs) cuts the
world into contiguous TP groups (ranks [0, 1] and [2, 3]: overlap.comm.tp_subgroup, one
Communicator and one torch.distributed subgroup per group). ALL groups run every op at the
same time, as the TP groups of a data-parallel job do, and each time is the maximum over all
ranks of all groups. On NVLink all-to-all machines the groups use disjoint links.

Without ``--cuda``: the host transport runs the same code with the same rows scaled down to
tiny shapes (M / 256, K and N / 128 rounded up to 16), a CPU smoke run in seconds.

    python -m benchmarks.overlap_ops --launch 4 --cuda --out bench_results [--full]   # GPUs
    python -m benchmarks.overlap_ops --launch 4 --out bench_results [--full]   # host transport

``--launch N`` starts N ranks under mpirun (overlap.launch.mpirun_command: the no-multicast
variables of DESIGN.md §7 included); without it, the script is the per-rank worker. Rank 0
prints progress on stderr and, at the end, the table, a summary line and the paths of the
JSON (``overlap_ops.json``), the table (``overlap_ops.txt``) and the plot
(``overlap_ops.png``, when matplotlib is installed). ``--trace`` (GPUs) adds a GPU timeline
per row of its best variant and torch's op (benchmarks/trace.py): ``traces/<row>.txt``, and
per-call spans and idle times in the JSON (``trace``), to say why a row misses.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import (
    Progress,
    device_barrier,
    format_table,
    max_over_ranks,
    plot_times,
    time_in_passes,
    time_op,
    timing_protocol,
    write_json,
)
from benchmarks.methods import (
    BULK_OPS,
    OPS,
    Case,
    SideGemm,
    Variant,
    select,
    ub_default_variant,
)
from benchmarks.trace import Tracer, row_label
from overlap.comm import Communicator, TorchBootstrap, TransportKind, tp_subgroup
from overlap.gemm import gemm
from overlap.info import summary
from overlap.launch import init_torch_distributed, mpirun_command
from overlap.ops import all_gather_rows, gemm_reduce_scatter_reference
from overlap.quantization import CurrentScalingConfig, QuantizedTensor, make_quantizer

HIDDEN, FFN, QKV = 8192, 28672, 10240  # Llama-3-70B-like (DESIGN.md §6)
SUITE_TOKENS = (8192, 16384)
SUITE_TP = (2, 4)
TE_HIDDEN = (8192, 4096)
DTYPES = ("bf16", "fp8")
QUICK = (
    ("ag_gemm", "fc1", "bf16"),
    ("ag_gemm", "qkv", "fp8"),
    ("gemm_rs", "fc2", "bf16"),
    ("gemm_rs", "proj", "fp8"),
    ("bulk_ag", "qkv", "fp8"),
    ("bulk_rs", "fc1", "bf16"),
)
BULK_LAYERS = ("qkv", "fc1")
TARGET = 1.10  # every row: T_ours <= 1.10 x floor (DESIGN.md §6)
MEDIAN_TARGET = 1.03
HOST_M_DIV, HOST_KN_DIV, HOST_ALIGN = 256, 128, 16

# DESIGN.md §6, second table: TransformerEngine 2.20 userbuffers' best time (ms) and method,
# MEASURED ON 4xH200 by TE's own script (multicast off), TP = 4, M = 8192, K = N = hidden.
# Shown beside the rows of the same op/hidden/dtype at TP = 4, M = 8192 on GPUs, never as a
# time of this run.
TE_TP, TE_TOKENS = 4, 8192
TE_BEST_4XH200 = {
    ("ag_gemm", 8192, "bf16"): (1.48, "ring"),
    ("ag_gemm", 8192, "fp8"): (0.755, "ring"),
    ("gemm_rs", 8192, "bf16"): (1.55, "ring"),
    ("gemm_rs", 8192, "fp8"): (0.81, "ring"),
    ("ag_gemm", 4096, "bf16"): (0.386, "ring"),
    ("ag_gemm", 4096, "fp8"): (0.298, "ring"),
    ("gemm_rs", 4096, "bf16"): (0.416, "ring"),
    ("gemm_rs", 4096, "fp8"): (0.29, "ring"),
}
# The same table's T_gemm and T_comm of TE's run (ms; its T_gemm is the whole GEMM only): TE's
# own floor, so that a row can set our ratio to our floor beside TE's ratio to its floor. The
# absolute times of the two runs differ with the GPUs' clocks (e.g. TE's run timed the 8192^3
# bf16 GEMM at 1.41 ms in one row and 1.57 in another), the ratios much less.
TE_FLOOR_4XH200 = {
    ("ag_gemm", 8192, "bf16"): (1.41, 0.36),
    ("ag_gemm", 8192, "fp8"): (0.78, 0.20),
    ("gemm_rs", 8192, "bf16"): (1.57, 0.36),
    ("gemm_rs", 8192, "fp8"): (0.77, 0.36),
    ("ag_gemm", 4096, "bf16"): (0.37, 0.20),
    ("ag_gemm", 4096, "fp8"): (0.18, 0.11),
    ("gemm_rs", 4096, "bf16"): (0.36, 0.19),
    ("gemm_rs", 4096, "fp8"): (0.19, 0.19),
}
TE_SOURCE = (
    "TransformerEngine 2.20 userbuffers, best method, measured on 4xH200 (NVLink all-to-all) "
    "with TE's own script, TP = 4, M = 8192 (DESIGN.md §6); a reference, not measured by this run"
)


# --- the suite -------------------------------------------------------------------------------


def llama_shape(name: str, m: int, tp: int) -> dict[str, Any]:
    """One DESIGN.md §6 shape: AG+GEMM gives K = hidden and the local N; GEMM+RS the local K."""
    ops = {
        "fc1": ("ag_gemm", HIDDEN, 2 * FFN // tp),
        "qkv": ("ag_gemm", HIDDEN, QKV // tp),
        "fc2": ("gemm_rs", FFN // tp, HIDDEN),
        "proj": ("gemm_rs", HIDDEN // tp, HIDDEN),
    }
    op, k, n = ops[name]
    return {"op": op, "shape": name, "M": m, "K": k, "N": n, "tp": tp}


def bulk_shape(op: str, name: str, m: int, tp: int) -> dict[str, Any]:
    """A bulk row (NOTE [bulk rows]): the backward of layer ``name`` (qkv or fc1): K = hidden
    (the collective's columns), N = the layer's local N shard."""
    n = {"qkv": QKV // tp, "fc1": 2 * FFN // tp}[name]
    return {"op": op, "shape": name, "M": m, "K": HIDDEN, "N": n, "tp": tp}


def suite_shape(op: str, name: str, m: int, tp: int) -> dict[str, Any]:
    """The row of ``op`` for shape ``name`` (a layer of DESIGN.md §6)."""
    return bulk_shape(op, name, m, tp) if op in BULK_OPS else llama_shape(name, m, tp)


def te_shape(op: str, hidden: int, tp: int) -> dict[str, Any]:
    """TE's benchmark shapes: K = N = hidden for both ops (the local GEMM), M = 8192."""
    return {"op": op, "shape": f"te{hidden}", "M": TE_TOKENS, "K": hidden, "N": hidden, "tp": tp}


def suite_tp_sizes(world: int, full: bool) -> list[int]:
    """Quick: the world size. Full: 2 and 4 where they divide the world size, and the world."""
    if not full:
        return [world]
    return sorted({t for t in SUITE_TP if t <= world and world % t == 0} | {world})


def build_suite(
    world: int,
    *,
    full: bool,
    cuda: bool,
    tp_sizes: Sequence[int] | None = None,
    shapes: Sequence[str] | None = None,
    dtypes: Sequence[str] = DTYPES,
    ops: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The rows to run, grouped by TP size: dicts of op, shape, M, K, N, tp, dtype.

    Args:
        world: the number of ranks.
        full: the whole suite (else the quick rows).
        cuda: real shapes (else scaled down for the host transport, see :func:`host_scaled`).
        tp_sizes: TP sizes to run (default :func:`suite_tp_sizes`); each must divide ``world``.
        shapes: keep only these shape names (fc1, qkv, fc2, proj, te8192, te4096).
        dtypes: keep only these dtypes (bf16, fp8).
        ops: keep only these ops (ag_gemm, gemm_rs, bulk_ag, bulk_rs; default all).

    Raises:
        ValueError: a TP size that does not divide ``world``, an unknown dtype, op or shape,
            or a selection that leaves no row.
    """
    tps = list(tp_sizes) if tp_sizes else suite_tp_sizes(world, full)
    bad = [t for t in tps if t < 1 or world % t]
    if bad:
        raise ValueError(f"TP sizes {bad} do not divide the world size {world}")
    unknown = sorted(set(dtypes) - set(DTYPES)) + sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise ValueError(f"unknown dtypes or ops {unknown}; dtypes: {DTYPES}, ops: {OPS}")
    rows = []
    for tp in tps:
        if full:
            for m in SUITE_TOKENS:
                for name in ("fc1", "qkv", "fc2", "proj"):
                    rows += [{**llama_shape(name, m, tp), "dtype": d} for d in DTYPES]
            for hidden in TE_HIDDEN:
                for op in ("ag_gemm", "gemm_rs"):
                    rows += [{**te_shape(op, hidden, tp), "dtype": d} for d in DTYPES]
            for m in SUITE_TOKENS:
                for name in BULK_LAYERS:
                    for op in BULK_OPS:
                        rows += [{**bulk_shape(op, name, m, tp), "dtype": d} for d in DTYPES]
        else:
            rows += [
                {**suite_shape(op, name, SUITE_TOKENS[0], tp), "dtype": d} for op, name, d in QUICK
            ]
    if ops:
        rows = [r for r in rows if r["op"] in ops]
    known = {r["shape"] for r in rows}
    if shapes:
        missing = sorted(set(shapes) - known)
        if missing:
            raise ValueError(f"unknown shapes {missing} in this suite; shapes: {sorted(known)}")
        rows = [r for r in rows if r["shape"] in shapes]
    rows = [r for r in rows if r["dtype"] in dtypes]
    if not rows:
        raise ValueError("the selection (--shapes / --dtypes / --tp) leaves no row")
    return rows if cuda else [host_scaled(r) for r in rows]


def host_scaled(row: dict[str, Any]) -> dict[str, Any]:
    """The row's tiny twin for the host transport (a float64 reference GEMM on the CPU):
    M / 256 (rounded up to a multiple of tp), K and N / 128 (rounded up to multiples of 16,
    as FP8 GEMMs need)."""

    def up(v: int, to: int) -> int:
        return max(to, -(-v // to) * to)

    return {
        **row,
        "M": up(row["M"] // HOST_M_DIV, row["tp"]),
        "K": up(row["K"] // HOST_KN_DIV, HOST_ALIGN),
        "N": up(row["N"] // HOST_KN_DIV, HOST_ALIGN),
    }


def _te_key(row: dict[str, Any], cuda: bool) -> tuple[str, int, str] | None:
    """The DESIGN.md §6 TE-table key of a row that matches it: a GPU row at TP = 4, M = 8192
    of the TE shapes (K = N = hidden); None for every other row."""
    if not cuda or row["tp"] != TE_TP or row["M"] != TE_TOKENS or row["K"] != row["N"]:
        return None
    if row["shape"] != f"te{row['K']}":
        return None
    key = (row["op"], row["K"], row["dtype"])
    return key if key in TE_BEST_4XH200 else None


def te_reference(row: dict[str, Any], cuda: bool) -> tuple[float, str] | None:
    """(TE best ms measured on 4xH200, its method) for a row that matches DESIGN.md §6's TE
    table: a GPU row at TP = 4, M = 8192 of the TE shapes (K = N = hidden), same dtype."""
    key = _te_key(row, cuda)
    return TE_BEST_4XH200[key] if key else None


def te_floor_reference(row: dict[str, Any], cuda: bool) -> float | None:
    """TE's floor, max(T_gemm, T_comm) of TE's own run (DESIGN.md §6), for the rows that have
    a :func:`te_reference`; None for the others."""
    key = _te_key(row, cuda)
    return max(TE_FLOOR_4XH200[key]) if key else None


# --- one row ---------------------------------------------------------------------------------


def operand(
    x: torch.Tensor, fp8: bool, amax_group: object = None
) -> torch.Tensor | QuantizedTensor:
    """``x`` as it enters the op: bf16, or per-tensor FP8 (current scaling; with an
    ``amax_group`` all its ranks share one scale, as sequence-parallel shards do)."""
    if not fp8:
        return x
    quantizer = make_quantizer(CurrentScalingConfig(), columnwise=False)
    return quantizer.quantize(x, amax_group=amax_group)


def data_of(x: torch.Tensor | QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(x, QuantizedTensor):
        return x.rowwise_data, x.rowwise_scale_inv
    return x, None


def gemm_calls(a, w, tp: int) -> dict[str, Callable[[], object]]:
    """The whole GEMM ``a @ w.T`` (``T_gemm_whole``) and the same as ``tp`` row chunks into one
    output (``T_gemm_chunked``)."""
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    out = torch.empty((ad.shape[0], wd.shape[0]), dtype=torch.bfloat16, device=ad.device)
    kw = {"transb": True, "a_scale_inv": asi, "b_scale_inv": wsi, "out": out}
    m = ad.shape[0] // tp

    def chunked() -> None:
        for j in range(tp):
            gemm(ad[j * m : (j + 1) * m], wd, row_offset=j * m, **kw)

    return {"T_gemm_whole": lambda: gemm(ad, wd, **kw), "T_gemm_chunked": chunked}


def sequential_ag_gemm(a, w, group: Any, out: torch.Tensor) -> torch.Tensor:
    """T_seq of AG+GEMM: the all-gather (NCCL / gloo), then one GEMM. The shards share one
    scale_inv (quantized with the group's amax), so unlike the reference op this needs no
    check of the gathered scales (a host synchronisation)."""
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    gathered = all_gather_rows(ad, group)
    return gemm(gathered, wd, transb=True, a_scale_inv=asi, b_scale_inv=wsi, out=out)


def side_gemm_call(side: SideGemm) -> Callable[[], object]:
    """The bulk row's GEMM alone: ``side.out = side.a @ side.b.T``."""
    ad, asi = data_of(side.a)
    bd, bsi = data_of(side.b)
    return lambda: gemm(ad, bd, transb=True, a_scale_inv=asi, b_scale_inv=bsi, out=side.out)


def side_stream_overlap(
    collective: Callable[[], object], side_gemm: Callable[[], object]
) -> Callable[[], None]:
    """What plain PyTorch overlaps a bulk row with: the (NCCL) collective issued on a side
    stream that waits for the current one, the GEMM on the current stream, then joined."""
    side = torch.cuda.Stream()

    def run() -> None:
        current = torch.cuda.current_stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            collective()
        side_gemm()
        current.wait_stream(side)

    return run


def concurrently(
    collective: Callable[[], object], gemm_call: Callable[[], object], cuda: bool
) -> Callable[[], None]:
    """``collective`` and ``gemm_call`` with no dependency between them (NOTE [concurrent
    floor]): on a side stream beside the current one on GPUs, one after the other on the
    host transport."""
    if cuda:
        return side_stream_overlap(collective, gemm_call)

    def run() -> None:
        collective()
        gemm_call()

    return run


def torch_async_tp(op: str, a, w, group_name: str) -> tuple[str, Callable[[], object]]:
    """(name, call) of torch's fused op for this row; the caller reports "n/a" when it
    raises (a missing op, an unsupported dtype or layout, symmetric memory unavailable)."""
    sm = torch.ops.symm_mem
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    fp8 = asi is not None
    if op == "ag_gemm":
        if fp8:
            return "fused_all_gather_scaled_matmul", lambda: sm.fused_all_gather_scaled_matmul(
                ad, [wd.t()], asi, [wsi], 0, group_name, [None], [None], [torch.bfloat16], [True]
            )
        # Without return_A (where torch has it) torch does not copy the gathered input out;
        # nor do our AG+GEMM variants (keep_gathered=False, the op's default).
        schema = sm.fused_all_gather_matmul.default._schema
        has_return_a = any(arg.name == "return_A" for arg in schema.arguments)
        kw = {"return_A": False} if has_return_a else {}
        return "fused_all_gather_matmul", lambda: sm.fused_all_gather_matmul(
            ad, [wd.t()], 0, group_name, **kw
        )
    if fp8:
        shape = [ad.shape[0], wd.shape[0]]
        return "fused_scaled_matmul_reduce_scatter", lambda: sm.fused_scaled_matmul_reduce_scatter(
            ad, wd.t(), asi, wsi, "sum", 0, 0, group_name, shape, None, None, torch.bfloat16, True
        )
    return "fused_matmul_reduce_scatter", lambda: sm.fused_matmul_reduce_scatter(
        ad, wd.t(), "sum", 0, group_name
    )


def first_error(error: str | None) -> str | None:
    """COLLECTIVE over the world: the lowest rank's error, or None when every rank is fine
    (so that every rank skips, or times, a variant together)."""
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None), None)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def build_variants(
    case: Case, variants: Sequence[Variant]
) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """(call by variant name, error by variant name) of the variants that apply to ``case``.

    A variant whose builder raises on any rank is reported with the error and skipped by all
    ranks; the objects the builders keep live until ``case.release()``."""
    calls: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    for v in variants:
        if not v.applies(case):
            continue
        run, error = None, None
        try:
            run = v.make(case)
        except Exception as exc:  # reported as n/a (after every rank agreed)
            error = _describe(exc)
        error = first_error(error)
        if error is not None:
            errors[v.name] = error
            continue
        calls[v.name] = run
    return calls, errors


@dataclass(frozen=True)
class RowRun:
    """What every row runs with: the TP group (communicator and ProcessGroup), the variants,
    the transport and the timer (``timer(call, host)``: ms of a callable, max over ranks; on
    GPUs it appends the host's enqueue ms per call, max over ranks, to the list ``host``)."""

    comm: Communicator
    group: Any
    variants: Sequence[Variant]
    cuda: bool
    timer: Callable[[Callable[[], object], list[float]], float]
    passes: int = 1
    tracer: Tracer | None = None


def bench_row(
    row: dict[str, Any],
    comm: Communicator,
    group: Any,
    variants: Sequence[Variant],
    *,
    cuda: bool,
    timer: Callable[[Callable[[], object], list[float]], float],
    passes: int = 1,
    tracer: Tracer | None = None,
) -> dict[str, Any]:
    """Every time of one row (COLLECTIVE over the world: all TP groups run it at once), each
    the median over ``passes`` passes (NOTE [timing passes]); with a ``tracer``, the GPU
    timelines of the best variant and torch's op as well (``row["trace"]``)."""
    run = RowRun(comm, group, variants, cuda, timer, passes, tracer)
    times = _bench_bulk_row if row["op"] in BULK_OPS else _bench_overlap_row
    out = times(dict(row), run, *_row_inputs(cuda))
    out["default_variant"] = ub_default_variant(row["op"], row["shape"], comm.group.size)
    return add_metrics(out)


def _bench_overlap_row(
    out: dict[str, Any], run: RowRun, device: torch.device, randn: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    """The times of an AG+GEMM or GEMM+RS row, added to ``out`` (the row)."""
    comm, group, cuda = run.comm, run.group, run.cuda
    tp, fp8, m_all, k, n = _row_shape(out, comm)
    w = operand(randn(n, k) * 0.05, fp8)
    if out["op"] == "ag_gemm":
        a = operand(randn(m_all // tp, k), fp8, amax_group=group)
        calls = gemm_calls(operand(randn(m_all, k), fp8), w, tp)
        calls["T_comm"] = lambda: all_gather_rows(data_of(a)[0], group)
        y = torch.empty((m_all, n), dtype=torch.bfloat16, device=device)
        y_seq = torch.empty_like(y)
        calls["T_seq"] = lambda: sequential_ag_gemm(a, w, group, y_seq)
    else:
        a = operand(randn(m_all, k), fp8)
        calls = gemm_calls(a, w, tp)
        partial = randn(m_all, n)
        y = torch.empty((m_all // tp, n), dtype=torch.bfloat16, device=device)
        if cuda:
            calls["T_comm"] = lambda: dist.reduce_scatter_tensor(y, partial, group=group)
        else:  # gloo has no reduce-scatter: the all-gather the exact reference sums after
            calls["T_comm"] = lambda: all_gather_rows(partial.unsqueeze(0), group)
        calls["T_seq"] = lambda: gemm_reduce_scatter_reference(a, w, group=group, exact=not cuda)
    torch_call = None
    if not cuda:
        out["torch_error"] = "needs CUDA symmetric memory (host transport)"
    else:
        try:
            out["torch_op"], torch_call = torch_async_tp(out["op"], a, w, group.group_name)
            torch_call()  # raises here where torch's op does not apply
        except Exception as exc:  # any failure of torch's op is reported as n/a
            out["torch_error"], torch_call = _describe(exc), None
    case = Case(out["op"], comm, m_all, k, n, a, w, y, fp8, cuda, group=group)
    if out["op"] == "ag_gemm":
        calls["T_comm_ours"] = moved = _our_all_gather(case, data_of(a)[0])
    else:
        calls["T_comm_ours"] = _our_reduce_scatter(case, partial)
        # NOTE [concurrent floor]: the bytes the reduce-scatter pulls, without its reduction
        moved = _our_all_gather(case, partial[: m_all // tp], key="moved")
    for form in ("whole", "chunked"):  # NOTE [concurrent floor]
        calls[f"T_concurrent_{form}"] = concurrently(moved, calls[f"T_gemm_{form}"], cuda)
    _time_row(out, run, case, calls, torch_call)
    out["T_gemm"] = min(out["T_gemm_whole"], out["T_gemm_chunked"])
    out["T_concurrent"] = min(out["T_concurrent_whole"], out["T_concurrent_chunked"])
    te = te_reference(out, cuda)
    out["T_te_ref"], out["te_ref_method"] = te if te else (None, None)
    out["te_ref_floor"] = te_floor_reference(out, cuda)
    return out


def _our_all_gather(
    case: Case, shard: torch.Tensor, key: str = "comm_ours"
) -> Callable[[], object]:
    """Our runtime's all-gather of ``shard`` alone (NOTE [pipeline floor]), on a buffer of its
    own (``case.keep`` under ``key``) that lives as long as the row's variants (COLLECTIVE)."""
    buf = case.keep((key,), lambda: case.comm.create_buffer(shard.nbytes * case.tp))
    return lambda: buf.all_gather_into([(shard, 0)])


def _our_reduce_scatter(case: Case, partial: torch.Tensor) -> Callable[[], object]:
    """Our runtime's reduce-scatter alone (NOTE [pipeline floor]) of ``partial`` ``[M, N]``,
    in place in a buffer of its own, where a GEMM+RS's GEMMs leave their partial sums."""
    buf = case.keep(("comm_ours",), lambda: case.comm.create_buffer(partial.nbytes))
    sums = buf.view(partial.dtype, partial.shape)
    sums.copy_(partial)
    out = partial.new_empty((partial.shape[0] // case.tp, *partial.shape[1:]))
    buf.barrier()  # every rank's partial sums are in place before a peer reads them
    return lambda: buf.reduce_scatter(sums, out)


def _time_row(
    out: dict[str, Any],
    run: RowRun,
    case: Case,
    calls: dict[str, Callable[[], object]],
    torch_call: Callable[[], object] | None,
) -> None:
    """Builds the row's variants, then times ``calls`` (into ``out`` under their names), every
    variant (``T_ours_by_variant``) and ``torch_call`` (``T_torch``; None: not timed) in
    passes (NOTE [timing passes]; each pass's times in ``pass_times``), with the host's
    enqueue time per call of each variant and of torch's op where the timer measures it
    (``host_ms_by_variant``, ``host_ms_torch``: medians over the passes); with the run's
    tracer, traces the fastest variant and ``torch_call`` (``trace``); releases the case's
    objects."""
    try:
        built, out["variant_errors"] = build_variants(case, run.variants)
        timed = {**calls, **{f"variant {name}": call for name, call in built.items()}}
        if torch_call is not None:
            timed["T_torch"] = torch_call
        out["pass_times"] = {}
        host: dict[str, list[float]] = {name: [] for name in timed}
        times = time_in_passes(
            {name: name for name in timed},  # the timer looks the call up by its name
            lambda name: run.timer(timed[name], host[name]),
            run.passes,
            out["pass_times"],
        )
        if run.tracer is not None:
            traced = {}
            if built:
                best = min(built, key=lambda name: times[f"variant {name}"])
                traced[f"ours {best}"] = built[best]
            if torch_call is not None:
                traced[f"torch {out['torch_op']}"] = torch_call
            out["trace"] = run.tracer.record(row_label(out), traced)
    finally:
        case.release()
    out.update({name: times[name] for name in calls})
    out["T_ours_by_variant"] = {name: times[f"variant {name}"] for name in built}
    out["T_torch"] = times.get("T_torch")
    med = {name: statistics.median(ms) for name, ms in host.items() if ms}
    out["host_ms_by_variant"] = {
        name: med[f"variant {name}"] for name in built if f"variant {name}" in med
    }
    out["host_ms_torch"] = med.get("T_torch")


def _row_shape(row: dict[str, Any], comm: Communicator) -> tuple[int, bool, int, int, int]:
    """(tp, fp8, M, K, N) of a row."""
    return comm.group.size, row["dtype"] == "fp8", row["M"], row["K"], row["N"]


def _row_inputs(cuda: bool) -> tuple[torch.device, Callable[..., torch.Tensor]]:
    """(device, randn) for one row: ``randn(*shape)`` gives bfloat16 normal values from a
    generator seeded per rank (every row starts from the same seed)."""
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    return device, randn


def _bench_bulk_row(
    out: dict[str, Any], run: RowRun, device: torch.device, randn: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    """The times of a bulk row (NOTE [bulk rows]), added to ``out`` (the row)."""
    comm, group, cuda = run.comm, run.group, run.cuda
    tp, fp8, m_all, k, n = _row_shape(out, comm)
    y = None
    if out["op"] == "bulk_ag":  # gather wgrad's input while dgrad runs
        a = operand(randn(m_all // tp, k), fp8, amax_group=group)
        side = SideGemm(
            operand(randn(m_all, n), fp8),
            operand(randn(k, n) * 0.05, fp8),
            torch.empty((m_all, k), dtype=torch.bfloat16, device=device),
        )

        def collective() -> object:
            return all_gather_rows(data_of(a)[0], group)

    else:  # reduce-scatter dgrad's partial sums while wgrad runs
        a = randn(m_all, k)
        y = torch.empty((m_all // tp, k), dtype=torch.bfloat16, device=device)
        side = SideGemm(
            operand(randn(n, m_all), fp8),
            operand(randn(k, m_all) * 0.05, fp8),
            torch.empty((n, k), dtype=torch.bfloat16, device=device),
        )

        def collective() -> object:
            if cuda:
                return dist.reduce_scatter_tensor(y, a, group=group)
            return all_gather_rows(a.unsqueeze(0), group)  # gloo has no reduce-scatter

    side_gemm = side_gemm_call(side)

    def sequential() -> None:
        collective()
        side_gemm()

    calls = {"T_gemm": side_gemm, "T_comm": collective, "T_seq": sequential}
    torch_call = None
    if cuda:
        out["torch_op"] = "nccl_side_stream"
        torch_call = side_stream_overlap(collective, side_gemm)
    else:
        out["torch_error"] = "the NCCL side-stream baseline needs CUDA"
    case = Case(out["op"], comm, m_all, k, n, a, None, y, fp8, cuda, group=group, side=side)
    _time_row(out, run, case, calls, torch_call)
    out["T_gemm_whole"], out["T_gemm_chunked"] = out["T_gemm"], None
    out["T_te_ref"], out["te_ref_method"], out["te_ref_floor"] = None, None, None
    return out


def add_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """Adds the best variant and the ratios to a row with T_gemm, T_comm, T_seq,
    T_ours_by_variant, T_torch, T_te_ref and te_ref_floor (None where absent), and the time
    of initialize_ub's default for the row where ``default_variant`` names a timed variant
    (NOTE [default variant] in benchmarks/methods.py)."""
    variants = row["T_ours_by_variant"]
    best = min(variants, key=variants.get) if variants else None
    row["best_variant"] = best
    row["T_ours"] = variants[best] if best else None
    row["host_ms"] = (row.get("host_ms_by_variant") or {}).get(best)
    row["floor"] = floor = max(row["T_gemm"], row["T_comm"])
    ours = row["T_ours"]
    gain = row["T_seq"] - row["T_gemm"]

    def ratio(other: float | None) -> float | None:
        return ours / other if ours is not None and other else None

    row["ours_over_floor"] = ratio(floor)
    row["efficiency"] = 1 - (ours - row["T_gemm"]) / gain if ours is not None and gain > 0 else None
    row["vs_torch"] = ratio(row.get("T_torch"))
    row["vs_te"] = ratio(row.get("T_te_ref"))
    te, te_floor = row.get("T_te_ref"), row.get("te_ref_floor")
    row["te_ref_over_floor"] = te / te_floor if te and te_floor else None
    # NOTE [pipeline floor]
    comm_ours, chunked, tp = row.get("T_comm_ours"), row.get("T_gemm_chunked"), row.get("tp")
    pipe = max(row["T_gemm"], chunked / tp + comm_ours) if comm_ours and chunked and tp else None
    row["pipeline_floor"] = pipe
    row["ours_over_pipeline_floor"] = ratio(pipe)
    conc = row.get("T_concurrent")  # NOTE [concurrent floor]
    row["concurrent_over_floor"] = conc / floor if conc else None
    row["ours_over_concurrent"] = ratio(conc)
    row["T_default"] = variants.get(row.get("default_variant") or "")
    row["default_over_floor"] = row["T_default"] / floor if row["T_default"] is not None else None
    return row


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts against the DESIGN.md §6 targets (of whichever rows are given: the AG+GEMM and
    GEMM+RS rows, or the bulk rows apart)."""
    ratios = [r["ours_over_floor"] for r in rows if r.get("ours_over_floor") is not None]
    defaults = [r["default_over_floor"] for r in rows if r.get("default_over_floor") is not None]
    torch_rows = [r for r in rows if r.get("vs_torch") is not None]
    te_rows = [r for r in rows if r.get("vs_te") is not None]
    te_ratio_rows = [
        r
        for r in rows
        if r.get("te_ref_over_floor") is not None and r.get("ours_over_floor") is not None
    ]
    concurrent = [
        r["concurrent_over_floor"] for r in rows if r.get("concurrent_over_floor") is not None
    ]
    host_rows = [r for r in rows if r.get("host_ms") is not None and r["T_ours"] is not None]
    torch_host = [
        r for r in rows if r.get("host_ms_torch") is not None and r.get("T_torch") is not None
    ]
    return {
        "rows": len(rows),
        "rows_timed": len(ratios),
        "target": TARGET,
        "median_target": MEDIAN_TARGET,
        "rows_within_target": sum(x <= TARGET for x in ratios),
        "median_ours_over_floor": statistics.median(ratios) if ratios else None,
        "worst_ours_over_floor": max(ratios) if ratios else None,
        # NOTE [default variant]: the same counts for initialize_ub's default of each row
        **_target_counts("default", defaults),
        # NOTE [concurrent floor]: the GEMM beside our copies of its bytes, no dependency
        **_target_counts("concurrent", concurrent),
        "rows_with_torch": len(torch_rows),
        "rows_faster_than_torch": sum(r["vs_torch"] < 1 for r in torch_rows),
        "rows_with_te_ref": len(te_rows),
        "rows_faster_than_te_ref": sum(r["vs_te"] < 1 for r in te_rows),
        "rows_with_te_ref_ratio": len(te_ratio_rows),
        "rows_nearer_floor_than_te_ref": sum(
            r["ours_over_floor"] < r["te_ref_over_floor"] for r in te_ratio_rows
        ),
        # NOTE [host-bound rows]: enqueueing a call takes the host longer than the GPU's time
        "rows_with_host_time": len(host_rows),
        "rows_host_bound": sum(r["host_ms"] > r["T_ours"] for r in host_rows),
        "rows_with_torch_host_time": len(torch_host),
        "rows_torch_host_bound": sum(r["host_ms_torch"] > r["T_torch"] for r in torch_host),
    }


def _target_counts(name: str, ratios: Sequence[float]) -> dict[str, Any]:
    """``rows_with_<name>``, ``rows_<name>_within_target``, ``median_<name>_over_floor`` and
    ``worst_<name>_over_floor`` of ``ratios`` (times over the floor)."""
    return {
        f"rows_with_{name}": len(ratios),
        f"rows_{name}_within_target": sum(x <= TARGET for x in ratios),
        f"median_{name}_over_floor": statistics.median(ratios) if ratios else None,
        f"worst_{name}_over_floor": max(ratios) if ratios else None,
    }


def _target_counts_text(s: dict[str, Any], name: str, label: str) -> str:
    """``_target_counts(name, ...)`` of the summary ``s`` as one clause (empty without rows)."""
    if not s.get(f"rows_with_{name}"):
        return ""
    return (
        f"; {label}: {s[f'rows_{name}_within_target']}/{s[f'rows_with_{name}']} <= "
        f"{s['target']:.2f} x floor, median {s[f'median_{name}_over_floor']:.3f}, worst "
        f"{s[f'worst_{name}_over_floor']:.3f}"
    )


def summary_line(s: dict[str, Any], *, bulk: bool = False) -> str:
    """The summary of :func:`summarize` in one line (``bulk``: of the bulk rows, whose torch
    column is NCCL on a side stream and which have no TE reference)."""
    median = s["median_ours_over_floor"]
    worst = s["worst_ours_over_floor"]
    line = (
        f"rows <= {s['target']:.2f} x floor: {s['rows_within_target']}/{s['rows']}; median "
        f"ours/floor {'-' if median is None else f'{median:.3f}'} (target <= "
        f"{s['median_target']:.2f}), worst {'-' if worst is None else f'{worst:.3f}'}; faster "
    )
    if bulk:
        line += f"than NCCL on a side stream: {s['rows_faster_than_torch']}/{s['rows_with_torch']}"
    else:
        line += (
            f"than torch async-TP: {s['rows_faster_than_torch']}/{s['rows_with_torch']}; "
            f"faster than TE best (4xH200 reference): "
            f"{s['rows_faster_than_te_ref']}/{s['rows_with_te_ref']}"
        )
        if s.get("rows_with_te_ref_ratio"):
            line += (
                f" (nearer our floor than TE to its own: {s['rows_nearer_floor_than_te_ref']}/"
                f"{s['rows_with_te_ref_ratio']})"
            )
    line += _target_counts_text(s, "default", "initialize_ub's defaults")  # NOTE [default variant]
    line += _target_counts_text(  # NOTE [concurrent floor]
        s, "concurrent", "GEMM beside our copies of its bytes, no dependencies"
    )
    if s.get("rows_with_host_time"):  # NOTE [host-bound rows]
        other = "NCCL" if bulk else "torch"
        line += (
            f"; host-bound (enqueue > GPU time): ours {s['rows_host_bound']}/"
            f"{s['rows_with_host_time']}, {other} {s['rows_torch_host_bound']}/"
            f"{s['rows_with_torch_host_time']}"
        )
    return line


def split_rows(
    rows: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(AG+GEMM and GEMM+RS rows, bulk rows)."""
    return [r for r in rows if r["op"] not in BULK_OPS], [r for r in rows if r["op"] in BULK_OPS]


TABLE_COLUMNS = [
    ("op", "op"),
    ("shape", "shape"),
    ("M", "M"),
    ("K", "K"),
    ("N", "N"),
    ("tp", "tp"),
    ("dtype", "dtype"),
    ("T_gemm", "T_gemm"),
    ("T_comm", "T_comm"),
    ("T_seq", "T_seq"),
    ("torch", "torch"),
    ("T_ours", "T_ours"),
    ("host_ms", "host"),
    ("best_variant", "best variant"),
    ("ours_over_floor", "ours/floor"),
    ("default_over_floor", "default/floor"),
    ("ours_over_pipeline_floor", "ours/pipe"),
    ("concurrent_over_floor", "conc/floor"),
    ("efficiency", "eff"),
    ("vs_torch", "vs torch"),
    ("T_te_ref", "TE*"),
    ("vs_te", "vs TE*"),
    ("te_ref_over_floor", "TE*/floor*"),
]


def table_text(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The readable table with its header and footnotes, and the summary line."""
    shown = [
        {
            **r,
            "torch": r["T_torch"] if r["T_torch"] is not None else "n/a",
            "T_ours": r["T_ours"] if r["T_ours"] is not None else "n/a",
        }
        for r in rows
    ]
    timing = meta["timing"]
    lines = [
        f"comm-GEMM overlap on {meta['world_size']} ranks ({meta['transport']} transport, "
        f"{meta.get('gpu') or 'CPU'}), ms: median of {timing['iters']} after "
        f"{timing['warmup']} warm-up, max over ranks, timing mode {timing['mode']!r}, median of "
        f"{timing.get('passes', 1)} passes",
        "floor = max(T_gemm, T_comm); eff = 1 - (T_ours - T_gemm) / (T_seq - T_gemm); "
        "vs X = T_ours / T_X (< 1: ours faster); torch = torch async-TP (n/a: see JSON); "
        "host = the host's time to enqueue one call of the best variant (GPUs); "
        "default = the variant initialize_ub() configures by default (JSON: default_variant); "
        "pipe = max(T_gemm, T_gemm_chunked / tp + our collective alone), what a pipeline of "
        "one chunk per rank over our transport can reach (NOTE [pipeline floor]); "
        "conc = the GEMM and our copies of the row's bytes at once with no dependency, "
        "contention alone (NOTE [concurrent floor]); "
        "bulk rows: T_gemm = the side GEMM, torch = NCCL on a side stream beside it",
        f"TE* = {TE_SOURCE}; TE*/floor* = TE's time over the floor of TE's own run",
        "",
        format_table(shown, TABLE_COLUMNS),
        "",
        *_failure_notes(rows),
    ]
    if meta["summary"]["rows"]:
        lines.append("summary: " + summary_line(meta["summary"]))
    if meta.get("summary_bulk", {}).get("rows"):  # absent: no bulk rows
        lines.append("bulk rows: " + summary_line(meta["summary_bulk"], bulk=True))
    if meta["transport"] == "host":
        lines.append(
            "(host transport: tiny shapes on CPU reference GEMMs; the times say nothing about GPUs)"
        )
    return "\n".join(lines)


def _failure_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per distinct reason why torch's op or one of our variants is n/a."""
    reasons: dict[str, int] = {}
    for r in rows:
        if r.get("torch_error"):
            key = f"torch n/a: {r['torch_error']}"
            reasons[key] = reasons.get(key, 0) + 1
        for name, error in r.get("variant_errors", {}).items():
            key = f"{r['op']}:{name} n/a: {error}"
            reasons[key] = reasons.get(key, 0) + 1
    return [f"{reason} ({n} rows)" for reason, n in reasons.items()]


def enable_torch_symm_mem(group: Any) -> None:
    """Older torch needs this before its fused ops; newer torch deprecates it (no-op)."""
    import warnings

    try:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
    except Exception as exc:  # torch's async-TP is then reported as n/a
        print(f"[overlap_ops] torch symmetric memory unavailable: {exc}", flush=True)


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overlap_ops", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="directory of the outputs")
    parser.add_argument("--cuda", action="store_true", help="cuda transport (else host)")
    parser.add_argument(
        "--full", action="store_true", help="the whole DESIGN.md §6 suite and TE's shapes"
    )
    parser.add_argument("--tp", default=None, help="TP sizes, e.g. 2,4 (default: see --help)")
    parser.add_argument("--shapes", default=None, help="only these shapes, e.g. fc1,te8192")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="bf16,fp8 or one of them")
    parser.add_argument(
        "--ops", default=None, help=f"only these ops (comma list of {','.join(OPS)}; default all)"
    )
    parser.add_argument(
        "--methods", default=None, help="fnmatch patterns of variants, e.g. 'gemm_rs:*lanes1*'"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        default=None,
        help="modules to import first (comma list): their methods.register() calls add methods",
    )
    parser.add_argument("--iters", type=int, default=None, help="default: 20 (cuda), 3 (host)")
    parser.add_argument("--warmup", type=int, default=None, help="default: 5 (cuda), 1 (host)")
    parser.add_argument(
        "--timing",
        choices=("e2e", "gpu", "sustained"),
        default="gpu",
        help="gpu (default): ranks aligned by a device-side barrier, each call queued behind a "
        "GPU spin (the GPU's time alone); e2e: CUDA events on an idle GPU, host enqueueing "
        "included where it is longer than the GPU's start; sustained: gpu, each call first run "
        "back to back for --heat-ms (the clocks of a GPU under sustained load)",
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
    parser.add_argument(
        "--trace",
        action="store_true",
        help="after timing each row, record GPU timelines (torch.profiler / CUPTI) of its best "
        "variant and torch's op, 3 calls each, every rank on one axis: OUT/traces/<row>.txt "
        "(needs --cuda)",
    )
    parser.add_argument("--launch", type=int, default=0, help="start N ranks under mpirun")
    args = parser.parse_args(argv)
    if args.trace and not args.cuda:
        parser.error("--trace records GPU timelines (CUPTI): it needs --cuda")
    if args.timing == "sustained" and not args.cuda:
        parser.error("--timing sustained heats GPUs: it needs --cuda")
    if not 0 < args.heat_ms <= 10_000:
        parser.error(f"--heat-ms must be in (0, 10000], got {args.heat_ms}")
    args.iters = args.iters or (20 if args.cuda else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if args.cuda else 1)
    args.passes = args.passes or (2 if args.cuda else 1)
    if args.iters < 1 or args.warmup < 0 or args.passes < 1:
        parser.error("--iters and --passes must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.launch:
        worker_argv = [a for i, a in enumerate(argv) if not _is_launch_arg(argv, i)]
        cmd = mpirun_command(
            args.launch,
            [sys.executable, "-u", "-m", "benchmarks.overlap_ops", *worker_argv],
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            tag_output=False,
        )
        return subprocess.call(cmd, env=os.environ.copy())
    launch = init_torch_distributed("nccl" if args.cuda else "gloo")
    t0 = time.time()
    rank0 = launch.rank == 0
    try:  # argument errors: on every rank alike, before any communication
        rows = build_suite(
            launch.world_size,
            full=args.full,
            cuda=args.cuda,
            tp_sizes=[int(t) for t in _csv(args.tp)] or None,
            shapes=_csv(args.shapes) or None,
            dtypes=_csv(args.dtypes),
            ops=_csv(args.ops) or None,
        )
        for module in _csv(args.imports):
            importlib.import_module(module)
        variants = select(_csv(args.methods))
    except (ValueError, ImportError) as exc:
        if rank0:
            print(f"[overlap_ops] error: {exc}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    queued = args.cuda and args.timing in ("gpu", "sustained")
    heat_ms = args.heat_ms if args.cuda and args.timing == "sustained" else 0.0
    # All TP groups run every row at once (NOTE [TP below the world size]): align the world.
    align = device_barrier() if queued else None

    def timer(fn: Callable[[], object], host: list[float]) -> float:
        enqueue: list[float] = []
        ms = time_op(
            fn,
            cuda=args.cuda,
            warmup=args.warmup,
            iters=args.iters,
            queued=queued,
            align=align,
            host_ms=enqueue,
            heat_ms=heat_ms,
            agree=lambda n: int(max_over_ranks(n)),
        )
        if args.cuda:  # NOTE [host-bound rows]; the host transport's calls are synchronous
            host.append(max_over_ranks(enqueue[0]))
        return max_over_ranks(ms)

    tracer = Tracer(args.out, align or device_barrier()) if args.trace else None
    if rank0 and args.cuda and args.iters < 20:
        print(
            f"[overlap_ops] note: --iters {args.iters} < 20, below the DESIGN.md §6 protocol",
            flush=True,
        )
    if rank0:
        tps = sorted({r["tp"] for r in rows})
        print(
            f"[overlap_ops] {len(rows)} rows ({'full' if args.full else 'quick'} suite, TP "
            f"{tps}, {args.iters} iters), {len(variants)} variants registered; progress on "
            f"stderr",
            flush=True,
        )
    progress = Progress(len(rows), "overlap_ops", enabled=rank0)
    kind = TransportKind.CUDA if args.cuda else TransportKind.HOST
    world = TorchBootstrap()
    results = []
    for tp in dict.fromkeys(r["tp"] for r in rows):  # in order, each TP size once
        # NOTE [TP below the world size]: every TP group runs every row at the same time.
        boot = world if tp == world.size else tp_subgroup(world, tp)
        comm = Communicator(boot, kind)
        if args.cuda:
            enable_torch_symm_mem(boot.group)
        try:
            for row in (r for r in rows if r["tp"] == tp):
                res = bench_row(
                    row,
                    comm,
                    boot.group,
                    variants,
                    cuda=args.cuda,
                    timer=timer,
                    passes=args.passes,
                    tracer=tracer,
                )
                results.append(res)
                progress.step(_progress_message(res))
        finally:
            comm.destroy()
    dist.barrier()
    dist.destroy_process_group()
    if not rank0:
        return 0
    meta: dict[str, Any] = {
        "benchmark": "overlap_ops",
        "suite": "full" if args.full else "quick",
        "transport": "cuda" if args.cuda else "host",
        "world_size": launch.world_size,
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name() if args.cuda else None,
        "torch": torch.__version__,
        "overlap_build": summary(),
        "argv": argv,
        "timing": {
            **timing_protocol(
                cuda=args.cuda,
                queued=queued,
                warmup=args.warmup,
                iters=args.iters,
                aligned=queued,
                heat_ms=heat_ms,
            ),
            "passes": args.passes,
            "passes_note": "every time of a row is the median over this many passes, each "
            "timing all of the row's calls once, odd passes in reverse order (NOTE [timing "
            "passes] in benchmarks/common.py)",
        },
        "tp_layout": "TP groups of contiguous ranks; with TP < world size all groups run each "
        "op at the same time and times are the max over all ranks (NOTE [TP below the world "
        "size] in benchmarks/overlap_ops.py)",
        "shapes_note": None
        if args.cuda
        else f"host transport: DESIGN.md §6 rows scaled to M / {HOST_M_DIV}, K and N / "
        f"{HOST_KN_DIV} (rounded up to {HOST_ALIGN})",
        "te_reference": {
            "source": TE_SOURCE,
            "rows": "GPU rows of the TE shapes (te8192, te4096) at TP = 4, M = 8192",
        },
        "definitions": {
            "T_gemm": "min(T_gemm_whole, T_gemm_chunked): the GEMM alone, whole or as tp row "
            "chunks into one output",
            "T_comm": "the collective alone (NCCL all-gather / reduce-scatter on GPUs; gloo "
            "all-gather on the host)",
            "T_seq": "the collective, then the GEMM (no overlap)",
            "T_ours": "the best of T_ours_by_variant (benchmarks/methods.py)",
            "floor": "max(T_gemm, T_comm)",
            "T_default": "T_ours_by_variant of default_variant, the variant running what "
            "initialize_ub() configures by default for the row's GEMM name (NOTE [default "
            "variant] in benchmarks/methods.py); default_over_floor = T_default / floor",
            "efficiency": "1 - (T_ours - T_gemm) / (T_seq - T_gemm)",
            "T_comm_ours": "our runtime's collective alone: the all-gather of the shard, or the "
            "reduce-scatter of the [M, N] partial sums in place in the buffer",
            "pipeline_floor": "max(T_gemm, T_gemm_chunked / tp + T_comm_ours): what a pipeline "
            "of one chunk per rank over our transport can reach (NOTE [pipeline floor] in "
            "benchmarks/overlap_ops.py); ours_over_pipeline_floor = T_ours / pipeline_floor",
            "T_concurrent": "min(T_concurrent_whole, T_concurrent_chunked): the whole or the "
            "chunked GEMM and our transport moving the row's bytes (AG+GEMM: the all-gather of "
            "the shard; GEMM+RS: an all-gather of an [M / tp, N] slice of the partial sums, "
            "the bytes the reduce-scatter pulls, without its reduction) issued at once on two "
            "streams with no dependency between them (one after the other on the host "
            "transport): contention alone (NOTE [concurrent floor] in "
            "benchmarks/overlap_ops.py); concurrent_over_floor = T_concurrent / floor, "
            "ours_over_concurrent = T_ours / T_concurrent",
            "vs_torch": "T_ours / T_torch",
            "vs_te": "T_ours / T_te_ref (a 4xH200 reference, not measured here)",
            "te_ref_floor": "TE's floor in TE's own run: max(its T_gemm, its T_comm) from "
            "DESIGN.md §6 (its T_gemm: the whole GEMM only)",
            "te_ref_over_floor": "T_te_ref / te_ref_floor: TE's ratio to its own floor, to set "
            "beside ours_over_floor (the two runs' absolute times differ with the GPUs' clocks)",
            "bulk rows": "T_gemm: the side GEMM alone; T_comm: the collective alone; T_seq: "
            "one then the other; T_torch: the NCCL collective on a side stream beside the GEMM "
            "(NOTE [bulk rows] in benchmarks/overlap_ops.py)",
        },
        "traces": str(tracer.dir) if tracer is not None else None,
        "methods": [
            {"op": v.op, "name": v.name, "method": v.method, "kwargs": dict(v.kwargs)}
            for v in variants
        ],
    }
    main_rows, bulk_rows = split_rows(results)
    meta["summary"] = summarize(main_rows)
    meta["summary_bulk"] = summarize(bulk_rows)
    meta["seconds"] = time.time() - t0
    json_path = args.out / "overlap_ops.json"
    write_json(json_path, {**meta, "rows": results})
    text = table_text(results, meta)
    table_path = args.out / "overlap_ops.txt"
    table_path.write_text(text + "\n")
    print("\n" + text, flush=True)
    plot = plot_times(
        results,
        ("op", "shape", "M", "tp", "dtype"),
        [
            ("T_seq", "sequential (collective + GEMM)"),
            ("T_torch", "torch async-TP"),
            ("T_te_ref", "TE best (4xH200 reference, DESIGN.md)"),
            ("T_ours", "ours (best variant)"),
        ],
        args.out / "overlap_ops.png",
        f"overlap ops on {launch.world_size} ranks ({meta['transport']}): time / floor "
        f"(dashed: the {TARGET:.2f} target)",
        hatched=("T_te_ref",),
        target=TARGET,
    )
    print(f"\nJSON: {json_path} ({meta['seconds']:.0f} s)\ntable: {table_path}")
    print(f"plot: {plot}" if plot is not None else "plot: none (matplotlib not installed)")
    if tracer is not None:
        print(f"GPU timelines: {tracer.dir}")
    return 0


def _progress_message(r: dict[str, Any]) -> str:
    ours = "n/a" if r["T_ours"] is None else f"{r['T_ours']:.3f} ms"
    ratio = "" if r["ours_over_floor"] is None else f" ({r['ours_over_floor']:.2f}x floor)"
    return f"{r['op']} {r['shape']} M={r['M']} tp={r['tp']} {r['dtype']}: ours {ours}{ratio}"


def _is_launch_arg(argv: list[str], i: int) -> bool:
    """``--launch N`` / ``--launch=N`` (the launcher's own option, not the workers')."""
    return argv[i].startswith("--launch") or (i > 0 and argv[i - 1] == "--launch")


if __name__ == "__main__":
    sys.exit(main())

"""The comm-GEMM overlap ops against their floor (docs/design.md §6), on N ranks under mpirun.

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
  rows that match docs/design.md §6's TransformerEngine table (TP = 4, M = 8192), ``vs TE =
  T_ours / TE best``, where "TE best" is the time MEASURED ON 4xH200, copied from that table
  into benchmarks/data/te_reference.json (a reference column, not measured by this run).

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
(NOTE [sustained timing] in benchmarks/common.py); the docs/design.md §6 targets are stated for
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
every method, and not a target (the docs/design.md §6 floor is).

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
that holds every SM waits for the GEMM's end, so it would measure the SM scheduler, not
contention; every deterministic GEMM+RS pays it on top. ``conc/floor`` in the
table: where it exceeds 1.10, no schedule of these cuBLASLt GEMMs beside these copies meets
the docs/design.md §6 target on that row; ``ours_over_concurrent`` (JSON) is what our schedule (and
a GEMM+RS's reduction) adds to it. A yardstick rather than a strict bound: a schedule that
spreads the transfers differently over the GEMM contends differently, and the all-gather's end
handshake (one small kernel) may wait for an SM until the GEMM's blocks retire, which can add
a few microseconds to it. On the host transport, which has no streams, the two run one after
the other.

Verdict: the AG+GEMMs' misses are contention; the comm-bound GEMM+RSs' bytes exist only once
the GEMM has computed them, and the reduction follows (NOTE [gemm_rs pieces] in
csrc/comm/overlap/gemm_rs.cpp), so ``pipeline_floor`` is the nearer yardstick there. Measured:
docs/performance-log.md [concurrent floor].

NOTE [host-bound rows]: on GPUs every call's host enqueue time is measured too (the median of
its warm-up calls, max over ranks): ``host`` in the table (the best variant's), and
``host_ms_by_variant`` / ``host_ms_torch`` in the JSON. Where it exceeds the GPU time of the
call, a training step that issues the op eagerly (no CUDA graph) is bound by the host, not by
the GPU, whatever ``--timing gpu`` reports; the summary counts those rows for us and for torch.

NOTE [planned column]: on GPUs ``initialize_ub`` plans by shape (NOTE [shape plans] in
overlap/ub/plans.py): the first call of each GEMM shape times the op against the sequential
path, and the faster runs from then on. What a user gets by default for a row is therefore
neither ``T_default`` nor ``T_seq`` but the path that plan picks. Each row runs the plans' own
code (``ShapePlans.choose``, its timing, the maximum over the TP group) among the default
variant, the variants of its alternate settings that ``--methods`` built (NOTE [plan
alternates] in overlap/ub/config.py; ``alternate_variants`` in the JSON) and ``T_seq`` before
the timed passes, and ``T_planned`` is the suite's time of the path it picked (``plan`` in the
JSON holds the plan's own figures). ``planned/floor`` and the
planned rows slower than sequential in the summaries are the figures the issue's "the
defaults" targets mean on GPUs. A plan can pick the slower path where the two are within its
timing noise: the count of planned rows slower than sequential measures that. Verdict: the
suite judges the library's real default, decided by the library's own code.

Shapes (quick and full: Llama-3-70B-like, hidden 8192, FFN 28672, GQA QKV 10240):

* quick (default, seconds): M = 8192 at TP = world size: fc1 bf16, qkv fp8 (AG+GEMM), fc2
  bf16, proj fp8 (GEMM+RS), and the bulk rows qkv fp8 (bulk_ag) and fc1 bf16 (bulk_rs);
* ``--full`` (``--suite full``): fc1, qkv, fc2, proj x M = 8192, 16384 x TP = 2, 4 (those that
  divide the world size, and the world size) x bf16, fp8, plus TE's shapes (AG+GEMM and
  GEMM+RS with K = N = hidden, hidden 8192 and 4096, M = 8192) at each TP size, plus the bulk
  rows;
* bulk rows (NOTE [bulk rows]): the backward of qkv and fc1, M = 8192, 16384, bf16 and FP8
  side GEMMs. ``--ops`` keeps some ops only (e.g. ``bulk_ag,bulk_rs``);
* ``--suite broad`` (NOTE [broad suite] in benchmarks/overlap_suite.py): the four GEMMs of a
  layer (qkv, fc1: AG+GEMM; proj, fc2: GEMM+RS) of eight public model families
  (benchmarks/data/model_families.json, with the source of every dimension: Llama-3.2-1B and
  3B, Qwen2.5-7B, Llama-3.1-8B, Qwen2.5-32B, GPT-NeoX-20B, GPT-3 175B, Llama-3.1-405B;
  hidden 2048-16384, GQA and MHA, SwiGLU and GELU MLPs) x M = 1024, 4096, 16384 (and 32768
  up to hidden 4096) x TP = 2, 4 (as ``--full``) x bf16, fp8: rows named
  ``<family>.<layer>`` with their M. Rows whose dimensions do not split over the TP size or
  are not aligned for their dtype are listed with the reason instead of run. ``--families``
  and ``--tokens`` cut it (``--shapes`` takes ``<family>.<layer>`` names or layer names).
  Its targets (docs/design.md §6.4) are read off the summaries by communication / GEMM ratio
  per TP size (NOTE [ratio summaries] in benchmarks/overlap_report.py), which every suite's
  table and JSON carry.

``--list`` prints the rows a selection runs, those it leaves out and why, and an estimate of
the GPU time on H100s (benchmarks/overlap_estimate.py, a model), without running anything:
cut a suite to the device time there is before starting it.

NOTE [bulk rows]: bulk overlap (issue 6, item 3) runs a collective beside an unrelated GEMM.
In a sequence-parallel layer's backward (qkv or fc1, local N = QKV / tp or 2 FFN / tp):

* ``bulk_ag``: the layer input's shard ``[M / tp, hidden]`` (FP8 rows: per-tensor FP8) is
  gathered for wgrad while dgrad runs: ``[M, N] @ [hidden, N].T -> [M, hidden]``;
* ``bulk_rs``: dgrad's bfloat16 partial sums ``[M, hidden]`` are reduce-scattered while wgrad
  runs: ``[N, M] @ [hidden, M].T -> [N, hidden]`` (FP8 rows: FP8 operands).

The side GEMMs take TN operands as a linear layer's transposed copies are (FP8 needs TN on
Hopper). ``T_gemm`` is the side GEMM alone, ``T_comm`` the NCCL collective alone, ``T_seq``
one then the other, and the "torch" column what plain PyTorch overlaps with: the NCCL
collective issued on a side stream while the GEMM runs on the current one. The docs/design.md §6
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
    python -m benchmarks.overlap_ops --launch 4 --cuda --out bench_results --suite broad \
        --tp 4 --list   # the broad suite's rows at TP 4 and their estimated GPU time

``--launch N`` starts N ranks under mpirun (overlap.launch.mpirun_command: the no-multicast
variables included); without it, the script is the per-rank worker. Rank 0
prints progress on stderr and, at the end, the table, a summary line and the paths of the
JSON (``overlap_ops.json``), the table (``overlap_ops.txt``) and the plot
(``overlap_ops.png``, when matplotlib is installed). ``--trace`` (GPUs) adds a GPU timeline
per row of its best variant and torch's op (benchmarks/trace.py): ``traces/<row>.txt``, and
per-call spans and idle times in the JSON (``trace``), to say why a row misses. On the host
transport the summary line counts nothing against the targets: its floor is gloo's collective
on tiny CPU shapes, so the ratios say nothing about GPUs and change from run to run.

The code: this module (the protocol's NOTEs, the options, ``main``);
:mod:`benchmarks.overlap_suite` (the rows and the peer reference data, TE's times in
``benchmarks/data/te_reference.json``, the model families in
``benchmarks/data/model_families.json``); :mod:`benchmarks.overlap_estimate` (``--list``);
:mod:`benchmarks.overlap_runner` (one row's
measurements, the sweep); :mod:`benchmarks.overlap_report` (metrics, summary, table, JSON,
plot); :mod:`benchmarks.methods` (the registry of timed methods); and what every benchmark
shares, :mod:`benchmarks.common` (launching, timing, output) and :mod:`benchmarks.trace`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks.common import (
    Progress,
    RankTimer,
    add_launch_arg,
    add_timing_args,
    check_timing_args,
    device_barrier,
    environment,
    launch_workers,
)
from benchmarks.methods import OPS, Variant, select
from benchmarks.overlap_estimate import estimate_run, listing_text
from benchmarks.overlap_report import NAME, run_meta, write_report
from benchmarks.overlap_runner import run_suite
from benchmarks.overlap_suite import DTYPES, FAMILIES, SUITES, Suite, select_suite
from benchmarks.trace import Tracer
from overlap.launch import detect_launch_env, init_torch_distributed

EPILOG = """\
examples:
  python -m benchmarks.overlap_ops --launch 4 --out bench_results          # host transport
  python -m benchmarks.overlap_ops --launch 4 --cuda --out bench_results --full   # 4 GPUs
  python -m benchmarks.overlap_ops --launch 4 --cuda --out bench_results --suite broad \\
      --tp 4 --families llama3.1-8b,gpt3-175b --tokens 1024,16384 --list   # plan a cut

Writes OUT/overlap_ops.json (every time of every row, the summaries, the definitions),
OUT/overlap_ops.txt (the table, also printed) and OUT/overlap_ops.png (with matplotlib).
The protocol and its NOTEs: the docstring of benchmarks/overlap_ops.py."""


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overlap_ops",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory of the outputs: overlap_ops.json, .txt and .png (created if missing)",
    )
    parser.add_argument(
        "--cuda", action="store_true", help="the cuda transport on GPUs (default: host)"
    )
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default=None,
        help="quick (default: a few rows in seconds), full (the docs/design.md §6 suite, TE's "
        "shapes and the bulk rows) or broad (the four GEMMs of eight public model families at "
        "M 1024-32768)",
    )
    parser.add_argument("--full", action="store_true", help="the same as --suite full")
    parser.add_argument(
        "--tp",
        default=None,
        metavar="2,4",
        help="TP sizes (default: the world size; with --suite full or broad, 2 and 4 where "
        "they divide the world size, and the world size)",
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help="only these shapes, e.g. fc1,te8192; broad: <family>.<layer> or a layer name",
    )
    parser.add_argument(
        "--families",
        default=None,
        help=f"broad suite: only these model families ({','.join(f.name for f in FAMILIES)})",
    )
    parser.add_argument(
        "--tokens", default=None, metavar="1024,4096", help="only the rows of these M (tokens)"
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the selection's rows, the rows left out and why, and (with --cuda) the "
        "estimated GPU time on H100s, then exit without running (world size: --launch)",
    )
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
    add_timing_args(parser)
    parser.add_argument(
        "--trace",
        action="store_true",
        help="after timing each row, record GPU timelines (torch.profiler / CUPTI) of its best "
        "variant and torch's op, 3 calls each, every rank on one axis: OUT/traces/<row>.txt "
        "(needs --cuda)",
    )
    add_launch_arg(parser)
    args = parser.parse_args(argv)
    if args.trace and not args.cuda:
        parser.error("--trace records GPU timelines (CUPTI): it needs --cuda")
    if args.full and args.suite not in (None, "full"):
        parser.error(f"--full is --suite full: it does not go with --suite {args.suite}")
    try:
        args.tokens = [int(t) for t in _csv(args.tokens)]
    except ValueError:
        parser.error(f"--tokens takes whole numbers (comma list), got {args.tokens!r}")
    check_timing_args(parser, args)
    return args


def _selection(args: argparse.Namespace, world: int) -> tuple[Suite, list[Variant]]:
    """The suite's rows and the variants the options select (after ``--import``).

    Raises:
        ValueError: a selection :func:`select_suite` or :func:`select` refuses.
        ImportError: a module of ``--import`` that does not import.
    """
    suite = select_suite(
        world,
        suite=args.suite,
        full=args.full,
        cuda=args.cuda,
        tp_sizes=[int(t) for t in _csv(args.tp)] or None,
        shapes=_csv(args.shapes) or None,
        dtypes=_csv(args.dtypes),
        ops=_csv(args.ops) or None,
        families=_csv(args.families) or None,
        tokens=args.tokens or None,
    )
    for module in _csv(args.imports):
        importlib.import_module(module)
    return suite, select(_csv(args.methods))


def _estimate(
    args: argparse.Namespace, suite: Suite, variants: list[Variant]
) -> dict[str, Any] | None:
    """The GPU-time estimate of the selection (benchmarks/overlap_estimate.py) on GPUs, with
    the run's timing options; None on the host transport."""
    if not args.cuda:
        return None
    heat = args.heat_ms if args.timing == "sustained" else 0.0
    warmup, iters, passes = args.warmup, args.iters, args.passes
    return estimate_run(
        suite.rows, variants, warmup=warmup, iters=iters, passes=passes, heat_ms=heat
    )


def _list(args: argparse.Namespace) -> int:
    """``--list``: the selection at the world size of ``--launch`` (else this job's), with the
    GPU-time estimate where ``--cuda`` is given; nothing runs."""
    try:
        suite, variants = _selection(args, args.launch or detect_launch_env().world_size)
    except (ValueError, ImportError) as exc:
        print(f"[overlap_ops] error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(listing_text(suite, _estimate(args, suite, variants)), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.list:
        return _list(args)
    if args.launch:
        return launch_workers("benchmarks.overlap_ops", args.launch, argv)
    job = detect_launch_env()
    rank0 = job.rank == 0
    try:  # argument errors: on every rank alike, before any communication
        suite, variants = _selection(args, job.world_size)
    except (ValueError, ImportError) as exc:
        if rank0:
            print(f"[overlap_ops] error: {exc}", file=sys.stderr, flush=True)
        return 2
    rows = list(suite.rows)
    estimate = _estimate(args, suite, variants)
    init_torch_distributed("nccl" if args.cuda else "gloo")
    t0 = time.time()
    # All TP groups run every row at once (NOTE [TP below the world size]): align the world.
    timer = RankTimer.from_args(args)
    tracer = Tracer(args.out, timer.align or device_barrier()) if args.trace else None
    if rank0 and args.cuda and args.iters < 20:
        print(
            f"[overlap_ops] note: --iters {args.iters} < 20, below the docs/design.md §6 protocol",
            flush=True,
        )
    if rank0:
        tps = sorted({r["tp"] for r in rows})
        print(
            f"[overlap_ops] {len(rows)} rows ({suite.name} suite, TP {tps}, {args.iters} "
            f"iters), {len(variants)} variants registered"
            + (f", {len(suite.skipped)} rows left out (see the table)" if suite.skipped else "")
            + (f"; about {estimate['seconds'] / 60:.1f} min on H100s" if estimate else "")
            + "; progress on stderr",
            flush=True,
        )
    results = run_suite(
        rows,
        variants,
        cuda=args.cuda,
        timer=timer,
        passes=args.passes,
        tracer=tracer,
        progress=Progress(len(rows), NAME, enabled=rank0),
    )
    dist.barrier()
    dist.destroy_process_group()
    if not rank0:
        return 0
    meta = run_meta(
        suite=suite,
        cuda=args.cuda,
        world_size=job.world_size,
        environment=environment(args.cuda),
        argv=argv,
        timing=timer.protocol(),
        traces=tracer.dir if tracer is not None else None,
        variants=variants,
    )
    # beside the JSON's measured seconds, so that benchmarks/overlap_estimate.py can be corrected
    meta["estimated_gpu_seconds"] = estimate["seconds"] if estimate else None
    write_report(results, meta, args.out, time.time() - t0)
    if tracer is not None:
        print(f"GPU timelines: {tracer.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

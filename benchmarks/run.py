"""The main job: ``python -m benchmarks.run`` (scripts/bench.sh sets everything up first, then
runs this with its arguments).

Runs on all local GPUs when there are any (cuda transport), else on the host transport with 4
ranks, under mpirun. Prints tables and writes JSON under ``--out``.

It runs the benchmarks of :data:`JOBS`, one after the other, each launched under mpirun:

1. ``benchmarks.overlap_ops``: the comm-GEMM overlap ops (AG+GEMM, GEMM+RS) against their
   floor, the sequential baseline, torch's async-TP and TransformerEngine's times measured on
   4xH200 (docs/design.md §6). The quick default is a few M = 8192 rows at TP = all ranks
   (seconds); ``--full`` runs the whole suite (M = 8192 and 16384, TP = 2 and 4, bf16 and
   fp8, and TE's shapes) with a progress line per row. On the host transport the same rows
   run scaled down to tiny shapes.
2. ``benchmarks.baseline_collectives``: overlap's all-gather / reduce-scatter beside NCCL (or
   gloo), the bootstrap and the amax kernel.
3. ``benchmarks.layers``: the tensor-parallel modules (qkv LayerNormLinear, proj
   RowParallelLinear, the SwiGLU LayerNormMLP), forward + backward, with userbuffers against
   ``ub=None``; quick: Llama-3-70B-like dims at T = 8192, bf16 and fp8; ``--full``: T =
   4096, 8192 and 16384.
4. ``benchmarks.transformer``: one whole transformer layer, forward + backward, ours with and
   without overlap against PyTorch's DTensor tensor parallelism (eager, compiled, compiled
   with async-TP) and TransformerEngine where it imports; quick: Llama-3-70B at T = 8192.

At the end: the overlap summary lines (on GPUs: rows within 1.10 x floor, median ratio, rows
faster than torch / TE; on the host transport, whose floor is gloo's on tiny shapes, only the
rows timed) and the paths of the JSON files, the overlap table and its plot (PNG, when
matplotlib is installed).

Another benchmark (e.g. whole tensor-parallel layers) is a module of ``benchmarks/`` that
takes ``--out``, ``--cuda`` and ``--full`` (and ``--timing`` where it times GPU work; the
launching, timing and output helpers are in :mod:`benchmarks.common`), writes
``OUT/<name>.json``, and one :class:`Job` entry in :data:`JOBS`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, TIMING_MODES, mpirun_module
from overlap._native import build_info
from overlap.launch import format_command


def _overlap_summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    from benchmarks.overlap_report import summary_lines

    return summary_lines(result, "overlap ops", "bulk overlap")


def _layers_summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    from benchmarks.layers import summary_line

    return [("layers", summary_line(result["summary"]))]


def _transformer_summary(result: dict[str, Any]) -> list[tuple[str, str]]:
    from benchmarks.transformer import summary_line

    return [("transformer layer", summary_line(result["summary"]))]


@dataclass(frozen=True)
class Job:
    """One benchmark of the main job.

    Attributes:
        name: its name in the progress and closing lines.
        module: run as ``python -m module --out OUT [--cuda] [--full]`` under mpirun.
        output: the stem of its outputs under ``--out`` (``<output>.json``; with ``table``,
            also ``<output>.txt`` and ``<output>.png``).
        timing: it takes ``--timing`` (benchmarks.common.add_timing_args).
        table: it writes a table and a plot.
        summary: (label, line) pairs of its closing summary, from its JSON.
    """

    name: str
    module: str
    output: str
    timing: bool = False
    table: bool = False
    summary: Callable[[dict[str, Any]], list[tuple[str, str]]] | None = None


JOBS = (
    Job(
        "overlap ops",
        "benchmarks.overlap_ops",
        "overlap_ops",
        timing=True,
        table=True,
        summary=_overlap_summary,
    ),
    Job("collectives", "benchmarks.baseline_collectives", "baseline_collectives"),
    Job("layers", "benchmarks.layers", "layers", table=True, summary=_layers_summary),
    Job(
        "transformer layer",
        "benchmarks.transformer",
        "transformer",
        table=True,
        summary=_transformer_summary,
    ),
)

DESCRIPTION = """\
The main job: the overlap ops, collectives, layers and transformer-layer benchmarks under
mpirun, on all local GPUs, or on 4 ranks of the host transport where there are none.
scripts/bench.sh sets everything up, then runs this with its arguments."""
EPILOG = """\
outputs under --out: overlap_ops.json, overlap_ops.txt (the table), overlap_ops.png (the plot,
with matplotlib), baseline_collectives.json, layers.json / .txt / .png, transformer.json /
.txt / .png; each benchmark alone, with more options: python -m benchmarks.<name> --help
(overlap_ops, layers, transformer)"""


def parse_args(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nprocs",
        type=int,
        default=None,
        help="ranks (default: all local GPUs, else 4 on the host transport)",
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "cuda", "host"),
        default="auto",
        help="cuda: on GPUs (CUDA IPC buffers, copy engines); host: CPU processes over POSIX "
        "shared memory, tiny shapes, a smoke run; auto (default): cuda when GPUs are visible",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench_results",
        help="directory of the outputs (default: bench_results/ in the repository)",
    )
    parser.add_argument("--full", action="store_true", help="the whole suite (slower)")
    parser.add_argument(
        "--timing",
        choices=TIMING_MODES,
        default="gpu",
        help="overlap ops timing on GPUs (python -m benchmarks.overlap_ops --help)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds for each launch (default: 900)"
    )
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    info = build_info()
    gpus = info["device_count"] if info["cuda_compiled"] else 0
    cuda = args.transport == "cuda" or (args.transport == "auto" and gpus > 0)
    if cuda and gpus == 0:
        parser.error(f"--transport cuda needs GPUs: {info['device_error'] or 'none visible'}")
    nprocs = args.nprocs or (gpus if cuda else 4)
    print(f"[bench] transport={'cuda' if cuda else 'host'} ranks={nprocs} out={args.out}")
    for i, job in enumerate(JOBS, 1):
        print(f"\n[bench] ({i}/{len(JOBS)}) {job.name} ...", flush=True)
        cmd = mpirun_module(
            nprocs,
            job.module,
            ["--out", str(args.out)]
            + (["--timing", args.timing] if job.timing else [])
            + (["--cuda"] if cuda else [])
            + (["--full"] if args.full else []),
        )
        try:
            done = subprocess.run(cmd, cwd=REPO, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"[bench] timed out after {args.timeout:.0f} s: {format_command(cmd)}")
            return 1
        if done.returncode != 0:
            print(f"[bench] FAILED (exit {done.returncode}): {format_command(cmd)}")
            return done.returncode
    print()
    for job in JOBS:
        if job.summary is None:
            continue
        path = args.out / f"{job.output}.json"
        try:
            for label, line in job.summary(json.loads(path.read_text())):
                print(f"[bench] {label}: {line}")
        except (OSError, KeyError, ValueError) as exc:
            print(f"[bench] {job.name}: no summary in {path} ({exc})")
    for job in JOBS:
        print(f"[bench] {job.name} JSON: {args.out / f'{job.output}.json'}")
    for job in (j for j in JOBS if j.table):
        print(f"[bench] {job.name} table: {args.out / f'{job.output}.txt'}")
        plot = args.out / f"{job.output}.png"
        print(f"[bench] {job.name} plot: {plot if plot.exists() else 'none (no matplotlib)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

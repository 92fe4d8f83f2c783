"""The main job: ``python -m benchmarks.run`` (scripts/bench.sh sets everything up first).

Runs on all local GPUs when there are any (cuda transport), else on the host transport with 4
ranks, under mpirun. Prints tables and writes JSON under ``--out``.

It runs two benchmarks, one after the other, each launched under mpirun:

1. ``benchmarks.overlap_ops``: the comm-GEMM overlap ops (AG+GEMM, GEMM+RS) against their
   floor, the sequential baseline, torch's async-TP and TransformerEngine's times measured on
   4xH200 (DESIGN.md §6). The quick default is a few M = 8192 rows at TP = all ranks
   (seconds); ``--full`` runs the whole suite (M = 8192 and 16384, TP = 2 and 4, bf16 and
   fp8, and TE's shapes) with a progress line per row. On the host transport the same rows
   run scaled down to tiny shapes.
2. ``benchmarks.baseline_collectives``: overlap's all-gather / reduce-scatter beside NCCL (or
   gloo), the bootstrap and the amax kernel.

At the end: the overlap summary line (rows within 1.10 x floor, median ratio, rows faster than
torch / TE) and the paths of the JSON files, the overlap table and its plot (PNG, when
matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from overlap._native import build_info
from overlap.launch import format_command, mpirun_command

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nprocs",
        type=int,
        default=None,
        help="ranks (default: all local GPUs, else 4 on the host transport)",
    )
    parser.add_argument("--transport", choices=("auto", "cuda", "host"), default="auto")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results")
    parser.add_argument("--full", action="store_true", help="the whole suite (slower)")
    parser.add_argument(
        "--timing",
        choices=("e2e", "gpu", "sustained"),
        default="gpu",
        help="overlap ops timing (benchmarks.overlap_ops --help)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the launch")
    args = parser.parse_args(argv)

    info = build_info()
    gpus = info["device_count"] if info["cuda_compiled"] else 0
    cuda = args.transport == "cuda" or (args.transport == "auto" and gpus > 0)
    if cuda and gpus == 0:
        parser.error(f"--transport cuda needs GPUs: {info['device_error'] or 'none visible'}")
    nprocs = args.nprocs or (gpus if cuda else 4)
    print(f"[bench] transport={'cuda' if cuda else 'host'} ranks={nprocs} out={args.out}")
    jobs = [
        (
            "overlap ops",
            ["benchmarks.overlap_ops", "--out", str(args.out), "--timing", args.timing],
            args.out / "overlap_ops.json",
        ),
        (
            "collectives",
            ["benchmarks.baseline_collectives", "--out", str(args.out)],
            args.out / "baseline_collectives.json",
        ),
    ]
    for i, (name, module_args, _) in enumerate(jobs, 1):
        print(f"\n[bench] ({i}/{len(jobs)}) {name} ...", flush=True)
        cmd = mpirun_command(
            nprocs,
            [sys.executable, "-u", "-m", *module_args]
            + (["--cuda"] if cuda else [])
            + (["--full"] if args.full else []),
            env={"PYTHONPATH": str(REPO)},
            tag_output=False,
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
    ops_json = jobs[0][2]
    try:
        from benchmarks.overlap_ops import summary_line

        result = json.loads(ops_json.read_text())
        print(f"[bench] overlap ops: {summary_line(result['summary'])}")
        if result.get("summary_bulk", {}).get("rows"):
            print(f"[bench] bulk overlap: {summary_line(result['summary_bulk'], bulk=True)}")
    except (OSError, KeyError, ValueError) as exc:
        print(f"[bench] overlap ops: no summary in {ops_json} ({exc})")
    for name, _, path in jobs:
        print(f"[bench] {name} JSON: {path}")
    print(f"[bench] overlap ops table: {args.out / 'overlap_ops.txt'}")
    plot = args.out / "overlap_ops.png"
    print(f"[bench] overlap ops plot: {plot if plot.exists() else 'none (no matplotlib)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

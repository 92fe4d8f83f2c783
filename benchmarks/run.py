"""The main job: ``python -m benchmarks.run`` (scripts/bench.sh sets everything up first).

Runs on all local GPUs when there are any (cuda transport), else on the host transport with 4
ranks, under mpirun. Prints a table and writes JSON under ``--out``.

Status: overlap's comm-GEMM overlap ops are not implemented yet. Until they land, this job
measures overlap's own collectives (cuda transport on GPUs, host transport otherwise) beside
the baselines they must beat (NCCL/gloo), the bootstrap and the amax kernel, and says so.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the launch")
    args = parser.parse_args(argv)

    info = build_info()
    gpus = info["device_count"] if info["cuda_compiled"] else 0
    cuda = args.transport == "cuda" or (args.transport == "auto" and gpus > 0)
    if cuda and gpus == 0:
        parser.error(f"--transport cuda needs GPUs: {info['device_error'] or 'none visible'}")
    nprocs = args.nprocs or (gpus if cuda else 4)
    print(f"[bench] transport={'cuda' if cuda else 'host'} ranks={nprocs} out={args.out}")
    print(
        "[bench] NOTE: overlap's comm-GEMM overlap ops are not implemented yet; this run "
        "measures the collectives they build on (overlap's all-gather/reduce-scatter beside "
        "NCCL on GPUs, gloo on the host), the bootstrap and the amax kernel.",
        flush=True,
    )
    cmd = mpirun_command(
        nprocs,
        [sys.executable, "-u", "-m", "benchmarks.baseline_collectives", "--out", str(args.out)]
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
    print(f"\n[bench] JSON: {args.out / 'baseline_collectives.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

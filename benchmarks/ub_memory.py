"""Userbuffer memory per rank of ``initialize_ub()``'s defaults, against ``2 * T * H * 2``.

For a Llama-3-70B-like layer (H 8192; FFN and QKV widths are the weights', given at call
time, so the buffers depend on ``T`` and ``H`` alone) at several token counts, BF16 and FP8,
on the TP group of every rank the module runs on: each rank builds the handle, reads
``Userbuffers.total_bytes`` (what the transport allocated, the same on every rank) and rank 0
prints one row per handle and, with ``--describe``, the handle's ``describe()`` table (NOTE
[userbuffer memory] in ``overlap/ub/handle.py``). Nothing is timed. On the host transport the
buffers are POSIX shared memory of the full size (only touched pages are backed), so it runs
on any machine::

    python -m benchmarks.ub_memory --launch 4            # TP 4, host transport
    python -m benchmarks.ub_memory --launch 2 --tokens 8192,16384
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HIDDEN = 8192  # Llama-3-70B
TOKENS = (8192, 16384)
MIB = 1 << 20


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rank 0's rows (every rank builds and destroys the same handles)."""
    import torch
    import torch.distributed as dist

    import overlap
    from overlap.launch import init_torch_distributed

    init_torch_distributed("nccl" if args.cuda else "gloo")
    tp = dist.get_world_size()
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for dtype in args.dtypes.split(","):
            ub = overlap.initialize_ub(
                (tokens, args.hidden),
                dist.group.WORLD,
                torch.bfloat16,
                use_fp8=dtype == "fp8",
                transport="cuda" if args.cuda else "host",
                register=False,
            )
            try:
                bound = 2 * tokens * args.hidden * 2
                rows.append(
                    {
                        "tp": tp,
                        "tokens": tokens,
                        "dtype": dtype,
                        "ub_bytes": ub.total_bytes,
                        "bound": bound,
                        "ratio": ub.total_bytes / bound,
                    }
                )
                if args.describe and dist.get_rank() == 0:
                    print(ub.describe(), flush=True)
            finally:
                ub.destroy()
    dist.barrier()
    return rows if dist.get_rank() == 0 else []


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import add_launch_arg, launch_workers

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ub_memory", description=__doc__.split("\n\n")[0]
    )
    add_launch_arg(parser)
    parser.add_argument("--cuda", action="store_true", help="GPUs (cuda transport)")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--dtypes", default="bf16,fp8", help="bf16, fp8 or both")
    parser.add_argument("--describe", action="store_true", help="print each describe()")
    args = parser.parse_args(argv)
    if args.launch:
        return launch_workers(
            "benchmarks.ub_memory", args.launch, sys.argv[1:] if argv is None else argv
        )
    for r in run(args):
        print(
            f"tp={r['tp']} T={r['tokens']} H={args.hidden} {r['dtype']}: "
            f"{r['ub_bytes']} bytes ({r['ub_bytes'] / MIB:.1f} MiB) per rank, "
            f"{r['ratio']:.2f} x 2*T*H*2 ({r['bound'] / MIB:.1f} MiB)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

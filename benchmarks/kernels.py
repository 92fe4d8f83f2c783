"""Bandwidth of the quantization and reduction kernels next to a device-to-device copy.

``python -m benchmarks.kernels --json out.json`` on one GPU (about 30 s): cast_to_fp8,
cast_transpose, 1x128 block quantization (both directions) on 2048 x 8192, 8192 x 8192 and
16384 x 8192 bf16, the FP8 transpose of the same shapes (and PyTorch's strided copy it
replaces), and the reduction of k = 2 and 4 bf16 partials of an 8192 x 8192 / k
reduce-scatter shard. Each kernel's bandwidth counts the bytes it reads plus the bytes it
writes (data and scales); the reference is a
device-to-device copy (``Tensor.copy_``) moving the same total number of bytes, timed right
after it. Medians of CUDA-event timings after warm-up (benchmarks/common.py).

Each op and its copy are timed twice. ``ms`` / ``gbps`` / ``pct_of_copy`` are GPU time alone
(``time_op(queued=True)``: the op is enqueued behind a GPU spin, so the host's time to
enqueue it is not counted): the kernels' bandwidth, the figure the kernel targets are about.
``e2e_ms`` / ``e2e_pct_of_copy`` start the clock on an idle GPU, so they also count the host's
enqueueing (Python wrapper, argument conversion and checks, launches) where it is longer than
the GPU's own start (the columns measured before ``queued`` existed). A straight-line fit
of those times over the two shapes on an H200 put the fixed part of a call (host enqueueing
plus any per-call GPU cost) near 44 us per quantization call against about 9 us per copy, a
third of the ~0.1 ms 8192 x 8192 runs, while the slopes were 90-100% of the copy's for
cast_to_fp8 and cast_transpose.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, time_op, write_json

HIDDEN = 8192
# tokens x hidden, bf16: a per-chunk shape (one of several chunks a layer's 8192-token input is
# pipelined in: 1024 tiles of 128x128, under two waves on an H200) and the whole-layer shapes
SHAPES = [(2048, 8192), (8192, 8192), (16384, 8192)]
TP_SIZES = [2, 4]


def _measure(
    op: str,
    shape: str,
    fn: Callable[[], object],
    *,
    read_bytes: int,
    write_bytes: int,
    iters: int,
) -> dict[str, Any]:
    import torch

    ms = time_op(fn, cuda=True, iters=iters, queued=True)
    e2e_ms = time_op(fn, cuda=True, iters=iters)
    # The copy moves half the kernel's traffic each way: the same bytes read + written.
    copy_bytes = (read_bytes + write_bytes) // 2
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_op(lambda: dst.copy_(src), cuda=True, iters=iters, queued=True)
    e2e_copy_ms = time_op(lambda: dst.copy_(src), cuda=True, iters=iters)
    total_gb = (read_bytes + write_bytes) / 1e9
    copy_gb = 2 * copy_bytes / 1e9
    gbps = total_gb / (ms / 1e3)
    copy_gbps = copy_gb / (copy_ms / 1e3)
    e2e_gbps = total_gb / (e2e_ms / 1e3)
    e2e_copy_gbps = copy_gb / (e2e_copy_ms / 1e3)
    return {
        "op": op,
        "shape": shape,
        "read_mb": read_bytes / 2**20,
        "write_mb": write_bytes / 2**20,
        "ms": ms,
        "gbps": gbps,
        "copy_ms": copy_ms,
        "copy_gbps": copy_gbps,
        "pct_of_copy": 100.0 * gbps / copy_gbps,
        "e2e_ms": e2e_ms,
        "e2e_gbps": e2e_gbps,
        "e2e_copy_ms": e2e_copy_ms,
        "e2e_copy_gbps": e2e_copy_gbps,
        "e2e_pct_of_copy": 100.0 * e2e_gbps / e2e_copy_gbps,
    }


def bench(iters: int) -> list[dict[str, Any]]:
    import torch

    from overlap.quantization import (
        cast_to_fp8,
        cast_transpose,
        quantize_block_1x128,
        reduce_partials,
        transpose_fp8,
    )

    fp8 = torch.float8_e4m3fn
    rows = []
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        n = x.numel()
        name = f"{m}x{k} bf16"
        scale = torch.tensor([3.0], device="cuda")
        out = torch.empty(m, k, dtype=fp8, device="cuda")
        out_t = torch.empty(k, m, dtype=fp8, device="cuda")
        scale_inv = torch.empty(1, device="cuda")
        amax = torch.empty(1, device="cuda")
        rows.append(
            _measure(
                "cast_to_fp8 (+amax)",
                name,
                lambda x=x, s=scale, o=out, si=scale_inv, a=amax: cast_to_fp8(
                    x, s, out=o, scale_inv=si, amax=a
                ),
                read_bytes=2 * n,
                write_bytes=n,
                iters=iters,
            )
        )
        rows.append(
            _measure(
                "cast_transpose (+amax)",
                name,
                lambda x=x, s=scale, o=out, ot=out_t, si=scale_inv, a=amax: cast_transpose(
                    x, s, out=o, out_t=ot, scale_inv=si, amax=a
                ),
                read_bytes=2 * n,
                write_bytes=2 * n,
                iters=iters,
            )
        )
        blocks = quantize_block_1x128(x, rowwise=True, columnwise=True)
        scale_bytes = 4 * (blocks.rowwise_scale_inv.numel() + blocks.columnwise_scale_inv.numel())
        rows.append(
            _measure(
                "block 1x128 row+col",
                name,
                lambda x=x, b=blocks: quantize_block_1x128(x, out=b),
                read_bytes=2 * n,
                write_bytes=2 * n + scale_bytes,
                iters=iters,
            )
        )
        # The FP8 transpose of gathered data (weight gradients), and PyTorch's strided copy
        # that it replaces (NOTE [fp8 transpose]).
        q = out.view(torch.uint8)
        rows.append(
            _measure("transpose_fp8", name.replace("bf16", "fp8"),
                     lambda q=q, o=out_t: transpose_fp8(q.view(fp8), o),
                     read_bytes=n, write_bytes=n, iters=iters)
        )  # fmt: skip
        rows.append(
            _measure("torch .t().contiguous()", name.replace("bf16", "fp8"),
                     lambda q=q: q.t().contiguous(), read_bytes=n, write_bytes=n, iters=iters)
        )  # fmt: skip
        del x, out, out_t, blocks, q
    for tp in TP_SIZES:
        shard = HIDDEN * HIDDEN // tp
        partials = torch.randn(tp, shard, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(shard, device="cuda", dtype=torch.bfloat16)
        rows.append(
            _measure(
                f"reduce k={tp} bf16->bf16",
                f"{tp} x {HIDDEN}x{HIDDEN}/{tp}",
                lambda p=partials, o=out: reduce_partials(p, out=o),
                read_bytes=2 * tp * shard,
                write_bytes=2 * shard,
                iters=iters,
            )
        )
        del partials, out
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per op")
    args = parser.parse_args(argv)

    import torch

    from overlap.info import summary

    if not torch.cuda.is_available():
        print("benchmarks.kernels needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    t0 = time.time()
    rows = bench(args.iters)
    result = {
        "benchmark": "kernels",
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name(),
        "overlap_build": summary(),
        "iters": args.iters,
        "rows": rows,
        "seconds": time.time() - t0,
    }
    if args.json is not None:
        write_json(args.json, result)
    print(f"\nquantization / reduction kernels on {result['gpu']} (median of {args.iters})")
    print(
        format_table(
            rows,
            [
                ("op", "op"),
                ("shape", "shape"),
                ("ms", "ms"),
                ("gbps", "GB/s (r+w)"),
                ("copy_gbps", "copy GB/s"),
                ("pct_of_copy", "% of copy"),
                ("e2e_ms", "e2e ms"),
                ("e2e_pct_of_copy", "e2e % of copy"),
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

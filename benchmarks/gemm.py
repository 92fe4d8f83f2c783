"""overlap's cuBLASLt GEMM against torch on one GPU, over the DESIGN.md §6 shape suite.

For every op of the suite (AG+GEMM fc1/qkv, GEMM+RS fc2/proj), TP size and M, two problems:
the whole GEMM (M rows) and one ring chunk (M / tp rows), each timed as

- BF16: ``overlap.gemm`` vs ``torch.mm`` (``x @ w.T``);
- FP8 per-tensor (e4m3, fast accumulation): ``overlap.gemm`` vs ``torch._scaled_mm``;
- FP8 block-scaled (1x128 activations x 128x128 weights, Hopper only): ``overlap.gemm``,
  reported against our per-tensor FP8.

Times are medians of 20 samples, each the mean of back-to-back calls between two CUDA events
(so that Python call overhead overlaps GPU work, as it does in a real schedule), after
warm-up. Prints a table and writes JSON to ``--json``. ``--full`` adds M = 16384.

    python -m benchmarks.gemm [--full] [--json PATH]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import format_table, write_json
from overlap.gemm import gemm
from overlap.info import summary
from overlap.quantization import ScalingMode

HIDDEN, FFN, QKV = 8192, 28672, 10240  # Llama-3-70B-like: GQA 64 q + 2 * 8 kv heads of 128


def suite(tp: int) -> list[tuple[str, int, int]]:
    """(op, n, k) of the suite at one TP size: y [m, n] = x [m, k] @ w [n, k]^T."""
    return [
        ("fc1", 2 * FFN // tp, HIDDEN),
        ("qkv", QKV // tp, HIDDEN),
        ("fc2", HIDDEN, FFN // tp),
        ("proj", HIDDEN, HIDDEN // tp),
    ]


def time_ms(fn: Callable[[], object], *, samples: int = 20, inner: int = 5) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def bench_problem(m: int, n: int, k: int, block: bool) -> dict[str, float | None]:
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    res: dict[str, float | None] = {}
    res["torch_bf16_ms"] = time_ms(lambda: torch.mm(x, w.t(), out=y))
    res["ours_bf16_ms"] = time_ms(lambda: gemm(x, w, transb=True, out=y))

    xq = x.to(torch.float8_e4m3fn)
    wq = (w * 50).to(torch.float8_e4m3fn)
    sx = torch.ones(1, device=dev)
    sw = torch.full((1,), 0.02, device=dev)
    res["torch_fp8_ms"] = time_ms(
        lambda: torch._scaled_mm(
            xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    )
    res["ours_fp8_ms"] = time_ms(
        lambda: gemm(xq, wq, transb=True, a_scale_inv=sx, b_scale_inv=sw, out=y, fast_accum=True)
    )
    res["ours_fp8_block_ms"] = None
    if block:
        kb = -(-k // 128)
        sxb = torch.rand(m, kb, device=dev) + 0.5
        swb = (torch.rand(-(-n // 128), kb, device=dev) + 0.5) * 0.02
        res["ours_fp8_block_ms"] = time_ms(
            lambda: gemm(
                xq,
                wq,
                transb=True,
                a_scale_inv=sxb,
                b_scale_inv=swb,
                a_scaling=ScalingMode.BLOCK_1X128,
                b_scaling=ScalingMode.BLOCK_128X128,
                out=y,
            )
        )
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="add M = 16384")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")

    props = torch.cuda.get_device_properties(0)
    block = torch.cuda.get_device_capability(0)[0] == 9  # cuBLASLt block scaling: Hopper only
    rows = []
    for m_total in [8192, 16384] if args.full else [8192]:
        for tp in args.tp:
            for op, n, k in suite(tp):
                for variant, m in (("full", m_total), ("chunk", m_total // tp)):
                    r = bench_problem(m, n, k, block)
                    row = {"op": op, "tp": tp, "M": m_total, "variant": variant}
                    row.update({"m": m, "n": n, "k": k}, **r)
                    row["ours_bf16_tflops"] = tflops(m, n, k, r["ours_bf16_ms"])
                    row["bf16_pct_of_torch"] = 100 * r["torch_bf16_ms"] / r["ours_bf16_ms"]
                    row["ours_fp8_tflops"] = tflops(m, n, k, r["ours_fp8_ms"])
                    row["fp8_pct_of_torch"] = 100 * r["torch_fp8_ms"] / r["ours_fp8_ms"]
                    if r["ours_fp8_block_ms"] is not None:
                        row["block_tflops"] = tflops(m, n, k, r["ours_fp8_block_ms"])
                        row["block_pct_of_fp8"] = 100 * r["ours_fp8_ms"] / r["ours_fp8_block_ms"]
                    rows.append(row)
                    torch.cuda.empty_cache()
    columns = [
        ("op", "op"),
        ("tp", "tp"),
        ("variant", "rows"),
        ("m", "m"),
        ("n", "n"),
        ("k", "k"),
        ("torch_bf16_ms", "torch bf16 ms"),
        ("ours_bf16_ms", "ours bf16 ms"),
        ("ours_bf16_tflops", "TFLOP/s"),
        ("bf16_pct_of_torch", "% torch"),
        ("torch_fp8_ms", "torch fp8 ms"),
        ("ours_fp8_ms", "ours fp8 ms"),
        ("ours_fp8_tflops", "TFLOP/s"),
        ("fp8_pct_of_torch", "% torch"),
        ("ours_fp8_block_ms", "block ms"),
        ("block_tflops", "TFLOP/s"),
        ("block_pct_of_fp8", "% fp8"),
    ]
    print(f"device: {props.name} ({props.multi_processor_count} SMs)")
    print("% torch / % fp8 = speed relative to the reference (100 = equal, higher = faster)")
    print(format_table(rows, columns))
    if args.json is not None:
        write_json(
            args.json,
            {
                "benchmark": "gemm",
                "device": props.name,
                "host": platform.node(),
                "overlap": summary(),
                "rows": rows,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

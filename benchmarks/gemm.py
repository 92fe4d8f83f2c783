"""overlap's cuBLASLt GEMM against torch on one GPU, over the docs/design.md §6 shape suite:
the heuristic's first algorithm vs the autotuned one vs torch, side by side.

For every op of the suite (AG+GEMM fc1/qkv, GEMM+RS fc2/proj; and at M = 8192 TransformerEngine's
te8192/te4096, K = N = hidden), TP size and M, two problems:
the whole GEMM (M rows) and one ring chunk (M / tp rows), each timed as

- BF16: ``overlap.gemm`` vs ``torch.mm`` (``x @ w.T``);
- FP8 per-tensor (e4m3, fast accumulation): ``overlap.gemm`` vs ``torch._scaled_mm``;
- FP8 block-scaled (1x128 activations x 128x128 weights, Hopper only): ``overlap.gemm``,
  reported against our autotuned per-tensor FP8;

and ours twice: ``first`` = cuBLASLt's first heuristic result (autotuning off), ``tuned`` =
after :func:`overlap.gemm.autotune` pre-tuned the key (``pick`` = index of the chosen
candidate / candidates timed; ``hit`` = the timed calls were cache hits of the pre-tuned key).

Times are GPU times: medians of 20 samples, each the mean of 5 back-to-back calls between two
CUDA events, queued behind a GPU spin that outlasts the host's enqueueing of them (the GEMM's
throughput, as inside the overlap ops, whose chunk GEMMs are issued from C++ ahead of the
GPU). Ours and torch's take turns sample by sample, and each % compares ours with torch's
samples of the same window (``first`` and ``tuned`` each have their own; the table's torch
column is the tuned window's, the JSON has both), so that the GPU's
clock drift under sustained GEMMs (power, temperature) falls on both alike. ``host us`` is
the host's time to enqueue one call (ours tuned, and torch's; medians of five samples of 50
calls, taken in turn): what bounds the time per call of a GEMM shorter than that when Python
issues GEMMs one by one. Prints one table per dtype
and writes JSON to ``--json``. ``--full`` adds M = 16384.

    python -m benchmarks.gemm [--full] [--json PATH] [--candidates N] [--rounds R] [--shapes S]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import format_table, spin_gpu, time_in_passes, write_json
from overlap.gemm import (
    AutotuneConfig,
    GemmProblem,
    autotune,
    clear_gemm_cache,
    gemm,
    gemm_cache_stats,
    get_autotune_config,
    set_autotune_config,
)
from overlap.info import summary
from overlap.quantization import ScalingMode

TARGET_PCT = 98.0  # issue 4: ours >= 98% of torch's throughput on every row

HIDDEN, FFN, QKV = 8192, 28672, 10240  # Llama-3-70B-like: GQA 64 q + 2 * 8 kv heads of 128


TE_HIDDEN, TE_TOKENS = (8192, 4096), 8192  # TransformerEngine's shapes (docs/design.md §6)


def suite(tp: int, m_total: int) -> list[tuple[str, int, int]]:
    """(op, n, k) of the suite at one TP size and M: y [m, n] = x [m, k] @ w [n, k]^T.

    The Llama shapes at every M, and TE's (``te<hidden>``: the local GEMM of both of its ops
    has K = N = hidden) at M = 8192 only, as in benchmarks.overlap_ops.
    """
    shapes = [
        ("fc1", 2 * FFN // tp, HIDDEN),
        ("qkv", QKV // tp, HIDDEN),
        ("fc2", HIDDEN, FFN // tp),
        ("proj", HIDDEN, HIDDEN // tp),
    ]
    if m_total == TE_TOKENS:
        shapes += [(f"te{h}", h, h) for h in TE_HIDDEN]
    return shapes


def time_ms(*fns: Callable[[], object], samples: int = 20, inner: int = 5) -> list[float]:
    """GPU milliseconds per call of each of ``fns`` (median), sampled in turn.

    A sample is the mean of ``inner`` back-to-back calls between two CUDA events, queued
    behind a GPU spin that outlasts the host's enqueueing of them, so that it is the GPU's time
    alone (a GEMM of 50 us is otherwise timed by the host's launch rate; see host_us). The
    functions take turns sample by sample (NOTE [timing passes] in benchmarks/common.py: A B,
    B A, ...), so that every one of them sees the same clocks: an H200 running GEMMs back to
    back slows down by up to ~15% over a few seconds (power and temperature), and timing one
    function after another would charge that drift to whichever came last.
    """
    host = []
    for fn in fns:
        for i in range(3):
            t0 = time.perf_counter()
            fn()
            if i:
                host.append(time.perf_counter() - t0)
    spin_ms = 1.5 * max(host) * 1e3 * inner + 0.2
    torch.cuda.synchronize()

    def sample(fn: Callable[[], object]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        spin_gpu(spin_ms)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / inner

    return _in_turn(fns, sample, samples)


def host_us(*fns: Callable[[], object], calls: int = 50, reps: int = 5) -> list[float]:
    """Host microseconds to enqueue one call of each of ``fns`` (Python, argument checks,
    descriptor set-up, launches): what bounds the time per call of GEMMs shorter than this.

    A sample is ``calls`` calls enqueued while the GPU is busy behind a spin (so the host never
    waits for it); the functions take turns, ``reps`` samples each (NOTE [timing passes] in
    benchmarks/common.py), and the median of each is kept (a single sample ranged 14-42 us on
    calls that take ~18)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()

    def sample(fn: Callable[[], object]) -> float:
        spin_gpu(calls * 0.2 + 5.0)  # generous: 200 us per call
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        us = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        return us

    return _in_turn(fns, sample, reps)


def _in_turn(
    fns: Sequence[Callable[[], object]], sample: Callable[[Callable[[], object]], float], n: int
) -> list[float]:
    """The median of ``n`` samples of each function, taken in turn (time_in_passes)."""
    medians = time_in_passes({str(i): fn for i, fn in enumerate(fns)}, sample, n)
    return [medians[str(i)] for i in range(len(fns))]


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


@dataclasses.dataclass
class Case:
    """One dtype of one problem: our call, torch's (None: no torch peer), the tuning key."""

    name: str
    ours: Callable[[], object]
    theirs: Callable[[], object] | None
    problem: GemmProblem


def cases(m: int, n: int, k: int, block: bool) -> list[Case]:
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    xq = x.to(torch.float8_e4m3fn)
    wq = (w * 50).to(torch.float8_e4m3fn)
    sx = torch.ones(1, device=dev)
    sw = torch.full((1,), 0.02, device=dev)
    out = [
        Case(
            "bf16",
            lambda: gemm(x, w, transb=True, out=y),
            lambda: torch.mm(x, w.t(), out=y),
            GemmProblem.linear(m, k, n),
        ),
        Case(
            "fp8",
            lambda: gemm(
                xq, wq, transb=True, a_scale_inv=sx, b_scale_inv=sw, out=y, fast_accum=True
            ),
            lambda: torch._scaled_mm(
                xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16, use_fast_accum=True
            ),
            GemmProblem.linear(m, k, n, dtype=torch.float8_e4m3fn, fast_accum=True),
        ),
    ]
    if block:
        kb = -(-k // 128)
        sxb = torch.rand(m, kb, device=dev) + 0.5
        swb = (torch.rand(-(-n // 128), kb, device=dev) + 0.5) * 0.02
        modes = {"a_scaling": ScalingMode.BLOCK_1X128, "b_scaling": ScalingMode.BLOCK_128X128}
        out.append(
            Case(
                "block",
                lambda: gemm(xq, wq, transb=True, a_scale_inv=sxb, b_scale_inv=swb, out=y, **modes),
                None,
                GemmProblem.linear(m, k, n, dtype=torch.float8_e4m3fn, **modes),
            )
        )
    return out


def bench_case(case: Case, config: AutotuneConfig) -> dict[str, Any]:
    """Ours with the heuristic's first algorithm, then ours pre-tuned, each timed in turn with
    torch (time_ms): ms, the pick, and our speed relative to torch's in the same window."""
    p = case.name
    res: dict[str, Any] = {}
    device = torch.cuda.current_device()

    def in_turn(measure: Callable[..., list[float]]) -> tuple[float, float | None]:
        """(ours, torch's or None) by ``measure`` (time_ms or host_us), taken in turn."""
        if case.theirs is None:
            return measure(case.ours)[0], None
        mine, theirs = measure(case.ours, case.theirs)
        return mine, theirs

    clear_gemm_cache()
    previous = set_autotune_config(dataclasses.replace(config, enabled=False))
    try:
        res[f"{p}_first_ms"], torch_first = in_turn(time_ms)
    finally:
        set_autotune_config(previous)

    clear_gemm_cache()
    (tuning,) = autotune([case.problem], max_candidates=config.max_candidates, rounds=config.rounds)
    misses = gemm_cache_stats(device)["misses"]
    res[f"{p}_tuned_ms"], res[f"{p}_torch_ms"] = in_turn(time_ms)
    res[f"{p}_host_us"], res[f"{p}_torch_host_us"] = in_turn(host_us)
    res[f"{p}_hit"] = gemm_cache_stats(device)["misses"] == misses
    res[f"{p}_pick"] = (
        f"{tuning.chosen}/{sum(t is not None for t in tuning.times_ms)}"
        if tuning.status == "tuned"
        else tuning.status
    )
    res[f"{p}_tuning_ms"] = list(tuning.times_ms)
    res[f"{p}_torch_first_ms"] = torch_first  # the table's "torch ms" is the tuned window's
    res[f"{p}_first_pct"] = pct(torch_first, res[f"{p}_first_ms"])
    res[f"{p}_tuned_pct"] = pct(res[f"{p}_torch_ms"], res[f"{p}_tuned_ms"])
    return res


def pct(reference_ms: float | None, ms: float | None) -> float | None:
    """Our speed as a percentage of the reference's (100 = equal, higher = faster)."""
    return None if reference_ms is None or ms is None else 100 * reference_ms / ms


def table(rows: list[dict[str, Any]], p: str, versus: str) -> str:
    columns = [
        ("op", "op"),
        ("tp", "tp"),
        ("variant", "rows"),
        ("m", "m"),
        ("n", "n"),
        ("k", "k"),
        (f"{p}_torch_ms", "torch ms"),
        (f"{p}_first_ms", "first ms"),
        (f"{p}_first_pct", f"first % {versus}"),
        (f"{p}_tuned_ms", "tuned ms"),
        (f"{p}_tuned_tflops", "TFLOP/s"),
        (f"{p}_tuned_pct", f"tuned % {versus}"),
        (f"{p}_pick", "pick"),
        (f"{p}_hit", "hit"),
        (f"{p}_host_us", "host us"),
        (f"{p}_torch_host_us", "torch host us"),
    ]
    if versus != "torch":
        columns = [c for c in columns if "torch" not in c[0]]
    return format_table(rows, columns)


def verdict(rows: list[dict[str, Any]], p: str) -> dict[str, Any]:
    """Worst row and rows below TARGET_PCT, for the heuristic's first and the tuned pick."""
    out: dict[str, Any] = {}
    for which in ("first", "tuned"):
        values = [(r[f"{p}_{which}_pct"], r) for r in rows if r.get(f"{p}_{which}_pct") is not None]
        if not values:
            continue
        worst, row = min(values, key=lambda v: v[0])
        shape = f"{row['m']}x{row['n']}x{row['k']}"
        out[which] = {
            "min_pct": worst,
            "min_row": f"{row['op']} tp{row['tp']} {row['variant']} ({shape})",
            "below_target": sum(v < TARGET_PCT for v, _ in values),
            "rows": len(values),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="add M = 16384")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--candidates", type=int, default=None, help="candidates timed per key (default: config)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per candidate")
    parser.add_argument(
        "--shapes", default=None, help="only these shapes, e.g. te8192,fc1 (default: all)"
    )
    args = parser.parse_args(argv)
    only = set(args.shapes.split(",")) if args.shapes else None
    known = {op for m in (8192, 16384) for op, _, _ in suite(2, m)}
    if only is not None and only - known:
        parser.error(f"unknown shapes {sorted(only - known)}; shapes: {sorted(known)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    base = get_autotune_config()
    config = AutotuneConfig(
        enabled=True,
        max_candidates=args.candidates or base.max_candidates,
        rounds=args.rounds or base.rounds,
    )

    props = torch.cuda.get_device_properties(0)
    block = torch.cuda.get_device_capability(0)[0] == 9  # cuBLASLt block scaling: Hopper only
    rows = []
    for m_total in [8192, 16384] if args.full else [8192]:
        for tp in args.tp:
            for op, n, k in suite(tp, m_total):
                if only is not None and op not in only:
                    continue
                for variant, m in (("full", m_total), ("chunk", m_total // tp)):
                    row: dict[str, Any] = {"op": op, "tp": tp, "M": m_total, "variant": variant}
                    row.update({"m": m, "n": n, "k": k})
                    for case in cases(m, n, k, block):
                        row.update(bench_case(case, config))
                    if block:
                        for which in ("first", "tuned"):
                            row[f"block_{which}_pct"] = pct(
                                row["fp8_tuned_ms"], row[f"block_{which}_ms"]
                            )
                    for p in ("bf16", "fp8", "block"):
                        if row.get(f"{p}_tuned_ms") is not None:
                            row[f"{p}_tuned_tflops"] = tflops(m, n, k, row[f"{p}_tuned_ms"])
                    rows.append(row)
                    torch.cuda.empty_cache()
    clear_gemm_cache()

    print(f"device: {props.name} ({props.multi_processor_count} SMs); autotune: {config}")
    print("first = cuBLASLt's first heuristic algorithm; tuned = the autotuned one (pick =")
    print("chosen index / candidates timed); % = speed relative to the reference, higher = faster")
    summaries = {}
    for p, title, versus in (
        ("bf16", "BF16 vs torch.mm", "torch"),
        ("fp8", "FP8 per-tensor vs torch._scaled_mm", "torch"),
        ("block", "FP8 block-scaled vs our tuned per-tensor FP8", "fp8"),
    ):
        if p == "block" and not block:
            continue
        print(f"\n{title}")
        print(table(rows, p, versus))
        summaries[p] = verdict(rows, p)
    print()
    for p in ("bf16", "fp8"):
        for which, v in summaries[p].items():
            print(
                f"{p} {which}: worst {v['min_pct']:.1f}% of torch ({v['min_row']}); "
                f"{v['below_target']} of {v['rows']} rows below {TARGET_PCT:.0f}%"
            )
    if args.json is not None:
        write_json(
            args.json,
            {
                "benchmark": "gemm",
                "device": props.name,
                "host": platform.node(),
                "overlap": summary(),
                "autotune": dataclasses.asdict(config),
                "target_pct": TARGET_PCT,
                "summary": summaries,
                "rows": rows,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

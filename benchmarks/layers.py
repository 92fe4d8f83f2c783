"""The layer benchmark: each tensor-parallel module, forward + backward, with userbuffers
(``initialize_ub`` defaults) against the same module with ``ub=None`` (NCCL collectives).

Usage (under mpirun; ``--launch N`` starts N ranks itself)::

    python -m benchmarks.layers --launch 2 --cuda --out bench_results [--full]   # GPUs
    python -m benchmarks.layers --launch 2 --out bench_results                  # host, tiny

Modules (Llama-3-70B-like dims unless ``--shapes`` says otherwise: hidden 8192, FFN 28672
SwiGLU, 64 query / 8 KV heads of 128, RMSNorm): ``qkv`` (LayerNormLinear, 8192 -> 10240),
``proj`` (RowParallelLinear, 8192 -> 8192) and ``mlp`` (LayerNormMLP). Tokens ``T`` = 8192
by default (``--full``: 4096, 8192 and 16384), TP = every rank, BF16 and FP8 (current
scaling, E4M3 forward / E5M2 backward).

Per row: the step time (forward + backward of one micro-batch, the weights' FP8 cache warm),
median over ``--iters`` timed steps after warm-up, run back to back as a training loop runs
them (NOTE [step timing] in benchmarks/common.py), the max over ranks; the host's time to
issue a step; tokens/s;
the speed-up of the overlap over ``ub=None``; the peak memory of each (max over ranks); the
userbuffers' bytes per rank. On the host transport (no GPU) the same rows run with tiny
shapes: a smoke run of the code path, not a measurement. JSON (``layers.json``) and a table
(``layers.txt``) under ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.common import StepTiming

REPO = Path(__file__).resolve().parents[1]

# name -> (hidden, ffn, q_heads, kv_heads, head_dim)
SHAPES = {
    "llama3-70b": (8192, 28672, 64, 8, 128),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "mixtral-like": (6144, 16384, 48, 8, 128),
}
TINY = (64, 128, 4, 2, 16)  # the host transport's stand-in
MODULES = ("qkv", "proj", "mlp")


def _build(module: str, dims: tuple[int, ...], ub: Any, tp_group: Any, device: Any) -> Any:
    import torch

    from overlap.layers import LayerNormLinear, LayerNormMLP, RowParallelLinear

    hidden, ffn, qh, kvh, hd = dims
    common = {"tp_group": tp_group, "ub": ub, "params_dtype": torch.bfloat16, "device": device}
    if module == "qkv":
        return LayerNormLinear(
            hidden, (qh + 2 * kvh) * hd, gemm="qkv", normalization="RMSNorm", bias=False, **common
        )
    if module == "proj":
        return RowParallelLinear(qh * hd, hidden, gemm="proj", bias=False, **common)
    return LayerNormMLP(
        hidden, ffn, activation="swiglu", normalization="RMSNorm", bias=False, **common
    )


def _input(module: str, dims: tuple[int, ...], tokens: int, tp: int, device: Any) -> Any:
    import torch

    hidden, _, qh, _, hd = dims
    shape = (tokens, qh * hd // tp) if module == "proj" else (tokens // tp, hidden)
    return torch.randn(shape, dtype=torch.bfloat16, device=device)


def _time_steps(
    layer: Any, x: Any, *, fp8: bool, iters: int, warmup: int, cuda: bool, graph: bool = False
) -> StepTiming:
    """Median ms of forward + backward (a fixed output gradient), of the host's time to issue
    it, and the SM clock, steps back to back (NOTE [step timing] in benchmarks/common.py);
    ``graph``: replayed as CUDA graphs (NOTE [graphed layers] in overlap/layers/graphs.py)."""
    import torch

    from benchmarks.common import as_after_optimizer_step, time_training_steps
    from overlap.layers import Fp8Recipe, fp8_autocast, make_graphed_callables

    x = x.detach().requires_grad_()
    recipe = Fp8Recipe() if fp8 else None
    with fp8_autocast(recipe, enabled=fp8):
        gy = torch.randn_like(layer(x)).detach()
    if graph:
        make_graphed_callables(layer, (x,), fp8_recipe=recipe)

    def step() -> None:
        with fp8_autocast(recipe, enabled=fp8):
            y = layer(x)
        y.backward(gy)

    def before() -> None:
        as_after_optimizer_step(layer.parameters())  # NOTE [weights change every step]
        x.grad = None

    return time_training_steps(step, iters=iters, warmup=warmup, cuda=cuda, before=before)


def _peak(cuda: bool) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated()) if cuda else 0


def run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import overlap
    from benchmarks.common import max_over_ranks, min_clock
    from overlap.launch import init_torch_distributed

    cuda = args.cuda
    launch = init_torch_distributed("nccl" if cuda else "gloo")
    device = torch.device("cuda", launch.local_rank) if cuda else torch.device("cpu")
    tp = dist.get_world_size()
    rank = dist.get_rank()
    shapes = [s.strip() for s in args.shapes.split(",")] if args.shapes else ["llama3-70b"]
    tokens_list = [4096, 8192, 16384] if args.full else [8192]
    if args.tokens:
        tokens_list = [int(t) for t in args.tokens.split(",")]
    dtypes = args.dtypes.split(",")
    modules = args.modules.split(",")
    rows = []
    total = len(shapes) * len(tokens_list) * len(dtypes) * len(modules)
    t_start = time.monotonic()
    for shape in shapes:
        dims = SHAPES[shape] if cuda else TINY
        for tokens_full in tokens_list:
            tokens = tokens_full if cuda else 16 * tp
            for dtype in dtypes:
                fp8 = dtype == "fp8"
                ub = overlap.initialize_ub(
                    (tokens, dims[0]), dist.group.WORLD, torch.bfloat16, use_fp8=fp8,
                    transport="cuda" if cuda else "host", register=False,
                    shape_plans=args.shape_plans,
                )  # fmt: skip
                for module in modules:
                    row: dict[str, Any] = {
                        "module": module, "shape": shape if cuda else "tiny", "tokens": tokens,
                        "tp": tp,
                        "dtype": dtype, "ub_bytes": ub.total_bytes,
                    }  # fmt: skip
                    x = _input(module, dims, tokens, tp, device)
                    columns = [("none", None, False), ("ub", ub, False)]
                    if args.graph and cuda:
                        columns += [("none_graph", None, True), ("ub_graph", ub, True)]
                    for name, handle, graph in columns:
                        torch.manual_seed(0)
                        layer = _build(module, dims, handle, dist.group.WORLD, device)
                        if cuda:
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                        timing = _time_steps(
                            layer, x, fp8=fp8, iters=args.iters, warmup=args.warmup, cuda=cuda,
                            graph=graph,
                        )  # fmt: skip
                        row[f"ms_{name}"] = max_over_ranks(timing.ms)
                        row[f"host_ms_{name}"] = max_over_ranks(timing.host_ms)
                        row[f"sm_mhz_{name}"] = min_clock(timing.sm_mhz)
                        row[f"peak_mb_{name}"] = max_over_ranks(_peak(cuda) / 2**20)
                        del layer
                    row["speedup"] = row["ms_none"] / row["ms_ub"]
                    row["shape_plans"] = ub.plans.describe()[1:]  # the handle's, so far
                    if "ms_ub_graph" in row:
                        row["speedup_graph"] = row["ms_none_graph"] / row["ms_ub_graph"]
                    row["tokens_per_s_ub"] = tokens / row["ms_ub"] * 1e3
                    rows.append(row)
                    if rank == 0:
                        done = len(rows)
                        eta = (time.monotonic() - t_start) / done * (total - done)
                        print(
                            f"[layers] {done}/{total} {module} {shape} T={tokens} {dtype}: "
                            f"ub {row['ms_ub']:.3f} ms, none {row['ms_none']:.3f} ms, "
                            f"x{row['speedup']:.3f} (ETA {eta:.0f} s)",
                            flush=True,
                        )
                gc.collect()  # free graphed layers (--graph) before the buffers their graphs use
                ub.destroy()
    if rank == 0:
        _report(rows, args, cuda, tp, time.monotonic() - t_start)
    dist.barrier()
    dist.destroy_process_group()


def _report(rows: list[dict[str, Any]], args: argparse.Namespace, cuda: bool, tp: int,
            seconds: float) -> None:  # fmt: skip
    import torch

    from benchmarks.common import environment, format_table, print_paths, write_outputs
    from benchmarks.plot import plot_times

    device_name = torch.cuda.get_device_name() if cuda else "cpu (host transport)"
    columns = [
        ("module", "module"), ("shape", "shape"), ("tokens", "T"), ("tp", "tp"),
        ("dtype", "dtype"), ("ms_none", "ms ub=None"), ("ms_ub", "ms ub"),
        ("speedup", "speed-up"), ("host_ms_none", "host ms None"), ("host_ms_ub", "host ms ub"),
        ("sm_mhz_none", "MHz None"), ("sm_mhz_ub", "MHz ub"),
        ("tokens_per_s_ub", "tokens/s ub"),
        ("peak_mb_none", "peak MiB None"), ("peak_mb_ub", "peak MiB ub"),
        ("ub_bytes", "ub bytes/rank"),
    ]  # fmt: skip
    if args.graph:
        columns[8:8] = [
            ("ms_none_graph", "None graphed"), ("ms_ub_graph", "ub graphed"),
            ("speedup_graph", "graphed speed-up"), ("host_ms_ub_graph", "host ms ub graphed"),
        ]  # fmt: skip
    header = (
        f"tensor-parallel layers, forward + backward, {device_name} x {tp}, median of "
        f"{args.iters} steps, max over ranks"
        + ("" if cuda else " (host transport, tiny shapes: a smoke run, not a measurement)")
    )
    summary = summarize(rows, cuda)
    text = "\n".join([header, format_table(rows, columns), f"summary: {summary_line(summary)}"])
    payload = {
        "environment": environment(cuda),
        "tp": tp,
        "iters": args.iters,
        "definitions": DEFINITIONS,
        "rows": rows,
        "summary": summary,
    }
    out = Path(args.out)
    json_path, table_path = write_outputs(out, "layers", payload, text)
    for row in rows:
        row["floor"] = row["ms_none"]  # the plot shows ub / ub=None
    plot = plot_times(
        rows, ("module", "tokens", "dtype"), [("ms_ub", "ub"), ("ms_none", "ub=None")],
        out / "layers.png", f"{header}: time / ub=None time",
        target=1 / TARGET_SPEEDUP if cuda else None,
    )  # fmt: skip
    print_paths(json_path, seconds, table_path, plot)


TARGET_SPEEDUP = 1.15  # a module with overlap against ub=None (TP 4, T = 8192)
DEFINITIONS = {
    "ms_ub": "median ms of forward + backward with userbuffers (initialize_ub defaults), max "
    "over ranks, steps back to back (NOTE [step timing] in benchmarks/common.py)",
    "host_ms_*": "median ms the host takes to issue one step; near ms_*: the row is host-bound",
    "sm_mhz_*": "mean SM clock (NVML) over the timed steps, the lowest over ranks",
    "ms_none": "the same with ub=None (torch.distributed collectives, no overlap)",
    "speedup": "ms_none / ms_ub",
    "peak_mb_*": "torch.cuda.max_memory_allocated over the timed steps (userbuffers are not "
    "counted: ub_bytes)",
    "ub_bytes": "bytes of symmetric memory per rank of the handle (Userbuffers.total_bytes)",
    "ms_*_graph": "--graph: the same step with the module's forward and backward replayed as "
    "CUDA graphs (overlap.layers.make_graphed_callables)",
    "speedup_graph": "ms_none_graph / ms_ub_graph",
}


def summarize(rows: list[dict[str, Any]], cuda: bool) -> dict[str, Any]:
    """Rows, median / worst / best speed-up, and (GPUs) rows at the target speed-up."""
    speedups = sorted(r["speedup"] for r in rows)
    if not speedups:
        return {"rows": 0}
    out = {
        "rows": len(rows),
        "median_speedup": statistics.median(speedups),
        "min_speedup": speedups[0],
        "max_speedup": speedups[-1],
        "at_target": sum(s >= TARGET_SPEEDUP for s in speedups) if cuda else None,
        "target": TARGET_SPEEDUP,
    }
    graphed = sorted(r["speedup_graph"] for r in rows if r.get("speedup_graph") is not None)
    if graphed:
        out["median_speedup_graph"] = statistics.median(graphed)
        out["min_speedup_graph"] = graphed[0]
        out["at_target_graph"] = sum(s >= TARGET_SPEEDUP for s in graphed) if cuda else None
    return out


def summary_line(summary: dict[str, Any]) -> str:
    """One line of :func:`summarize`'s result."""
    if not summary.get("rows"):
        return "no rows"
    line = (
        f"{summary['rows']} rows, speed-up over ub=None: median {summary['median_speedup']:.3f}"
        f" [{summary['min_speedup']:.3f}, {summary['max_speedup']:.3f}]"
    )
    if summary.get("at_target") is None:
        return line + " (host transport: timed, not measured against the target)"
    line += f"; {summary['at_target']}/{summary['rows']} rows >= {summary['target']}x"
    if "median_speedup_graph" in summary:
        line += (
            f"; graphed: median {summary['median_speedup_graph']:.3f}, worst "
            f"{summary['min_speedup_graph']:.3f}, {summary['at_target_graph']}/{summary['rows']}"
            f" rows >= {summary['target']}x"
        )
    return line


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import add_launch_arg, add_shape_plans_arg, launch_workers

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.layers", description=__doc__.split("\n\n")[0]
    )
    add_launch_arg(parser)
    parser.add_argument("--cuda", action="store_true", help="GPUs (cuda transport, NCCL)")
    parser.add_argument("--out", default=str(REPO / "bench_results"), help="output folder")
    parser.add_argument("--full", action="store_true", help="T = 4096, 8192 and 16384")
    parser.add_argument("--shapes", default="", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--tokens", default="", help="comma-separated token counts T")
    parser.add_argument("--dtypes", default="bf16,fp8", help="bf16, fp8 or both")
    parser.add_argument("--modules", default=",".join(MODULES), help=f"of {MODULES}")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--graph", action="store_true",
        help="GPUs: also each module with its forward and backward replayed as CUDA graphs "
        "(overlap.layers.make_graphed_callables), with userbuffers and with ub=None",
    )  # fmt: skip
    add_shape_plans_arg(parser)
    args = parser.parse_args(argv)
    if args.launch:
        return launch_workers(
            "benchmarks.layers", args.launch, sys.argv[1:] if argv is None else argv
        )
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

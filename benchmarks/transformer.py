"""The transformer-layer benchmark: one pre-norm layer, forward + backward, tensor- and
sequence-parallel over every rank, against the same layer without overlap, PyTorch's own
tensor parallelism and TransformerEngine.

Usage (under mpirun; ``--launch N`` starts N ranks itself)::

    python -m benchmarks.transformer --launch 2 --cuda --out bench_results [--full]  # GPUs
    python -m benchmarks.transformer --launch 2 --out bench_results                  # host

Columns, measured in one run on the same GPUs (docs/design.md §9):

* ``ours``: :class:`overlap.layers.TransformerLayer` with ``initialize_ub`` defaults;
* ``ub=None``: the same layer with plain NCCL collectives;
* ``torch eager`` / ``torch compile`` / ``torch async-TP``: the same layer in plain PyTorch
  (nn.Linear, RMSNorm, scaled_dot_product_attention) parallelised with DTensor's
  ``parallelize_module`` (column/row-wise linears, sequence-parallel norms, as torchtitan
  does), eager, compiled with ``torch.compile``, and compiled with async-TP
  (``torch._inductor.config._micro_pipeline_tp``, symmetric memory without multicast). BF16
  only: PyTorch's FP8 training needs torchao, which the rows say when it is missing;
* ``TE``: TransformerEngine's ``TransformerLayer``, or "n/a" with the reason (not installed);
* ``floor``: one rank's compute alone (NOTE [compute floor]); ``None/floor`` is the most any
  overlap can gain over ``ub=None``, ``ours/floor`` what ours leaves exposed.

NOTE [compute floor]: the floor runs our layer on a TP group of this rank alone, at one rank's
share of the layer (1/tp of the heads, key/value heads and FFN; the full hidden size; all T
tokens), with no userbuffers: every GEMM and the attention have a TP rank's shapes, and there
is no communication (a group of one copies where a gather would run, a few tens of us per
step). Its norms and residual adds run on T tokens instead of T/tp, so the floor is slightly
above the true one. Verdict: a target over ``ub=None`` above ``None/floor`` cannot be met by
hiding communication; the row then needs less compute (fusions, FP8) instead.

Shapes: Llama-3-70B (hidden 8192, FFN 28672, 64 query / 8 KV heads of 128), Llama-3-8B (4096,
14336, 32 / 8) and Qwen2.5-32B (5120, 27648, 40 / 8); SwiGLU, RMSNorm, causal, no biases.
The quick default runs Llama-3-70B at T = 8192; ``--full`` every shape at T = 4096, 8192
and 16384; T tokens are sequences of 4096 (``--seq``). BF16 and
FP8 (current scaling). Step time: median of ``--iters`` forward + backward steps after
warm-up (the optimizer step excluded), back to back as a training loop runs them (NOTE [step
timing] in benchmarks/common.py), max over ranks; the host's time to issue a step (ours and
ub=None: near the step time, the row is host-bound); tokens/s; speed-up over
``ub=None``; peak memory; userbuffer bytes per rank. On the host transport (no GPU): tiny
shapes, ours and ``torch eager`` only, a smoke run. Outputs ``transformer.json`` /
``.txt`` / ``.png``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.common import StepTiming

REPO = Path(__file__).resolve().parents[1]

# name -> (hidden, ffn, query heads, kv heads, head_dim)
SHAPES = {
    "llama3-70b": (8192, 28672, 64, 8, 128),
    "llama3-8b": (4096, 14336, 32, 8, 128),
    "qwen2.5-32b": (5120, 27648, 40, 8, 128),
}
TINY = (64, 128, 8, 4, 8)
TARGET_SPEEDUP = 1.12  # over ub=None (docs/design.md §6)
COLUMNS = ("ours", "none", "torch_eager", "torch_compile", "torch_async_tp", "te", "floor")
GRAPHED = ("ours_graph", "none_graph", "floor_graph")  # --graph's columns
PEERS = ("torch_eager", "torch_compile", "torch_async_tp", "te")


# ---- the plain PyTorch layer (the peers' baseline) -------------------------------------------


def torch_layer(dims: tuple[int, ...], device: Any) -> Any:
    """The layer in plain PyTorch, batch-first ``[b, s, H]``, laid out as torchtitan's
    (``attention.wq/wk/wv/wo``, ``feed_forward.w1/w2/w3``) for its TP plan."""
    import torch
    from torch import nn

    hidden, ffn, heads, groups, d = dims
    kw = {"bias": False, "device": device, "dtype": torch.bfloat16}

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq = nn.Linear(hidden, heads * d, **kw)
            self.wk = nn.Linear(hidden, groups * d, **kw)
            self.wv = nn.Linear(hidden, groups * d, **kw)
            self.wo = nn.Linear(heads * d, hidden, **kw)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q = self.wq(x).view(b, s, -1, d).transpose(1, 2)  # the local heads under TP
            k = self.wk(x).view(b, s, -1, d).transpose(1, 2)
            v = self.wv(x).view(b, s, -1, d).transpose(1, 2)
            o = nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1]
            )
            return self.wo(o.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(hidden, ffn, **kw)
            self.w3 = nn.Linear(hidden, ffn, **kw)
            self.w2 = nn.Linear(ffn, hidden, **kw)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm = nn.RMSNorm(hidden, eps=1e-5, device=device, dtype=torch.bfloat16)
            self.attention = Attention()
            self.ffn_norm = nn.RMSNorm(hidden, eps=1e-5, device=device, dtype=torch.bfloat16)
            self.feed_forward = FeedForward()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    return Block()


def parallelize_torch(block: Any, mesh: Any) -> Any:
    """torchtitan's TP + sequence-parallel plan for one block."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return parallelize_module(block, mesh, plan)


# ---- timing ----------------------------------------------------------------------------------


def time_steps(step: Callable[[], None], *, iters: int, warmup: int, cuda: bool) -> StepTiming:
    """``step()``'s timing (NOTE [step timing] in benchmarks/common.py)."""
    from benchmarks.common import time_training_steps

    return time_training_steps(step, iters=iters, warmup=warmup, cuda=cuda)


def _ours_step(dims, tokens, seq, ub, fp8, device, group=None, graph=False) -> Callable[[], None]:  # noqa: PLR0917
    """One forward + backward of our layer (the weights' gradients dropped after it);
    ``graph``: the layer's forward and backward replayed as CUDA graphs (NOTE [graphed
    layers] in overlap/layers/graphs.py)."""
    import torch
    import torch.distributed as dist

    from benchmarks.common import as_after_optimizer_step
    from overlap.layers import Fp8Recipe, TransformerLayer, fp8_autocast, make_graphed_callables

    hidden, ffn, heads, groups, d = dims
    tp = dist.get_world_size(group)
    torch.manual_seed(0)
    layer = TransformerLayer(
        hidden, ffn, heads, num_query_groups=groups, head_dim=d, ub=ub, tp_group=group,
        params_dtype=torch.bfloat16, device=device,
    )  # fmt: skip
    x = torch.randn(seq // tp, tokens // seq, hidden, dtype=torch.bfloat16, device=device)
    x.requires_grad_()
    recipe = Fp8Recipe() if fp8 else None
    gy = torch.randn_like(x)
    if graph:
        make_graphed_callables(layer, (x,), fp8_recipe=recipe)

    def step() -> None:
        with fp8_autocast(recipe, enabled=fp8):
            y = layer(x)
        y.backward(gy)
        x.grad = None
        as_after_optimizer_step(layer.parameters())  # NOTE [weights change every step]

    return step


def _ours(dims, tokens, seq, ub, fp8, device, args, group=None, graph=False) -> StepTiming:  # noqa: PLR0917
    step = _ours_step(dims, tokens, seq, ub, fp8, device, group, graph)
    return time_steps(step, iters=args.iters, warmup=args.warmup, cuda=device.type == "cuda")


def local_dims(dims: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """One rank's share of a layer: the same hidden size and head size, 1/tp of the FFN, the
    query heads and the key/value heads (NOTE [compute floor])."""
    hidden, ffn, heads, groups, d = dims
    return (hidden, ffn // tp, heads // tp, groups // tp, d)


def _torch(dims, tokens, seq, mode, device, args) -> StepTiming:  # noqa: PLR0917
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    tp = dist.get_world_size()
    mesh = init_device_mesh(device.type, (tp,))
    torch.manual_seed(0)
    block = parallelize_torch(torch_layer(dims, device), mesh)
    if mode in ("compile", "async_tp"):
        import torch._inductor.config as inductor_config

        inductor_config._micro_pipeline_tp = mode == "async_tp"
        if mode == "async_tp":
            from torch.distributed import _symmetric_memory as symm_mem

            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(mesh.get_group().group_name)
        torch._dynamo.reset()
        block = torch.compile(block)
    x = torch.randn(tokens // seq, seq // tp, dims[0], dtype=torch.bfloat16, device=device)
    x.requires_grad_()
    gy = torch.randn_like(x)

    def step() -> None:
        block(x).backward(gy)
        x.grad = None
        for p in block.parameters():
            p.grad = None

    try:
        return time_steps(step, iters=args.iters, warmup=args.warmup, cuda=device.type == "cuda")
    finally:
        if mode == "async_tp":
            import torch._inductor.config as inductor_config

            inductor_config._micro_pipeline_tp = False


def _te_unavailable() -> str | None:
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # any import failure is a reason to report
        return f"transformer_engine does not import ({type(exc).__name__})"
    return "TransformerEngine's layer is not wired into this benchmark yet"


def _torch_fp8_unavailable() -> str:
    try:
        import torchao.float8  # noqa: F401
    except Exception as exc:
        return f"PyTorch FP8 training needs torchao ({type(exc).__name__})"
    return "torchao float8 is not wired into this benchmark yet"


def run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import overlap
    from benchmarks.common import StepTiming, max_over_ranks, min_clock, profile_host
    from overlap.launch import init_torch_distributed

    cuda = args.cuda
    launch = init_torch_distributed("nccl" if cuda else "gloo")
    device = torch.device("cuda", launch.local_rank) if cuda else torch.device("cpu")
    tp, rank = dist.get_world_size(), dist.get_rank()
    shapes = args.shapes.split(",") if args.shapes else (
        list(SHAPES) if args.full else ["llama3-70b"]
    )  # fmt: skip
    if not cuda:
        shapes = shapes[:1]  # one tiny stand-in
    tokens_list = [int(t) for t in args.tokens.split(",")] if args.tokens else (
        [4096, 8192, 16384] if args.full else [8192]
    )  # fmt: skip
    dtypes = args.dtypes.split(",")
    te_reason = _te_unavailable()
    # NOTE [compute floor]: one group of this rank alone (every rank creates every group).
    alone = [dist.new_group([r]) for r in range(tp)][rank]
    tracer = None
    if args.trace:
        from benchmarks.common import device_barrier
        from benchmarks.trace import Tracer

        tracer = Tracer(Path(args.out), device_barrier(), calls=1)
    rows: list[dict[str, Any]] = []
    total = len(shapes) * len(tokens_list) * len(dtypes)
    t0 = time.monotonic()
    for shape in shapes:
        dims = SHAPES[shape] if cuda else TINY
        for tokens in tokens_list if cuda else [16 * tp]:
            seq = min(args.seq, tokens) if cuda else 8 * tp
            for dtype in dtypes:
                fp8 = dtype == "fp8"
                row: dict[str, Any] = {
                    "shape": shape if cuda else "tiny", "tp": tp, "tokens": tokens, "seq": seq,
                    "dtype": dtype,
                }  # fmt: skip
                ub = overlap.initialize_ub(
                    (tokens, dims[0]), dist.group.WORLD, torch.bfloat16, use_fp8=fp8,
                    transport="cuda" if cuda else "host", register=False,
                    shape_plans=args.shape_plans,
                )  # fmt: skip
                row["ub_bytes"] = ub.total_bytes
                reasons: dict[str, str] = {}
                local = local_dims(dims, tp)
                runs = {
                    "ours": partial(_ours, dims, tokens, seq, ub, fp8, device, args),
                    "none": partial(_ours, dims, tokens, seq, None, fp8, device, args),
                    "floor": partial(_ours, local, tokens, seq, None, fp8, device, args, alone),
                    **(
                        {
                            "ours_graph": partial(
                                _ours, dims, tokens, seq, ub, fp8, device, args, graph=True
                            ),
                            "none_graph": partial(
                                _ours, dims, tokens, seq, None, fp8, device, args, graph=True
                            ),
                            "floor_graph": partial(
                                _ours, local, tokens, seq, None, fp8, device, args, alone, True
                            ),
                        }
                        if args.graph and cuda
                        else {}
                    ),
                    **{
                        f"torch_{mode}": partial(_torch, dims, tokens, seq, mode, device, args)
                        for mode in ("eager", "compile", "async_tp")
                    },
                }
                for col, fn in runs.items():
                    if args.columns and col not in args.columns.split(","):
                        reasons[col] = "not asked for (--columns)"
                        continue
                    if col.startswith("torch") and fp8:
                        reasons[col] = _torch_fp8_unavailable()
                        continue
                    if col in ("torch_compile", "torch_async_tp") and not cuda:
                        reasons[col] = "GPUs only"
                        continue
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                    error = None
                    nan = float("nan")
                    try:
                        timing = fn()
                    except Exception as exc:  # a peer's failure is a row's note, not a crash
                        timing = StepTiming(nan, nan, nan)
                        error = f"{type(exc).__name__}: {str(exc)[:160]}"
                    failed = max_over_ranks(0.0 if error is None else 1.0)
                    if failed:
                        reasons[col] = error or "failed on another rank"
                        continue
                    row[f"ms_{col}"] = max_over_ranks(timing.ms)
                    row[f"host_ms_{col}"] = max_over_ranks(timing.host_ms)
                    row[f"sm_mhz_{col}"] = min_clock(timing.sm_mhz)
                    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0.0
                    row[f"peak_mb_{col}"] = max_over_ranks(peak)
                if args.host_profile and "ms_ours" in row:
                    label = f"{shape}-T{tokens}-tp{tp}-{dtype}"
                    for col, handle in (("ours", ub), ("none", None)):
                        text = profile_host(_ours_step(dims, tokens, seq, handle, fp8, device))
                        if rank == 0:
                            path = Path(args.out) / f"host_profile-{label}-{col}.txt"
                            path.write_text(text)
                if tracer is not None and "ms_ours" in row and "ms_none" in row:
                    label = f"transformer-{shape}-T{tokens}-tp{tp}-{dtype}"
                    traced = tracer.record(label, {
                        "ours": _ours_step(dims, tokens, seq, ub, fp8, device),
                        "ub=None": _ours_step(dims, tokens, seq, None, fp8, device),
                        "floor": _ours_step(local, tokens, seq, None, fp8, device, alone),
                    })  # fmt: skip
                    row["trace"] = {k: v for k, v in traced.items() if k != "file"}
                    row["trace_file"] = traced["file"]
                row["shape_plans"] = ub.plans.describe()[1:]
                gc.collect()  # free graphed layers (--graph) before the buffers their graphs use
                ub.destroy()
                reasons["te"] = te_reason or ""
                row["na"] = reasons
                if "ms_ours" in row and "ms_none" in row:
                    row["speedup"] = row["ms_none"] / row["ms_ours"]
                    row["tokens_per_s"] = tokens / row["ms_ours"] * 1e3
                if "ms_ours_graph" in row and "ms_none_graph" in row:
                    row["speedup_graph"] = row["ms_none_graph"] / row["ms_ours_graph"]
                if "ms_floor_graph" in row and "ms_none_graph" in row:
                    row["none_graph_over_floor_graph"] = (
                        row["ms_none_graph"] / row["ms_floor_graph"]
                    )
                if "ms_floor" in row:
                    for col in ("ours", "none"):
                        if f"ms_{col}" in row:
                            row[f"{col}_over_floor"] = row[f"ms_{col}"] / row["ms_floor"]
                peers = [row[f"ms_{c}"] for c in PEERS if f"ms_{c}" in row]
                row["vs_best_peer"] = (
                    min(peers) / row["ms_ours"] if peers and "ms_ours" in row else None
                )
                rows.append(row)
                if rank == 0:
                    eta = (time.monotonic() - t0) / len(rows) * (total - len(rows))
                    ours, none = row.get("ms_ours", float("nan")), row.get("ms_none", float("nan"))
                    graphed = "".join(
                        f", {name} {row[f'ms_{col}']:.2f} ms"
                        for col, name in (("ours_graph", "graphed"), ("none_graph", "None graphed"))
                        if f"ms_{col}" in row
                    )
                    print(
                        f"[transformer] {len(rows)}/{total} {shape} T={tokens} {dtype}: ours "
                        f"{ours:.2f} ms, ub=None {none:.2f} ms{graphed} (ETA {eta:.0f} s)",
                        flush=True,
                    )
    if rank == 0:
        _report(rows, args, cuda, tp, time.monotonic() - t0)
    dist.barrier()
    dist.destroy_process_group()


def summarize(rows: list[dict[str, Any]], cuda: bool) -> dict[str, Any]:
    """Rows, median / worst speed-up over ub=None, rows at the target, rows faster than the
    fastest peer measured."""
    ups = sorted(r["speedup"] for r in rows if r.get("speedup") is not None)
    peers = [r["vs_best_peer"] for r in rows if r.get("vs_best_peer") is not None]
    if not ups:
        return {"rows": 0}
    return {
        "rows": len(rows),
        "median_speedup": statistics.median(ups),
        "min_speedup": ups[0],
        "at_target": sum(u >= TARGET_SPEEDUP for u in ups) if cuda else None,
        "target": TARGET_SPEEDUP,
        "faster_than_peers": sum(p > 1.0 for p in peers) if cuda else None,
        "rows_with_peers": len(peers),
        **_graph_summary(rows, cuda),
    }


def _graph_summary(rows: list[dict[str, Any]], cuda: bool) -> dict[str, Any]:
    """The graphed columns' speed-up over graphed ub=None (``--graph``)."""
    ups = sorted(r["speedup_graph"] for r in rows if r.get("speedup_graph") is not None)
    if not ups:
        return {}
    return {
        "median_speedup_graph": statistics.median(ups),
        "min_speedup_graph": ups[0],
        "at_target_graph": sum(u >= TARGET_SPEEDUP for u in ups) if cuda else None,
        "rows_graph": len(ups),
    }


def summary_line(s: dict[str, Any]) -> str:
    if not s.get("rows"):
        return "no rows"
    line = (
        f"{s['rows']} rows, speed-up over ub=None: median {s['median_speedup']:.3f}, worst "
        f"{s['min_speedup']:.3f}"
    )
    if s.get("at_target") is None:
        return line + " (host transport: timed, not measured against the targets)"
    line += (
        f"; {s['at_target']}/{s['rows']} rows >= {s['target']}x; faster than the "
        f"fastest peer measured on {s['faster_than_peers']}/{s['rows_with_peers']} rows"
    )
    if "median_speedup_graph" in s:
        line += (
            f"; graphed over graphed ub=None: median {s['median_speedup_graph']:.3f}, worst "
            f"{s['min_speedup_graph']:.3f}, {s['at_target_graph']}/{s['rows_graph']} rows >= "
            f"{s['target']}x"
        )
    return line


def _report(rows: list[dict[str, Any]], args: argparse.Namespace, cuda: bool, tp: int,
            seconds: float) -> None:  # fmt: skip
    import torch

    from benchmarks.common import environment, format_table, print_paths, write_outputs
    from benchmarks.plot import plot_times

    device_name = torch.cuda.get_device_name() if cuda else "cpu (host transport)"
    columns = [
        ("shape", "shape"), ("tp", "tp"), ("tokens", "T"), ("seq", "seq"), ("dtype", "dtype"),
        ("ms_ours", "ours"), ("ms_none", "ub=None"), ("ms_torch_eager", "torch eager"),
        ("ms_torch_compile", "torch compile"), ("ms_torch_async_tp", "+async-TP"),
        ("ms_te", "TE"), ("ms_floor", "floor"), ("speedup", "ours vs None"),
        ("none_over_floor", "None/floor"), ("ours_over_floor", "ours/floor"),
        ("vs_best_peer", "best peer/ours"),
        ("host_ms_ours", "host ms ours"), ("host_ms_none", "host ms None"),
        ("sm_mhz_ours", "MHz ours"), ("sm_mhz_none", "MHz None"), ("sm_mhz_floor", "MHz floor"),
        ("tokens_per_s", "tokens/s"), ("peak_mb_ours", "peak MiB"), ("ub_bytes", "ub bytes"),
    ]  # fmt: skip
    if args.graph:  # after the step columns: graphed ours, graphed ub=None, their ratio
        columns[11:11] = [
            ("ms_ours_graph", "ours graphed"), ("ms_none_graph", "None graphed"),
            ("ms_floor_graph", "floor graphed"), ("speedup_graph", "graphed vs None graphed"),
            ("none_graph_over_floor_graph", "None/floor graphed"),
            ("host_ms_ours_graph", "host ms graphed"),
        ]  # fmt: skip
    header = (
        f"one transformer layer, forward + backward, {device_name} x {tp} (TP {tp}), ms: median "
        f"of {args.iters} steps, max over ranks"
        + ("" if cuda else " (host transport, tiny shapes: a smoke run, not a measurement)")
    )
    notes = sorted({f"{c}: {why}" for r in rows for c, why in r["na"].items() if why})
    summary = summarize(rows, cuda)
    text = "\n".join(
        [header, format_table(rows, columns), "n/a: " + "; ".join(notes) if notes else "",
         f"summary: {summary_line(summary)}"]
    )  # fmt: skip
    payload = {"environment": environment(cuda), "tp": tp, "rows": rows, "summary": summary}
    out = Path(args.out)
    json_path, table_path = write_outputs(out, "transformer", payload, text)
    for row in rows:
        row["floor"] = row.get("ms_none")
    plot = plot_times(
        [r for r in rows if r.get("floor")], ("shape", "tokens", "dtype"),
        [("ms_ours", "ours"), ("ms_none", "ub=None"), ("ms_torch_compile", "torch compile"),
         ("ms_torch_async_tp", "torch async-TP")],
        out / "transformer.png", f"{header}: time / ub=None time",
        target=1 / TARGET_SPEEDUP if cuda else None,
    )  # fmt: skip
    print_paths(json_path, seconds, table_path, plot)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import add_launch_arg, add_shape_plans_arg, launch_workers

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transformer", description=__doc__.split("\n\n")[0]
    )
    add_launch_arg(parser)
    parser.add_argument("--cuda", action="store_true", help="GPUs (cuda transport, NCCL)")
    parser.add_argument("--out", default=str(REPO / "bench_results"), help="output folder")
    parser.add_argument("--full", action="store_true", help="T = 4096, 8192 and 16384")
    parser.add_argument("--shapes", default="", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--tokens", default="", help="comma-separated token counts T")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (T = seq x b)")
    parser.add_argument("--dtypes", default="bf16,fp8", help="bf16, fp8 or both")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--trace", action="store_true",
        help="GPUs: after each row, one step of ours, ub=None and the floor under torch.profiler, "
        "every rank on one axis, with rank 0's GPU time by stream and kernel: "
        "OUT/traces/<row>.txt",
    )  # fmt: skip
    parser.add_argument(
        "--columns", default="",
        help="comma-separated subset of the columns to time (default: all), of "
        f"{(*COLUMNS, *GRAPHED)}",
    )  # fmt: skip
    parser.add_argument(
        "--graph", action="store_true",
        help="GPUs: three more columns, ours, ub=None and the floor with the layer's forward and "
        "backward replayed as CUDA graphs (overlap.layers.make_graphed_callables): the step "
        "without Python's host time",
    )  # fmt: skip
    parser.add_argument(
        "--host-profile", action="store_true",
        help="after each row, cProfile 5 steps of ours and of ub=None on every rank; rank 0's "
        "profile goes to OUT/host_profile-<row>-<column>.txt (where the host time goes)",
    )  # fmt: skip
    add_shape_plans_arg(parser)
    args = parser.parse_args(argv)
    unknown = sorted(set(filter(None, args.columns.split(","))) - {*COLUMNS, *GRAPHED})
    if unknown:
        parser.error(f"--columns: unknown {unknown}; of {(*COLUMNS, *GRAPHED)}")
    if args.trace and not args.cuda:
        parser.error("--trace records GPU timelines (CUPTI): it needs --cuda")
    if args.launch:
        argv = sys.argv[1:] if argv is None else argv
        return launch_workers("benchmarks.transformer", args.launch, argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host time per training step of each layer, on one process: what the Python side costs.

``python -m benchmarks.host_time [--cuda] [--iters 200]`` builds each layer at tiny sizes
(hidden 32, FFN 64, 16 tokens) on a tensor-parallel group of this process alone (``ub=None``;
gloo on CPU, NCCL on a GPU) and prints the median host microseconds of one forward +
backward, BF16 and FP8 (current scaling).

``--ops`` instead measures the host time of one call of each overlap op (AG+GEMM, GEMM+RS,
the bulk pair; tiny shapes on a group of one rank; ``--cuda``: the cuda transport on GPU 0;
under mpirun or ``--launch N``: the group of all ranks)
after its first call: the Python and binding overhead per op (NOTE [op plans] in
``overlap/ops/_operands.py``), beside the same call with its native function replaced by a
no-op (the Python alone) and one plain GEMM of the same shape (the host cost of a GEMM, paid
once per weight and chunk); ``--op-shape 1,16,16`` leaves next to no host GEMM in a CPU
figure; a ``torch.mm`` row gives torch's own host cost for the GEMM. On a group of N ranks a
row is the host time of one op at TP N (every chunk's GEMM, put and handshake), the maximum
over ranks. ``--ub`` (under mpirun, or ``--launch N``) measures each layer with a
``Userbuffers`` handle (``initialize_ub``; the host transport, or cuda with
``--cuda``) beside the same layer with ``ub=None``, the maximum over ranks.

With ``--cuda`` the GPU runs the kernels and the figure is the host's time to issue them. On
CPU the core's GEMMs and casts run on the host (their reference implementations) and
PyTorch's attention on the CPU, so a CPU figure also holds that compute (most of
TransformerLayer's). A row's time is the floor under which no step of that layer can go
while Python issues it (NOTE [step timing] in ``benchmarks/common.py``: a step shorter than
this is bound by the host). JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

MODULES = ("LayerNormLinear", "RowParallelLinear", "LayerNormMLP", "TransformerLayer")


def _layer(name: str, device: Any, *, tp_group: Any = None, ub: Any = None,
           tp: int = 1) -> tuple[Any, tuple[int, ...]]:  # fmt: skip
    """Layer ``name`` at tiny sizes and its input's shape (sequence-parallel: ``16`` tokens per
    rank, ``16 * tp`` into a row-parallel linear)."""
    import torch

    from overlap import layers

    common: dict[str, Any] = {"params_dtype": torch.bfloat16, "device": device}
    if ub is not None or tp_group is not None:
        common.update(tp_group=tp_group, ub=ub)
    if name == "LayerNormLinear":
        return layers.LayerNormLinear(32, 64, normalization="RMSNorm", bias=False,
                                      **({"gemm": "qkv"} if ub else {}), **common), (
            16, 32)  # fmt: skip
    if name == "RowParallelLinear":
        return layers.RowParallelLinear(64, 32, bias=False, **({"gemm": "proj"} if ub else {}),
                                        **common), (16 * tp, 64 // tp)  # fmt: skip
    if name == "LayerNormMLP":
        return layers.LayerNormMLP(32, 64, activation="swiglu", normalization="RMSNorm",
                                   bias=False, **common), (16, 32)  # fmt: skip
    return layers.TransformerLayer(32, 64, 8, num_query_groups=4, head_dim=8, **common), (
        16, 1, 32)  # fmt: skip


def measure(name: str, fp8: bool, device: Any, iters: int) -> float:
    """Median host us of one forward + backward of ``name``."""
    import torch

    from overlap.layers import Fp8Recipe, fp8_autocast

    torch.manual_seed(0)
    layer, shape = _layer(name, device)
    x = torch.randn(shape, dtype=torch.bfloat16, device=device, requires_grad=True)
    recipe = Fp8Recipe() if fp8 else None
    times = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        with fp8_autocast(recipe, enabled=fp8):
            y = layer(x)
        y.sum().backward()
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e6)
        x.grad = None
        layer.zero_grad(set_to_none=True)
        if device.type == "cuda" and i % 20 == 19:
            torch.cuda.synchronize()  # never let the queue grow without bound
    return statistics.median(times)


OPS = ("ag_gemm", "ag_gemm_fp8", "ag_gemm_3w", "gemm_rs", "ag_beside_gemm", "rs_beside_gemm")
# The native function each op row calls (the "python us" column replaces it by a no-op).
NATIVE = {"ag_gemm": "ag_gemm", "gemm_rs": "gemm_rs", "ag_beside_gemm": "all_gather_beside_gemm",
          "rs_beside_gemm": "reduce_scatter_beside_gemm"}  # fmt: skip


def _median_us(call: Any, iters: int, cuda: bool) -> float:
    """Median host us of ``call()`` after 20 warm-up calls (the first plans it)."""
    import torch

    times = []
    for i in range(iters + 20):
        t0 = time.perf_counter()
        call()
        if i >= 20:
            times.append((time.perf_counter() - t0) * 1e6)
        if cuda and i % 20 == 19:
            torch.cuda.synchronize()  # never let the queue grow without bound
    return statistics.median(times)


def measure_op(
    name: str, device: Any, iters: int, shape: tuple[int, int, int] = (16, 64, 32)
) -> dict[str, Any]:
    """Median host us of one call of overlap op ``name`` (tiny shapes, this rank's group):
    ``host_us``, the whole call; ``python_us``, the same call with the op's native function
    replaced by a no-op (what the Python around it costs: NOTE [op plans]); ``gemm``: one
    plain :func:`overlap.gemm.gemm` of the ops' GEMM shape (the host cost of one GEMM, which
    every op pays once per weight and chunk). ``shape``: ``(m, k, n)``, the shard's rows and
    columns and the weight's rows."""
    import torch
    import torch.distributed as dist

    from overlap import ops
    from overlap._native import native
    from overlap.comm import Communicator, TorchBootstrap
    from overlap.gemm import gemm
    from overlap.quantization import CurrentScalingConfig, make_quantizer

    cuda = device.type == "cuda"
    m, k, n = shape
    bf16 = torch.bfloat16
    x = torch.randn(m, k, dtype=bf16, device=device)
    w = torch.randn(n, k, dtype=bf16, device=device)
    if name == "gemm":
        return {"op": name, "host_us": _median_us(lambda: gemm(x, w, transb=True), iters, cuda)}
    if name == "torch.mm":  # torch's own cuBLAS GEMM: what issuing a GEMM costs torch's host
        return {"op": name, "host_us": _median_us(lambda: torch.mm(x, w.t()), iters, cuda)}
    comm = Communicator(TorchBootstrap(dist.group.WORLD), "cuda" if cuda else "host")
    tp = comm.group.size
    try:
        if name.startswith("ag_gemm"):
            fp8 = name.endswith("fp8")
            op = ops.AllGatherGemm(comm, m * tp, k, torch.float8_e4m3fn if fp8 else bf16)
            if fp8:
                q = make_quantizer(CurrentScalingConfig(), columnwise=False)
                xq, wq = q.quantize(x), q.quantize(w)
                call = lambda: op(xq, wq)  # noqa: E731
            else:
                ws = [w, w, w] if name.endswith("3w") else w
                call = lambda: op(x, ws)  # noqa: E731
        elif name == "gemm_rs":
            op = ops.GemmReduceScatter(comm, m * tp, n, bf16)
            call = lambda: op(x, w)  # noqa: E731
        elif name == "ag_beside_gemm":
            op = ops.AllGatherBesideGemm(comm, m * tp, k, bf16)
            call = lambda: op(x, x, w, transb=True)  # noqa: E731
        else:
            op = ops.ReduceScatterBesideGemm(comm, m * tp, k, bf16)
            xs = torch.randn(m * tp, k, dtype=bf16, device=device)
            call = lambda: op(xs, x, w, transb=True)  # noqa: E731
        row = {"op": name, "host_us": _median_us(call, iters, cuda)}
        comm_ops = native().comm_ops
        native_name = NATIVE[name.removesuffix("_fp8").removesuffix("_3w")]
        real = getattr(comm_ops, native_name)
        setattr(comm_ops, native_name, lambda *args, **kwargs: None)
        try:
            row["python_us"] = _median_us(call, iters, cuda)
        finally:
            setattr(comm_ops, native_name, real)
        return row
    finally:
        if cuda:
            torch.cuda.synchronize()
        op.destroy()
        comm.destroy()


def _training_step(layer: Any, x: Any, recipe: Any, fp8: bool) -> Any:
    """One forward + backward of ``layer`` on ``x``, gradients cleared after it."""
    from overlap.layers import fp8_autocast

    def step() -> None:
        with fp8_autocast(recipe, enabled=fp8):
            y = layer(x)
        y.sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return step


def measure_ub(name: str, fp8: bool, device: Any, iters: int) -> tuple[float, float]:
    """Median host us of one forward + backward of ``name`` (tiny) with ``ub=None`` and with a
    ``Userbuffers`` handle of this job's group (collective)."""
    import torch
    import torch.distributed as dist

    import overlap
    from overlap.layers import Fp8Recipe

    tp = dist.get_world_size()
    tokens, hidden = 16 * tp, 32
    ub = overlap.initialize_ub((tokens, hidden), dist.group.WORLD, torch.bfloat16, use_fp8=fp8,
                               transport="cuda" if device.type == "cuda" else "host",
                               register=False)  # fmt: skip
    recipe = Fp8Recipe() if fp8 else None
    out = []
    try:
        for handle in (None, ub):
            torch.manual_seed(0)
            layer, shape = _layer(name, device, tp_group=dist.group.WORLD, ub=handle, tp=tp)
            x = torch.randn(shape, dtype=torch.bfloat16, device=device, requires_grad=True)

            step = _training_step(layer, x, recipe, fp8)
            out.append(_median_us(step, iters, device.type == "cuda"))
            del layer
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize()
        ub.destroy()
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_time",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--cuda", action="store_true", help="run the kernels on GPU 0")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--json", default="", help="write the rows here")
    parser.add_argument("--ops", action="store_true", help="per-op host time of the overlap ops")
    parser.add_argument(
        "--op-shape", default="16,64,32", help="--ops: M,K,N (1,16,16: almost no host GEMM)"
    )
    parser.add_argument(
        "--ub",
        action="store_true",
        help="layers with a Userbuffers handle beside ub=None (under mpirun)",
    )
    from benchmarks.common import add_launch_arg, launch_workers

    add_launch_arg(parser)
    args = parser.parse_args(argv)
    if args.launch:
        return launch_workers("benchmarks.host_time", args.launch,
                              sys.argv[1:] if argv is None else argv)  # fmt: skip
    import torch
    import torch.distributed as dist

    from benchmarks.common import format_table
    from overlap.launch import detect_launch_env

    if args.ub or detect_launch_env().world_size > 1:
        from overlap.launch import init_torch_distributed

        launch = init_torch_distributed("nccl" if args.cuda else "gloo")
        device = torch.device("cuda", launch.local_rank) if args.cuda else torch.device("cpu")
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
        dist.init_process_group("nccl" if args.cuda else "gloo", rank=0, world_size=1)
        device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    if args.ops:
        m, k, n = (int(v) for v in args.op_shape.split(","))
        from benchmarks.common import max_over_ranks

        rows = [measure_op(o, device, args.iters, (m, k, n)) for o in (*OPS, "gemm", "torch.mm")]
        for row in rows:  # the slowest rank issues the op (a no-op on a job of one)
            for key in ("host_us", "python_us"):
                if key in row:
                    row[key] = max_over_ranks(row[key])
        if dist.get_rank() == 0:
            print(f"host time per overlap op call, {dist.get_world_size()} rank(s) (the op's "
                  f"group: M rows per rank), {device.type}, M,K,N = {args.op_shape}, median of "
                  f"{args.iters} calls, max over ranks (us); python us: the native op a no-op; "
                  "gemm: one overlap.gemm.gemm of the same shape; torch.mm: torch's")  # fmt: skip
            print(format_table(rows, [("op", "op"), ("host_us", "host us"),
                                      ("python_us", "python us")]))  # fmt: skip
        return _finish(args, device, rows)
    if args.ub:
        from benchmarks.common import max_over_ranks

        rows = []
        for m in MODULES:
            for d in ("bf16", "fp8"):
                none_us, ub_us = measure_ub(m, d == "fp8", device, args.iters)
                rows.append({"module": m, "dtype": d, "none_us": max_over_ranks(none_us),
                             "ub_us": max_over_ranks(ub_us)})  # fmt: skip
        if dist.get_rank() == 0:
            print(f"host time per forward + backward, {dist.get_world_size()} ranks, "
                  f"{device.type}, median of {args.iters} steps, max over ranks (us)")  # fmt: skip
            print(format_table(rows, [("module", "module"), ("dtype", "dtype"),
                                      ("none_us", "ub=None us"), ("ub_us", "ub us")]))  # fmt: skip
        return _finish(args, device, rows)
    rows = [
        {"module": m, "dtype": d, "host_us": measure(m, d == "fp8", device, args.iters)}
        for m in MODULES
        for d in ("bf16", "fp8")
    ]
    print(f"host time per forward + backward, one process, {device.type}, median of "
          f"{args.iters} steps (us)")  # fmt: skip
    print(format_table(rows, [("module", "module"), ("dtype", "dtype"), ("host_us", "host us")]))
    return _finish(args, device, rows)


def _finish(args: argparse.Namespace, device: Any, rows: list[dict[str, Any]]) -> int:
    import torch.distributed as dist

    from benchmarks.common import write_json

    if args.json and dist.get_rank() == 0:
        from pathlib import Path

        write_json(Path(args.json), {"device": device.type, "rows": rows})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

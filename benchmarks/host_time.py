"""Host time per training step of each layer, on one process: what the Python side costs.

``python -m benchmarks.host_time [--cuda] [--iters 200]`` builds each layer at tiny sizes
(hidden 32, FFN 64, 16 tokens) on a tensor-parallel group of this process alone (``ub=None``;
gloo on CPU, NCCL on a GPU) and prints the median host microseconds of one forward +
backward, BF16 and FP8 (current scaling). With ``--cuda`` the GPU runs the kernels and the
figure is the host's time to issue them. On CPU the core's GEMMs and casts run on the host
(their reference implementations) and PyTorch's attention on the CPU, so a CPU figure also
holds that compute (most of TransformerLayer's). A row's time is the floor under which no step
of that layer can go while Python issues it (NOTE [step timing] in ``benchmarks/common.py``:
a step shorter than this is bound by the host). JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

MODULES = ("LayerNormLinear", "RowParallelLinear", "LayerNormMLP", "TransformerLayer")


def _layer(name: str, device: Any) -> tuple[Any, tuple[int, ...]]:
    import torch

    from overlap import layers

    common = {"params_dtype": torch.bfloat16, "device": device}
    if name == "LayerNormLinear":
        return layers.LayerNormLinear(32, 64, normalization="RMSNorm", bias=False, **common), (
            16, 32)  # fmt: skip
    if name == "RowParallelLinear":
        return layers.RowParallelLinear(64, 32, bias=False, **common), (16, 64)
    if name == "LayerNormMLP":
        return layers.LayerNormMLP(32, 64, activation="swiglu", normalization="RMSNorm",
                                   bias=False, **common), (16, 32)  # fmt: skip
    return layers.TransformerLayer(32, 64, 4, num_query_groups=2, head_dim=8, **common), (
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_time",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--cuda", action="store_true", help="run the kernels on GPU 0")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    from benchmarks.common import format_table, write_json

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    dist.init_process_group("nccl" if args.cuda else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    rows = [
        {"module": m, "dtype": d, "host_us": measure(m, d == "fp8", device, args.iters)}
        for m in MODULES
        for d in ("bf16", "fp8")
    ]
    print(f"host time per forward + backward, one process, {device.type}, median of "
          f"{args.iters} steps (us)")  # fmt: skip
    print(format_table(rows, [("module", "module"), ("dtype", "dtype"), ("host_us", "host us")]))
    if args.json:
        from pathlib import Path

        write_json(Path(args.json), {"device": device.type, "rows": rows})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

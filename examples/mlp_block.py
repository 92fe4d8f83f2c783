"""A tensor-parallel MLP block (LayerNormMLP) trained for a few steps, with the overlap on.

Run it under mpirun, one rank per GPU, or on the CPU (the host transport) where there is no
GPU::

    mpirun -np 2 python examples/mlp_block.py            # GPUs if present, else the CPU
    mpirun -np 2 python examples/mlp_block.py --fp8      # FP8 (current scaling)
    mpirun -np 2 python examples/mlp_block.py --no-ub    # plain NCCL / gloo collectives

(as root add ``--allow-run-as-root``, and ``--oversubscribe`` for more ranks than cores). It
prints the loss of every step on rank 0; the loss falls.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import overlap
from overlap.launch import init_torch_distributed
from overlap.layers import Fp8Recipe, LayerNormMLP, fp8_autocast


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fp8", action="store_true", help="FP8 GEMMs (current scaling)")
    parser.add_argument("--no-ub", action="store_true", help="no overlap: plain collectives")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    launch = init_torch_distributed("nccl" if cuda else "gloo")  # binds cuda:<local rank>
    tp, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", launch.local_rank) if cuda else torch.device("cpu")
    hidden, ffn = (4096, 14336) if cuda else (64, 256)
    tokens = 8192 if cuda else 16 * tp  # the whole micro-batch; each rank holds tokens / tp

    torch.manual_seed(1234 + rank)  # each rank its own weight shards and its own tokens
    # The userbuffers of the TP group: one handle serves every layer of a model.
    ub = None
    if not args.no_ub:
        ub = overlap.initialize_ub(
            (tokens, hidden), dist.group.WORLD, torch.bfloat16, use_fp8=args.fp8, register=False
        )
    mlp = LayerNormMLP(
        hidden, ffn, activation="swiglu", normalization="RMSNorm", ub=ub,
        params_dtype=torch.bfloat16, device=device,
    )  # fmt: skip
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-2)
    x = torch.randn(tokens // tp, hidden, dtype=torch.bfloat16, device=device)
    target = torch.randn_like(x)
    for step in range(args.steps):
        with fp8_autocast(Fp8Recipe(), enabled=args.fp8):
            y = mlp(x)  # [tokens / tp, hidden]: this rank's rows of the output
        loss = torch.nn.functional.mse_loss(y.float(), target.float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}: loss {total.item() / tp:.5f}", flush=True)
    if ub is not None:
        ub.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

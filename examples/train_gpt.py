"""Train a small GPT with tensor parallelism (and data parallelism) on synthetic tokens.

Embedding, ``--layers`` :class:`~overlap.layers.TransformerLayer` s (one userbuffers handle
for all of them), a final RMSNorm, the LM head and cross-entropy. TP runs over the ranks of
one host (``--tp``, default: every local rank), data parallelism over the rest. Run it under
mpirun::

    mpirun -np 2 python examples/train_gpt.py                 # GPUs if present, else the CPU
    mpirun -np 4 python examples/train_gpt.py --tp 2 --fp8    # TP 2 x DP 2, FP8
    mpirun -np 2 python examples/train_gpt.py --no-ub         # no overlap (NCCL / gloo)
    mpirun -np 2 python examples/train_gpt.py --compare       # also train it on one process
    mpirun -np 4 python examples/train_gpt.py --cuda-graph    # layers replayed as CUDA graphs

(as root add ``--allow-run-as-root``, and ``--oversubscribe`` for more ranks than cores). Rank
0 prints the loss, tokens/s and, on GPUs, the model FLOPs utilisation of every step.
``--compare`` trains the same model (the same initial weights, the same batches) as plain
single-process torch on every rank beside it and prints both losses and their largest
relative difference. ``--cuda-graph`` (GPUs) captures the transformer layers' forward and
backward as CUDA graphs once (:func:`overlap.layers.make_graphed_callables`) and replays them
every step: the host no longer issues each layer's kernels from Python.

The data is learnable: each sequence counts up from a random token (modulo the vocabulary),
so the next token is the current one plus one and the loss falls quickly. Replicated
parameters (embedding, norms, LM head) see only this rank's tokens: their gradients are
summed over the TP group (the layers do it for theirs), then every gradient is averaged over
the data-parallel group.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.distributed as dist

import overlap
from overlap.launch import init_torch_distributed
from overlap.layers import (
    Fp8Recipe,
    TensorParallelGroup,
    TransformerLayer,
    all_reduce_grad,
    fp8_autocast,
    make_graphed_callables,
    release_graphs,
)
from overlap.layers import reference as ref

# Dense peak FLOP/s of one GPU, by name (the datasheets' BF16 and FP8 tensor-core figures).
PEAK = {"H100": (989e12, 1979e12), "H200": (989e12, 1979e12)}


class GPT(torch.nn.Module):
    """Embedding -> transformer layers -> RMSNorm -> LM head, sequence-parallel inside."""

    def __init__(self, args: argparse.Namespace, tp: TensorParallelGroup, ub: Any, device: Any):
        super().__init__()
        self.tp = tp
        f32 = {"dtype": torch.float32, "device": device}
        self.embedding = torch.nn.Embedding(args.vocab, args.hidden, **f32)
        self.layers = torch.nn.ModuleList(_layer(args, tp, ub, device) for _ in range(args.layers))
        self.norm = torch.nn.Parameter(torch.ones(args.hidden, **f32))
        self.head = torch.nn.Linear(args.hidden, args.vocab, bias=False, **f32)
        torch.nn.init.normal_(self.embedding.weight, std=0.02)
        torch.nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of this rank's share of the tokens ``[b, s]`` (its
        sequence shard): ``[s/tp, b]`` of the ``[s, b]`` layout."""
        s = tokens.shape[1]
        n, r = self.tp.size, self.tp.rank
        local = slice(r * s // n, (r + 1) * s // n)
        emb = all_reduce_grad(self.embedding.weight, self.tp)
        x = torch.nn.functional.embedding(tokens.t()[local], emb).bfloat16()  # [s/tp, b, H]
        for layer in self.layers:
            x = layer(x)
        w = all_reduce_grad(self.norm, self.tp).bfloat16()
        x = torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5)
        logits = x @ all_reduce_grad(self.head.weight, self.tp).bfloat16().t()
        return torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), targets.t()[local].flatten()
        )


def _layer(args: argparse.Namespace, tp: TensorParallelGroup, ub: Any, device: Any):
    return TransformerLayer(
        args.hidden,
        args.ffn,
        args.heads,
        num_query_groups=args.groups,
        tp_group=tp.group,
        ub=ub,
        params_dtype=torch.float32,
        device=device,
    )


class ReferenceGPT(torch.nn.Module):
    """The same model on one process from whole weights (``overlap.layers.reference``)."""

    def __init__(self, model: GPT, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.embedding = torch.nn.Parameter(model.embedding.weight.detach().clone())
        self.layers = torch.nn.ParameterList()
        self.keys = []
        for layer in model.layers:
            state = layer.full_state_dict()  # collective
            self.keys.append(list(state))
            self.layers.extend(torch.nn.Parameter(v.float().clone()) for v in state.values())
        self.norm = torch.nn.Parameter(model.norm.detach().clone())
        self.head = torch.nn.Parameter(model.head.weight.detach().clone())

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        a = self.args
        x = torch.nn.functional.embedding(tokens.t(), self.embedding)  # [s, b, H]
        i = 0
        for keys in self.keys:
            state = dict(zip(keys, self.layers[i : i + len(keys)], strict=True))
            i += len(keys)
            x = ref.transformer_layer(
                x, state, num_attention_heads=a.heads, num_query_groups=a.groups
            )
        x = torch.nn.functional.rms_norm(x, (x.shape[-1],), self.norm, 1e-5)
        logits = x @ self.head.t()
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.t().flatten())


def batch(args: argparse.Namespace, gen: torch.Generator, device: Any) -> tuple[Any, Any]:
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
    seq = (start + torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def groups(tp_size: int) -> tuple[Any, Any]:
    """This rank's TP group (consecutive ranks) and data-parallel group (every tp-th)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tp_group = dp_group = None
    for g in range(world // tp_size):
        ranks = list(range(g * tp_size, (g + 1) * tp_size))
        pg = dist.new_group(ranks)
        if rank in ranks:
            tp_group = pg
    for i in range(tp_size):
        ranks = list(range(i, world, tp_size))
        pg = dist.new_group(ranks)
        if rank in ranks:
            dp_group = pg
    return tp_group, dp_group


def model_flops(args: argparse.Namespace) -> float:
    """Training FLOPs of one sequence position (6 x parameters touched, plus attention)."""
    d = args.hidden // args.heads
    qkv = args.hidden * (args.heads + 2 * args.groups) * d
    per_layer = qkv + args.heads * d * args.hidden + 3 * args.hidden * args.ffn
    attention = 6 * args.layers * args.seq * args.heads * d  # causal: half of 12 s H
    return 6 * (args.layers * per_layer + args.hidden * args.vocab) + attention


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=0, help="TP size (default: every local rank)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=0, help="default: 4096 on GPUs, 64 on the CPU")
    p.add_argument("--ffn", type=int, default=0, help="default: 3.5 x hidden")
    p.add_argument("--heads", type=int, default=0, help="default: hidden / 128 (CPU: 8)")
    p.add_argument("--groups", type=int, default=0, help="key/value heads (default: heads / 4)")
    p.add_argument("--seq", type=int, default=0, help="default: 4096 on GPUs, 32 on the CPU")
    p.add_argument("--batch", type=int, default=0, help="sequences per step (default 2)")
    p.add_argument("--vocab", type=int, default=0, help="default: 32000 on GPUs, 128 on the CPU")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--fp8", action="store_true", help="FP8 GEMMs (current scaling)")
    p.add_argument("--no-ub", action="store_true", help="no overlap: plain collectives")
    p.add_argument("--compare", action="store_true", help="also train it on one process")
    p.add_argument(
        "--cuda-graph", action="store_true", help="GPUs: replay the layers as CUDA graphs"
    )
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    if args.cuda_graph and not cuda:
        p.error("--cuda-graph needs GPUs (CUDA graphs)")
    launch = init_torch_distributed("nccl" if cuda else "gloo")
    device = torch.device("cuda", launch.local_rank) if cuda else torch.device("cpu")
    args.hidden = args.hidden or (4096 if cuda else 64)
    args.ffn = args.ffn or int(3.5 * args.hidden) // 16 * 16
    args.heads = args.heads or (args.hidden // 128 if cuda else 8)
    args.groups = args.groups or max(1, args.heads // 4)
    args.seq = args.seq or (4096 if cuda else 32)
    args.batch = args.batch or 2
    args.vocab = args.vocab or (32000 if cuda else 128)
    tp_size = args.tp or launch.local_size
    tp_pg, dp_pg = groups(tp_size)
    rank = dist.get_rank()
    dp_rank = rank // tp_size

    ub = None
    if not args.no_ub:
        ub = overlap.initialize_ub(
            (args.seq * args.batch, args.hidden), tp_pg, torch.bfloat16, use_fp8=args.fp8,
            register=False,
        )  # fmt: skip
    torch.manual_seed(1234)  # replicated parameters alike on every rank
    model = GPT(args, TensorParallelGroup(tp_pg, ub), ub, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    reference = ReferenceGPT(model, args).to(device) if args.compare else None
    if args.cuda_graph:  # after ReferenceGPT: it reads the layers' weights eagerly
        shard = (args.seq // tp_size, args.batch, args.hidden)
        samples = tuple(
            (torch.randn(shard, dtype=torch.bfloat16, device=device, requires_grad=True),)
            for _ in model.layers
        )
        make_graphed_callables(
            tuple(model.layers), samples, fp8_recipe=Fp8Recipe() if args.fp8 else None
        )
    ref_opt = (
        torch.optim.AdamW(reference.parameters(), lr=args.lr, weight_decay=0.0)
        if reference
        else None
    )
    gen = torch.Generator().manual_seed(99 + dp_rank)  # each data-parallel rank its batches
    tokens_per_step = args.seq * args.batch * (dist.get_world_size() // tp_size)
    flops = model_flops(args) * tokens_per_step / dist.get_world_size()
    peak = next((v for k, v in PEAK.items() if cuda and k in torch.cuda.get_device_name()), None)
    worst = 0.0
    for step in range(args.steps):
        tokens, targets = batch(args, gen, device)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with fp8_autocast(Fp8Recipe(), enabled=args.fp8):
            loss = model(tokens, targets)
        (loss / tp_size).backward()  # the mean over the TP group's tokens
        for param in model.parameters():
            if param.grad is not None and dp_pg is not None and dist.get_world_size(dp_pg) > 1:
                dist.all_reduce(param.grad, group=dp_pg)
                param.grad /= dist.get_world_size(dp_pg)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        total = loss.detach().clone()
        dist.all_reduce(total)
        mean = total.item() / dist.get_world_size()
        line = f"step {step:3d}: loss {mean:.4f}  tokens/s {tokens_per_step / seconds:,.0f}"
        if peak is not None:
            line += f"  MFU {flops / seconds / peak[args.fp8]:.1%}"
        if reference is not None:
            ref_loss = reference(tokens, targets)
            ref_loss.backward()
            for param in reference.parameters():
                if dp_pg is not None and dist.get_world_size(dp_pg) > 1:
                    dist.all_reduce(param.grad, group=dp_pg)
                    param.grad /= dist.get_world_size(dp_pg)
            ref_opt.step()  # type: ignore[union-attr]
            ref_opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
            r_total = ref_loss.detach().clone()
            dist.all_reduce(r_total)
            r_mean = r_total.item() / dist.get_world_size()
            worst = max(worst, abs(mean - r_mean) / abs(r_mean))
            line += f"  reference {r_mean:.4f}"
        if rank == 0:
            print(line, flush=True)
    if reference is not None and rank == 0:
        print(f"largest relative loss difference to one process: {worst:.4f}", flush=True)
    if args.cuda_graph:  # NCCL's teardown waits for graphs holding its collectives
        release_graphs(model)
    if ub is not None:
        ub.destroy()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Graphed layers (overlap.layers.make_graphed_callables, NOTE [graphed layers]) against the
same layers run eagerly, on GPUs (cuda transport).

Usage: layer_graphs_worker.py <scenario>[,<scenario>...] <tp_size> cuda
Scenarios:
  equal   a TransformerLayer graphed, with userbuffers and with ub=None, BF16, FP8 current
          and delayed scaling: three steps with an optimizer step between, each step's
          output, input gradient and parameter gradients equal to an eager twin's (the FP8
          weights re-quantized after every optimizer step); outputs kept from one step do
          not change at the next
  multi   two layers graphed together sharing one userbuffers handle, in a model's order
          (forwards, then backwards in reverse): two steps equal to eager twins
  fused   fuse_wgrad_accumulation: the warm-up leaves main_grad as it was; replays add each
          step's weight gradient to it, as the eager twin does
  accumulate  two micro-batches accumulate into .grad as the eager twin's do
  guards  typed errors instead of wrong results: a second forward before the backward, an
          input of another shape, a replaced parameter, another FP8 recipe, a gloo TP group;
          eval mode and no_grad run eagerly

The layers' TP group is an NCCL group (their collectives are captured); the userbuffers come
from the workers' gloo bootstrap of the same ranks.
"""

from __future__ import annotations

import sys
from typing import Any

import _worker
import torch

import overlap
from overlap.errors import ConfigError, InvalidArgumentError, StateError
from overlap.layers import (
    Fp8Recipe,
    TransformerLayer,
    fp8_autocast,
    make_graphed_callables,
    release_graphs,
)

H, FFN, HEADS, GROUPS, D = 64, 128, 8, 4, 8  # GQA, heads divisible by TP 4
SEQ, B = 32, 2


def dev() -> torch.device:
    """This rank's GPU (``_worker.setup`` made it the current device)."""
    return torch.device("cuda", torch.cuda.current_device())


def close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 3e-2) -> None:
    """Within ``rtol`` of the largest reference value: a graph may run other GEMM algorithms
    than the eager layer (a capture takes the heuristic's first, NOTE in overlap/gemm.py), so
    results agree to the GEMMs' rounding, not bit for bit."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got.float(), want.float()
    assert torch.isfinite(g).all(), f"{what}: not finite"
    bound = rtol * w.abs().max().clamp_min(1e-3)
    err = (g - w).abs().max()
    assert err <= bound, f"{what}: max |diff| {err.item():.4g} > {bound.item():.4g}"


def build(tp: Any, ub: Any, recipe: Fp8Recipe | None, state: dict[str, torch.Tensor],
          **kw: Any) -> TransformerLayer:  # fmt: skip
    layer = TransformerLayer(
        H, FFN, HEADS, num_query_groups=GROUPS, head_dim=D, tp_group=tp.group, ub=ub,
        params_dtype=torch.bfloat16, device=dev(), fp8_recipe=recipe, **kw,
    )  # fmt: skip
    layer.load_full_state_dict(state)
    return layer


def whole_state(tp: Any) -> dict[str, torch.Tensor]:
    """The same whole weights on every rank (a layer made with seed 0 on one rank's view)."""
    torch.manual_seed(0)
    ref = TransformerLayer(
        H, FFN, HEADS, num_query_groups=GROUPS, head_dim=D, tp_group=tp.group,
        params_dtype=torch.bfloat16, device=dev(),
    )  # fmt: skip
    state = ref.full_state_dict()
    g = torch.Generator(device="cpu").manual_seed(7)
    return {
        k: (torch.randn(v.shape, generator=g) * 0.1 + (1.0 if "norm" in k else 0.0))
        .to(v.dtype)
        .to(dev())
        for k, v in state.items()
    }


def make_ub(tp: Any, fp8: bool) -> Any:
    return overlap.initialize_ub(
        (SEQ * B, H), tp.bootstrap, torch.bfloat16, use_fp8=fp8, transport="cuda",
        register=False,
    )  # fmt: skip


def inputs(tp: Any, gen: torch.Generator, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` pairs (x, dy) of this rank's shard, the same whole tensors on every rank."""
    out = []
    for _ in range(n):
        x = torch.randn(SEQ, B, H, generator=gen).bfloat16()
        dy = torch.randn(SEQ, B, H, generator=gen).bfloat16()
        rows = slice(tp.rank * SEQ // tp.size, (tp.rank + 1) * SEQ // tp.size)
        out.append((x[rows].to(dev()), dy[rows].to(dev())))
    return out


def step(layer: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, recipe: Any) -> tuple:
    x = x.clone().requires_grad_()
    with fp8_autocast(recipe, enabled=recipe is not None):
        # Every replay re-quantizes the FP8 weights (NOTE [graphed layers]); so does the eager
        # twin here, or delayed scaling would quantize them at other points of its history.
        y = layer(x, is_first_microbatch=True)
    y.backward(dy)
    grads = [p.grad.clone() for p in layer.parameters()]
    for p in layer.parameters():
        p.grad = None
    return y, x.grad, grads


def compare(got: tuple, want: tuple, what: str, rtol: float = 3e-2) -> None:
    close(got[0], want[0], f"{what}: output", rtol)
    close(got[1], want[1], f"{what}: input gradient", rtol)
    for i, (a, b) in enumerate(zip(got[2], want[2], strict=True)):
        close(a, b, f"{what}: gradient of parameter {i}", rtol)


RECIPES = {
    "bf16": None,
    "fp8-current": Fp8Recipe(),
    "fp8-delayed": Fp8Recipe(scaling="delayed", amax_history_len=4),
}


def equal(tp: Any, gen: torch.Generator) -> None:
    state = whole_state(tp)
    for rname, recipe in RECIPES.items():
        for with_ub in (True, False):
            ub = make_ub(tp, recipe is not None) if with_ub else None
            what = f"{rname} ub={'on' if with_ub else 'None'}"
            eager = build(tp, ub, None, state)
            graphed = build(tp, ub, None, state)
            data = inputs(tp, gen, 4)
            sample = data[0][0].clone().requires_grad_()
            make_graphed_callables(graphed, (sample,), fp8_recipe=recipe)
            # The warm-up left no gradient behind, and delayed scaling's history only the
            # warm-up's forward amaxes: start both from the same quantizer state.
            graphed.load_state_dict(eager.state_dict())
            for m in (eager, graphed):
                for p in m.parameters():
                    p.grad = None
            opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
            opt_g = torch.optim.SGD(graphed.parameters(), lr=0.05)
            if recipe is not None:  # the eager twin's FP8 state exists before the first sync
                step(eager, *data[3], recipe)
            # FP8 E4M3 rounds to 1 part in 16: a GEMM algorithm other than the eager one may
            # move a value to the neighbouring code.
            rtol = 3e-2 if recipe is None else 8e-2
            kept = None
            for i, (x, dy) in enumerate(data[:3]):
                if recipe is not None and recipe.scaling.value == "delayed":
                    _sync_delayed(graphed, eager)
                want = step(eager, x, dy, recipe)
                assert all(torch.isfinite(t).all() for t in (want[0], want[1], *want[2])), (
                    f"{what} step {i}: the eager twin is not finite (the test's updates diverge)"
                )
                got = step(graphed, x, dy, None)  # the recipe is the captured one
                compare(got, want, f"{what} step {i}", rtol)
                if kept is not None:
                    assert torch.equal(kept[1], kept[0]), f"{what}: an earlier output changed"
                kept = (got[0], got[0].clone())
                for p_e, g in zip(eager.parameters(), want[2], strict=True):
                    p_e.grad = g
                for p_g, g in zip(graphed.parameters(), got[2], strict=True):
                    p_g.grad = g
                opt_e.step()
                opt_g.step()
                with torch.no_grad():  # and a change no stale FP8 weight cache could hide
                    for p in (*eager.parameters(), *graphed.parameters()):
                        if p.dim() == 2:
                            p.mul_(-1.0)
            if ub is not None:
                ub.destroy()
        if tp.rank == 0:
            print(f"  equal {rname}: ok", flush=True)


def _sync_delayed(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Copy delayed scaling's amax histories and scales (in place: the graph reads these
    tensors) from ``src``'s quantizers into ``dst``'s, so both scale the same way."""
    others = dict(src.named_modules())
    for name, sub in dst.named_modules():
        st, other = getattr(sub, "_fp8", None), getattr(others[name], "_fp8", None)
        if st is None or other is None:
            continue
        for q in ("input", "weight", "grad"):
            a, b = getattr(st, q), getattr(other, q)
            a.amax_history.copy_(b.amax_history.to(a.amax_history.device))
            a.scale.copy_(b.scale.to(a.scale.device))


def multi(tp: Any, gen: torch.Generator) -> None:
    state = whole_state(tp)
    for rname in ("bf16", "fp8-current"):
        recipe = RECIPES[rname]
        ub = make_ub(tp, recipe is not None)
        eager = [build(tp, ub, None, state) for _ in range(2)]
        graphed = [build(tp, ub, None, state) for _ in range(2)]
        x0 = inputs(tp, gen, 1)[0][0]
        make_graphed_callables(
            tuple(graphed), ((x0.clone().requires_grad_(),), (x0.clone().requires_grad_(),)),
            fp8_recipe=recipe,
        )  # fmt: skip
        for m in (*eager, *graphed):
            for p in m.parameters():
                p.grad = None
        for i, (x, dy) in enumerate(inputs(tp, gen, 2)):
            results = []
            for layers, r in ((eager, recipe), (graphed, None)):
                xi = x.clone().requires_grad_()
                with fp8_autocast(r, enabled=r is not None):
                    y = layers[1](layers[0](xi))
                y.backward(dy)
                grads = [p.grad.clone() for m in layers for p in m.parameters()]
                for m in layers:
                    for p in m.parameters():
                        p.grad = None
                results.append((y, xi.grad, grads))
            compare(results[1], results[0], f"multi {rname} step {i}",
                    3e-2 if recipe is None else 8e-2)  # fmt: skip
        ub.destroy()
        if tp.rank == 0:
            print(f"  multi {rname}: ok", flush=True)


def fused(tp: Any, gen: torch.Generator) -> None:
    state = whole_state(tp)
    ub = make_ub(tp, False)
    eager = build(tp, ub, None, state, fuse_wgrad_accumulation=True)
    graphed = build(tp, ub, None, state, fuse_wgrad_accumulation=True)
    for m in (eager, graphed):
        for name, p in m.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.main_grad = torch.full(p.shape, 0.25, dtype=torch.float32, device=dev())
    x0 = inputs(tp, gen, 1)[0][0]
    make_graphed_callables(graphed, (x0.clone().requires_grad_(),))
    for name, p in graphed.named_parameters():
        if hasattr(p, "main_grad"):
            assert bool((p.main_grad == 0.25).all()), f"warm-up changed {name}.main_grad"
    for i, (x, dy) in enumerate(inputs(tp, gen, 2)):
        for layer in (eager, graphed):
            xi = x.clone().requires_grad_()
            layer(xi).backward(dy)
        for (name, a), b in zip(graphed.named_parameters(), eager.parameters(), strict=True):
            if hasattr(a, "main_grad"):
                close(a.main_grad, b.main_grad, f"fused step {i}: {name}.main_grad")
    ub.destroy()


def accumulate(tp: Any, gen: torch.Generator) -> None:
    """Two micro-batches accumulate into ``.grad`` (no zeroing between): the graphed layer's
    gradients are the eager twin's, i.e. the second replay did not overwrite the first
    micro-batch's gradients in ``.grad``."""
    state = whole_state(tp)
    ub = make_ub(tp, False)
    eager, graphed = build(tp, ub, None, state), build(tp, ub, None, state)
    data = inputs(tp, gen, 3)
    make_graphed_callables(graphed, (data[0][0].clone().requires_grad_(),))
    for m in (eager, graphed):
        m.zero_grad(set_to_none=True)
        for x, dy in data[1:]:
            m(x.clone().requires_grad_(), is_first_microbatch=True).backward(dy)
    for (name, a), b in zip(graphed.named_parameters(), eager.parameters(), strict=True):
        close(a.grad, b.grad, f"accumulated {name}.grad")
    ub.destroy()


def guards(tp: Any, gen: torch.Generator) -> None:
    state = whole_state(tp)
    ub = make_ub(tp, True)
    layer = build(tp, ub, None, state)
    x, dy = inputs(tp, gen, 1)[0]
    make_graphed_callables(layer, (x.clone().requires_grad_(),), fp8_recipe=Fp8Recipe())
    y = layer(x.clone().requires_grad_())
    _worker.expect_raises(StateError, "backward of its previous forward", lambda: layer(x))
    y.backward(dy)
    y2 = layer(x)  # the backward ran: a new forward is fine
    del y2  # dropped without a backward: the next forward is fine too
    layer(x).backward(dy)
    _worker.expect_raises(InvalidArgumentError, "graphed for argument 0", lambda: layer(x[:-1]))
    _worker.expect_raises(InvalidArgumentError, "keyword", lambda: layer(x, other=1))
    with fp8_autocast(Fp8Recipe(margin=1)):
        _worker.expect_raises(ConfigError, "graphed with FP8 recipe", lambda: layer(x))
    with fp8_autocast(Fp8Recipe()):  # the captured recipe: fine
        layer(x).backward(dy)
    with torch.no_grad(), fp8_autocast(Fp8Recipe()):
        y_ng = layer(x)  # eager
    layer.eval()
    with torch.no_grad(), fp8_autocast(Fp8Recipe()):
        y_ev = layer(x)
    layer.train()
    close(y_ng.float(), y_ev.float(), "no_grad vs eval (both eager)", rtol=5e-2)
    old = layer.proj.weight
    layer.proj.weight = torch.nn.Parameter(old.detach().clone())
    _worker.expect_raises(StateError, "replaced", lambda: layer(x))
    layer.proj.weight = old
    layer(x).backward(dy)
    _worker.expect_raises(StateError, "already graphed",
                          lambda: make_graphed_callables(layer, (x,)))  # fmt: skip
    # NOTE [graph teardown]: not while a backward is due; then eager again, and graphable again.
    y = layer(x.clone().requires_grad_())
    _worker.expect_raises(StateError, "backward has not run", lambda: release_graphs([layer]))
    y.backward(dy)
    graphs = (layer._overlap_graphed.fwd, layer._overlap_graphed.bwd)
    release_graphs(layer)
    assert layer._overlap_graphed is None and "forward" not in vars(layer)
    for g in graphs:
        _worker.expect_raises(StateError, "after reset", g.replay)
    with fp8_autocast(Fp8Recipe()):
        layer(x.clone().requires_grad_()).backward(dy)  # eager
    # NOTE [graphed layers]: `y` still holds its step's graph, whose gradient-accumulation
    # nodes sit on the default stream: the capture would fail on the GPU, so it is refused.
    _worker.expect_raises(
        StateError,
        "still part of the autograd graph",
        lambda: make_graphed_callables(layer, (x.clone().requires_grad_(),)),
    )
    del y
    make_graphed_callables(layer, (x.clone().requires_grad_(),), fp8_recipe=Fp8Recipe())
    layer(x.clone().requires_grad_()).backward(dy)
    release_graphs([layer])
    on_gloo = TransformerLayer(
        H, FFN, HEADS, num_query_groups=GROUPS, head_dim=D, tp_group=tp.bootstrap.group,
        params_dtype=torch.bfloat16, device=dev(),
    )  # fmt: skip
    _worker.expect_raises(ConfigError, "'gloo' TP group",
                          lambda: make_graphed_callables(on_gloo, (x,)))  # fmt: skip
    ub.destroy()


class NcclTp:
    """The TP group of ``tp``'s ranks as an NCCL ProcessGroup (the layers' collectives must be
    capturable; the workers' default group is gloo), with ``tp``'s rank and size."""

    def __init__(self, tp: Any) -> None:
        import torch.distributed as dist

        world = dist.get_world_size()
        groups = [
            dist.new_group(list(range(g, g + tp.size)), backend="nccl")
            for g in range(0, world, tp.size)
        ]
        self.group = groups[dist.get_rank() // tp.size]
        self.bootstrap, self.rank, self.size = tp, tp.rank, tp.size


def main() -> None:
    s = _worker.setup(sys.argv)
    assert s.transport == "cuda", "graphed layers need the cuda transport"
    scenarios = {
        "equal": equal, "multi": multi, "fused": fused, "accumulate": accumulate, "guards": guards
    }  # fmt: skip
    tp = NcclTp(s.tp)
    for name in s.scenario.split(","):
        gen = torch.Generator().manual_seed(1234)
        scenarios[name](tp, gen)
        if s.tp.rank == 0:
            print(f"scenario {name}: ok", flush=True)


if __name__ == "__main__":
    _worker.run(main)

"""The tensor-parallel layers against single-process references built from the same weights.

Usage: layers_worker.py <scenario>[,<scenario>...] <tp_size> [host|cuda]
Scenarios:
  modules    every module (column, row, LayerNormLinear with LayerNorm and RMSNorm,
             LayerNormMLP with GELU and SwiGLU), forward and every gradient, BF16 and FP32,
             with userbuffers and without, 2-D and sequence-first 3-D inputs
  switches   every combination of the overlap switches gives the ub=None result (FP32)
  fp8        FP8 current scaling against the same quantization emulated in the reference;
             delayed scaling: one amax history on every rank, results near the reference
  pipeline   two layers sharing one buffer (windows of every kind, NOTE [userbuffer memory]):
             three forwards, then the three backwards in reverse order (BF16 and FP8),
             gradients exactly those of one at a time, and (BF16) those of ub=None
  train_eval FP8 cached weights through train -> eval -> train steps; quantizers pickled and
             deep-copied between a forward and its backward
  timeout    a stalled peer surfaces as CommTimeoutError through forward and backward
  negative   bad inputs and configurations: typed errors before any communication
  compile    torch.compile(fullgraph=True) of column + row, forward and backward, = eager
"""

from __future__ import annotations

import copy
import functools
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import _worker
import torch
import torch.distributed as dist

import overlap
from overlap.errors import CommTimeoutError, ConfigError, InvalidArgumentError
from overlap.layers import (
    ColumnParallelLinear,
    Fp8Recipe,
    LayerNormLinear,
    LayerNormMLP,
    RowParallelLinear,
    TransformerLayer,
    fp8_autocast,
)
from overlap.layers import reference as ref
from overlap.quantization import CurrentScalingConfig, CurrentScalingQuantizer, Fp8Format
from overlap.ub import GemmOverlapConfig, OverlapMethod

H, N, FFN = 32, 64, 64  # FP8 GEMMs need 16-byte leading dimensions: multiples of 16
DEVICE = torch.device("cpu")
TRANSPORT = "host"


def tol(dtype: torch.dtype) -> float:
    """Relative tolerance (to the largest reference value) of a layer against its reference.
    FP32 on the host transport is all but exact (float64 reference GEMMs); BF16 rounds the
    activations and outputs; on cuda the GEMMs add their own rounding."""
    base = 2e-2 if dtype == torch.bfloat16 else 1e-4
    return base + (1e-2 if DEVICE.type == "cuda" else 0.0)


def close(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g, w = got.detach().float().cpu(), want.detach().float().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    err = (g - w).abs().max().item()
    bound = rtol * max(w.abs().max().item(), 1e-6)
    assert err <= bound, f"{what}: max |diff| {err:.3g} > {bound:.3g} (rtol {rtol})"


def rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * scale


# ---- the module kinds ------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A module kind: how to build it, its whole parameters, its reference, how its input
    (``rows``: ``[T/tp, K]`` shards; ``cols``: ``[T, K/tp]``) and output are split."""

    name: str
    build: Callable[..., torch.nn.Module]
    state: Callable[[torch.Generator], dict[str, torch.Tensor]]
    reference: Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]
    in_features: int
    sharded_input: str
    sharded_output: str


def _linear_state(n: int, k: int) -> Callable[[torch.Generator], dict[str, torch.Tensor]]:
    return lambda g: {"weight": rand(n, k, gen=g, scale=k**-0.5), "bias": rand(n, gen=g)}


def _norm_state(g: torch.Generator, rms: bool) -> dict[str, torch.Tensor]:
    s = {"layer_norm_weight": 1 + 0.1 * rand(H, gen=g)}
    if not rms:
        s["layer_norm_bias"] = 0.1 * rand(H, gen=g)
    return s


def _mlp_state(g: torch.Generator, gated: bool) -> dict[str, torch.Tensor]:
    f1 = FFN * (2 if gated else 1)
    return {
        **_norm_state(g, rms=False),
        "fc1_weight": rand(f1, H, gen=g, scale=H**-0.5),
        "fc1_bias": rand(f1, gen=g),
        "fc2_weight": rand(H, FFN, gen=g, scale=FFN**-0.5),
        "fc2_bias": rand(H, gen=g),
    }


HEADS, GROUPS = 8, 4  # grouped-query attention, head_dim 4: TP up to 4 (main() widens for 8)


def _transformer_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    d = H // HEADS
    drop = ("fc1_bias", "fc2_bias", "layer_norm_bias")  # no biases; RMSNorm
    mlp = {k: v for k, v in _mlp_state(g, gated=True).items() if k not in drop}
    return {
        "qkv_norm_weight": 1 + 0.1 * rand(H, gen=g),
        "q_weight": rand(HEADS * d, H, gen=g, scale=H**-0.5),
        "k_weight": rand(GROUPS * d, H, gen=g, scale=H**-0.5),
        "v_weight": rand(GROUPS * d, H, gen=g, scale=H**-0.5),
        "proj_weight": rand(H, HEADS * d, gen=g, scale=H**-0.5),
        **{f"mlp_{k}": v for k, v in mlp.items()},
    }


def _seq_reference(x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The transformer layer's reference on ``[s, b, H]`` (a 2-D input is one sequence)."""
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    y = ref.transformer_layer(x3, state, num_attention_heads=HEADS, num_query_groups=GROUPS)
    return y if x.dim() == 3 else y.squeeze(1)


def _kinds() -> dict[str, Kind]:
    """The modules under test at the current dims (main() widens them for TP 8)."""
    return {
        "column": Kind(
            "column",
            lambda **kw: ColumnParallelLinear(H, N, gemm="qkv", **kw),
            _linear_state(N, H),
            ref.linear,
            H,
            "rows",
            "cols",
        ),
        "row": Kind(
            "row",
            lambda **kw: RowParallelLinear(N, H, gemm="proj", **kw),
            _linear_state(H, N),
            ref.linear,
            N,
            "cols",
            "rows",
        ),
        "ln_linear": Kind(
            "ln_linear",
            lambda **kw: LayerNormLinear(H, N, gemm="qkv", **kw),
            lambda g: {**_norm_state(g, False), **_linear_state(N, H)(g)},
            lambda x, s: ref.layernorm_linear(x, s, "LayerNorm"),
            H,
            "rows",
            "cols",
        ),
        "rms_linear": Kind(
            "rms_linear",
            lambda **kw: LayerNormLinear(H, N, gemm="fc1", normalization="RMSNorm", **kw),
            lambda g: {**_norm_state(g, True), **_linear_state(N, H)(g)},
            lambda x, s: ref.layernorm_linear(x, s, "RMSNorm"),
            H,
            "rows",
            "cols",
        ),
        "mlp_gelu": Kind(
            "mlp_gelu",
            lambda **kw: LayerNormMLP(H, FFN, activation="gelu", **kw),
            lambda g: _mlp_state(g, False),
            lambda x, s: ref.layernorm_mlp(x, s, "gelu"),
            H,
            "rows",
            "rows",
        ),
        "transformer": Kind(
            "transformer",
            lambda **kw: TransformerLayer(H, FFN, HEADS, num_query_groups=GROUPS, **kw),
            _transformer_state,
            _seq_reference,
            H,
            "rows",
            "rows",
        ),
        "mlp_swiglu": Kind(
            "mlp_swiglu",
            lambda **kw: LayerNormMLP(H, FFN, activation="swiglu", **kw),
            lambda g: _mlp_state(g, True),
            lambda x, s: ref.layernorm_mlp(x, s, "swiglu"),
            H,
            "rows",
            "rows",
        ),
    }


KINDS = _kinds()


def shard(t: torch.Tensor, how: str, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s part of a whole ``[T, F]`` tensor split by rows or columns."""
    if how == "rows":
        m = t.shape[0] // tp
        return t[rank * m : (rank + 1) * m]
    f = t.shape[-1] // tp
    return t[..., rank * f : (rank + 1) * f]


def check_module(
    kind: Kind,
    layer: torch.nn.Module,
    tp: Any,
    *,
    tokens: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    seq_first: int = 0,
    what: str = "",
) -> None:
    """Forward and every gradient of ``layer`` (its whole parameters loaded from a fresh
    random state) against ``kind``'s reference on the whole input. ``seq_first``: run it on
    a ``[s, b, K]`` input with ``b = seq_first``."""
    state = {k: v.to(dtype) for k, v in kind.state(gen).items()}
    layer.load_full_state_dict(state)
    x_whole = rand(tokens, kind.in_features, gen=gen).to(dtype)
    out_whole_shape = kind.reference(
        x_whole.float(), {k: v.float() for k, v in state.items()}
    ).shape
    gy_whole = rand(*out_whole_shape, gen=gen).to(dtype)
    # Reference: float32 math on the same (rounded) values.
    xr = x_whole.float().clone().requires_grad_()
    sr = {k: v.float().clone().requires_grad_() for k, v in state.items()}
    if seq_first:  # the whole [s, b, K] input (s-major rows), for attention's sake
        yr = kind.reference(xr.view(-1, seq_first, xr.shape[-1]), sr).reshape(tokens, -1)
    else:
        yr = kind.reference(xr, sr)
    (yr * gy_whole.float()).sum().backward()
    # The layer on this rank's part.
    x = shard(x_whole, kind.sharded_input, tp.size, tp.rank).to(DEVICE)
    gy = shard(gy_whole, kind.sharded_output, tp.size, tp.rank).to(DEVICE)
    if seq_first:  # [T, K] as [s, b, K] with T = s * b, s-major
        x, gy = _seq(x, seq_first), _seq(gy, seq_first)
    x = x.contiguous().requires_grad_()
    y = layer(x)
    assert y.dtype == dtype, (what, y.dtype)
    (y * gy).sum().backward()
    if seq_first:
        y, xg = y.reshape(-1, y.shape[-1]), x.grad.reshape(-1, x.shape[-1])
    else:
        xg = x.grad
    label = f"{kind.name} {what}"
    rtol = tol(dtype)
    close(y, shard(yr.detach(), kind.sharded_output, tp.size, tp.rank), f"{label}: y", rtol)
    close(xg, shard(xr.grad, kind.sharded_input, tp.size, tp.rank), f"{label}: dx", rtol)
    grads = _whole_grads(layer)
    for key, g in grads.items():
        close(g, sr[key].grad, f"{label}: d{key}", rtol)


def _seq(t: torch.Tensor, b: int) -> torch.Tensor:
    return t.reshape(t.shape[0] // b, b, t.shape[-1])


def _whole_grads(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The layer's gradients as whole tensors (COLLECTIVE): swap grads into the parameters,
    gather with full_state_dict, swap back."""
    saved = {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            saved[name] = p.detach().clone()
            p.copy_(p.grad)
        whole = layer.full_state_dict()
        for name, p in layer.named_parameters():
            p.copy_(saved[name])
    return whole


# ---- scenarios -------------------------------------------------------------------------------


# The policy make_ub gives a handle (the plans scenario changes it for a while).
SHAPE_PLANS = {"policy": "always"}


def make_ub(tp: Any, tokens: int, dtype: torch.dtype, **kw: Any) -> overlap.ub.Userbuffers:
    kw.setdefault("shape_plans", SHAPE_PLANS["policy"])
    return overlap.initialize_ub(
        (tokens, H),
        tp,
        dtype,
        transport=TRANSPORT,
        register=False,
        **kw,
    )


def plans(tp: Any, gen: torch.Generator) -> None:
    """NOTE [shape plans]: under the "measured" policy each overlapped step's GEMM shape (the
    forward AG+GEMM and GEMM+RS, the row-parallel dgrad's AG+GEMM, the column backward's bulk
    pair) is timed once
    (the op, its alternate settings and the sequential path, max over the group) and runs the
    fastest path from then on. The times are made up per rank here (the paths still run), so
    that the group maximum, not a rank's own time, must decide: one rank alone finds the op
    slow; or an alternate setting wins. Every rank takes the same path (no hang), the layers
    compute what the reference does whichever runs, and describe() lists each decision."""
    import torch.distributed as dist

    import overlap.ub.plans as plans_mod

    tokens = 4 * tp.size
    real = plans_mod._median_ms
    # "op": every path of an op times 1 and sequential 5; "sequential": the last rank alone
    # finds every op path slow (9); "alternate": the op's alternate settings (NOTE [plan
    # alternates]) time 0.5, so the first of them wins where a step has any.
    for mode in ("op", "sequential", "alternate"):
        calls = []
        state: dict[str, Any] = {}

        def fake(
            fn: Any,
            n: int,
            cuda: bool,
            align: Any,
            barrier: Any,
            *,
            mode: str = mode,
            calls: list = calls,
            state: dict = state,
        ) -> float:
            fn()  # the path really runs (an extra call of each op must be harmless)
            align()  # and the ranks meet
            if cuda:
                assert barrier is not None, "the layers pass no device-side barrier"
                barrier()  # a collective of the group, queued on the stream
            calls.append(fn)
            # The layers pass an op (configured or alternate) as a partial of its call, the
            # sequential path as a plain function.
            if not isinstance(fn, functools.partial):
                return 5.0
            if mode == "sequential":
                return 9.0 if tp.rank == tp.size - 1 else 1.0
            configured = any(fn.args[0] is state["ub"].get(n) for n in state["names"])
            return 0.5 if (mode == "alternate" and not configured) else 1.0

        plans_mod._median_ms = fake
        try:
            ub = make_ub(tp, tokens, torch.float32, shape_plans="measured")
            names = ["qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad"]
            state.update(ub=ub, names=names)
            for name in ("column", "row"):
                kind = KINDS[name]
                layer = kind.build(tp_group=tp.group, ub=ub, device=DEVICE)
                check_module(kind, layer, tp, tokens=tokens, dtype=torch.float32, gen=gen,
                             what=f"plans {mode}")  # fmt: skip
                layer.zero_grad(set_to_none=True)
                check_module(kind, layer, tp, tokens=tokens, dtype=torch.float32, gen=gen,
                             what=f"plans again {mode}")  # fmt: skip
            made = ub.plans.plans()
            assert [p.key.name for p in made] == names, made
            for p in made:
                alternates = list(ub.alternates(p.key.name))
                want = {"op": "op", "sequential": "sequential"}.get(mode)
                want = want or (alternates[0] if alternates else "op")
                assert p.path == want, (p, alternates)
            assert any(p.path not in ("op", "sequential") for p in made) is (mode == "alternate")
            decisions = [None] * tp.size
            dist.all_gather_object(decisions, [(p.key, p.path) for p in made], group=tp.group)
            assert all(d == decisions[0] for d in decisions), decisions
            text = ub.describe()
            assert "shape plans (policy measured): 5 shapes" in text, text
            assert ("sequential (measured" in text) is (mode == "sequential"), text
            # Each shape timed once: its op, the op's alternate settings and sequential.
            paths = sum(2 + len(ub.alternates(n)) for n in names)
            assert paths > 10 and len(calls) == paths, (len(calls), paths)
            ub.destroy()
            # Every combination of the switches (the bulk pair, GEMM+RS dgrad, main_grad) with
            # each step planned the same way: still what ub=None computes.
            SHAPE_PLANS["policy"] = "measured"
            try:
                state["names"] = []  # the switches' handles: every path times the same
                switches(tp, gen)
            finally:
                SHAPE_PLANS["policy"] = "always"
            assert len(calls) > paths, "switches under measured plans timed nothing"
        finally:
            plans_mod._median_ms = real


def modules(tp: Any, gen: torch.Generator) -> None:
    """Every module kind, with and without userbuffers, BF16 and FP32, tokens any multiple
    of the TP size (5 per rank), and sequence-first input."""
    tokens = 5 * tp.size
    for dtype in (torch.float32, torch.bfloat16):
        ub = make_ub(tp, 6 * tp.size, dtype)  # the largest call: the [s, b, K] one below
        for kind in KINDS.values():
            for handle in (None, ub):
                layer = kind.build(tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE)
                check_module(
                    kind,
                    layer,
                    tp,
                    tokens=tokens,
                    dtype=dtype,
                    gen=gen,
                    what=f"{dtype} ub={handle}",
                )
        # Sequence-first [s, b, K] inputs (s sharded): b = 3.
        for name in ("column", "row", "mlp_swiglu", "transformer"):
            kind = KINDS[name]
            layer = kind.build(tp_group=tp.group, ub=ub, params_dtype=dtype, device=DEVICE)
            check_module(kind, layer, tp, tokens=2 * tp.size * 3, dtype=dtype, gen=gen, seq_first=3,
                         what=f"{dtype} [s, b, K]")  # fmt: skip
        ub.destroy()


def switches(tp: Any, gen: torch.Generator) -> None:
    """Every combination of the overlap switches computes what ub=None computes (FP32)."""
    tokens = 4 * tp.size
    dtype = torch.float32
    ub = make_ub(tp, tokens, dtype)
    rs_ub = make_ub(
        tp, tokens, dtype,
        ub_cfgs={"qkv_dgrad": GemmOverlapConfig(method=OverlapMethod.PIPELINE_RS)},
    )  # fmt: skip
    state_gen = torch.Generator().manual_seed(7)
    kind = KINDS["column"]
    for ag in (False, True):
        for bd in (False, True):
            for bw in (False, True):
                layer = ColumnParallelLinear(
                    H, N, gemm="qkv", tp_group=tp.group, ub=ub, params_dtype=dtype, device=DEVICE,
                    ub_overlap_ag=ag, ub_bulk_dgrad=bd, ub_bulk_wgrad=bw,
                )  # fmt: skip
                assert (layer.spec.overlap_ag, layer.spec.bulk_dgrad, layer.spec.bulk_wgrad) == (
                    ag,
                    bd,
                    bw,
                )
                what = f"ag={ag} bd={bd} bw={bw}"
                check_module(kind, layer, tp, tokens=tokens, dtype=dtype, gen=state_gen, what=what)
    layer = ColumnParallelLinear(
        H, N, gemm="qkv", tp_group=tp.group, ub=rs_ub, params_dtype=dtype, device=DEVICE
    )
    assert layer.spec.rs_dgrad and not layer.spec.bulk_dgrad and not layer.spec.bulk_wgrad
    check_module(kind, layer, tp, tokens=tokens, dtype=dtype, gen=state_gen, what="rs_dgrad")
    kind = KINDS["row"]
    for rs in (False, True):
        for ag in (False, True):
            layer = RowParallelLinear(
                N, H, gemm="proj", tp_group=tp.group, ub=ub, params_dtype=dtype, device=DEVICE,
                ub_overlap_rs=rs, ub_overlap_ag=ag,
            )  # fmt: skip
            check_module(
                kind, layer, tp, tokens=tokens, dtype=dtype, gen=state_gen, what=f"rs={rs} ag={ag}"
            )
    # A main_grad accumulates the weight gradient instead (fuse_wgrad_accumulation).
    for name, build in (
        ("column", lambda: ColumnParallelLinear(H, N, gemm="qkv", tp_group=tp.group, ub=ub,
                                                fuse_wgrad_accumulation=True, device=DEVICE)),
        ("row", lambda: RowParallelLinear(N, H, gemm="proj", tp_group=tp.group, ub=ub,
                                          fuse_wgrad_accumulation=True, device=DEVICE)),
    ):  # fmt: skip
        layer = build()
        plain = KINDS[name].build(tp_group=tp.group, ub=None, device=DEVICE)
        plain.load_state_dict(layer.state_dict())
        layer.weight.main_grad = torch.full_like(layer.weight, 0.5, dtype=torch.float32)
        x = rand(
            tokens // tp.size if name == "column" else tokens,
            layer.in_features // (1 if name == "column" else tp.size),
            gen=gen,
        ).to(DEVICE)
        layer(x).sum().backward()
        plain(x).sum().backward()
        assert layer.weight.grad is None, "the fused wgrad must not also return a gradient"
        close(layer.weight.main_grad, plain.weight.grad + 0.5, f"{name} main_grad", 1e-5)
    ub.destroy()
    rs_ub.destroy()


def _fp8_emulated(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """``x`` quantized to per-tensor FP8 with current scaling (its own amax) and back."""
    q = CurrentScalingQuantizer(CurrentScalingConfig(fp8=fmt))
    return q.quantize(x, rowwise=True, columnwise=False).dequantize(dtype=torch.float32)


def fp8(tp: Any, gen: torch.Generator) -> None:
    """FP8 current scaling against the emulated reference (the same scales: the gathered
    tensors' amax is the whole tensor's, the local ones are per rank); delayed scaling: the
    amax history is the same on every rank and the results stay near the reference."""
    tokens = 16 * tp.size
    dtype = torch.bfloat16
    n, r = tp.size, tp.rank
    e4, e5 = Fp8Format.E4M3, Fp8Format.E5M2
    ub = make_ub(tp, tokens, dtype, use_fp8=True)
    # FP8 GEMM outputs are bf16 and partial sums meet in bf16 (or fp32): bf16 tolerance.
    rtol = 3e-2 + (1e-2 if DEVICE.type == "cuda" else 0.0)
    for handle in (None, ub):
        # Column: x gathered (one scale for the whole [T, H]), W per rank, dY per rank (its
        # own columns, local scale).
        state = {k: v.bfloat16() for k, v in _linear_state(N, H)(gen).items()}
        x_whole = rand(tokens, H, gen=gen).bfloat16()
        gy_whole = rand(tokens, N, gen=gen).bfloat16()
        layer = ColumnParallelLinear(
            H, N, gemm="qkv", tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE
        )
        layer.load_full_state_dict(state)
        x = shard(x_whole, "rows", n, r).to(DEVICE).requires_grad_()
        with fp8_autocast(Fp8Recipe()):
            y = layer(x)
        (y * shard(gy_whole, "cols", n, r).to(DEVICE)).sum().backward()
        xq = _fp8_emulated(x_whole.float(), e4)
        w_blocks = [
            _fp8_emulated(shard(state["weight"].float(), "rows", n, k), e4) for k in range(n)
        ]
        dy_blocks = [_fp8_emulated(shard(gy_whole.float(), "cols", n, k), e5) for k in range(n)]
        want_y = xq @ w_blocks[r].t() + shard(state["bias"].float(), "rows", n, r)
        dgrad = sum(dy_blocks[k] @ w_blocks[k] for k in range(n))
        want_dw = dy_blocks[r].t() @ xq
        close(y, want_y, f"fp8 column ub={handle}: y", rtol)
        close(x.grad, shard(dgrad, "rows", n, r), f"fp8 column ub={handle}: dx", rtol)
        close(layer.weight.grad, want_dw, f"fp8 column ub={handle}: dW", rtol)
        # Row: x per rank (local scale), W per rank, dY gathered (one scale over [T, N]).
        state = {k: v.bfloat16() for k, v in _linear_state(H, N)(gen).items()}
        x_whole = rand(tokens, N, gen=gen).bfloat16()
        gy_whole = rand(tokens, H, gen=gen).bfloat16()
        layer = RowParallelLinear(
            N, H, gemm="proj", tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE
        )
        layer.load_full_state_dict(state)
        x = shard(x_whole, "cols", n, r).to(DEVICE).requires_grad_()
        with fp8_autocast(Fp8Recipe()):
            y = layer(x)
        (y * shard(gy_whole, "rows", n, r).to(DEVICE)).sum().backward()
        x_blocks = [_fp8_emulated(shard(x_whole.float(), "cols", n, k), e4) for k in range(n)]
        w_blocks = [
            _fp8_emulated(shard(state["weight"].float(), "cols", n, k), e4) for k in range(n)
        ]
        dyq = _fp8_emulated(gy_whole.float(), e5)
        want_y = sum(x_blocks[k] @ w_blocks[k].t() for k in range(n)) + state["bias"].float()
        close(y, shard(want_y, "rows", n, r), f"fp8 row ub={handle}: y", rtol)
        close(x.grad, dyq @ w_blocks[r], f"fp8 row ub={handle}: dx", rtol)
        close(layer.weight.grad, dyq.t() @ x_blocks[r], f"fp8 row ub={handle}: dW", rtol)
        # Delayed scaling: the reduced amax makes one history on every rank (LayerNormMLP,
        # three steps), and the result stays within FP8 error of the high-precision reference.
        kind = KINDS["mlp_swiglu"]
        layer = kind.build(tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE)
        state = {k: v.bfloat16() for k, v in kind.state(gen).items()}
        layer.load_full_state_dict(state)
        recipe = Fp8Recipe(scaling="delayed", amax_history_len=4)
        x_whole = rand(tokens, H, gen=gen).bfloat16()
        for _ in range(3):
            x = shard(x_whole, "rows", n, r).to(DEVICE).requires_grad_()
            with fp8_autocast(recipe):
                y = layer(x)
            y.float().square().sum().backward()
        hist = layer.fc1._fp8.input.amax_history.cpu()
        every = [torch.empty_like(hist) for _ in range(n)]
        dist.all_gather(every, hist, group=tp.group)
        assert all(torch.equal(h, hist) for h in every), "fc1 input amax histories differ"
        assert (hist[:3] > 0).all(), hist
        want = kind.reference(x_whole.float(), {k: v.float() for k, v in state.items()})
        # Four FP8 casts in a row (norm output, fc1 weight, activation, fc2 weight), scales
        # from last step's amax: a sanity bound; the exact check is the emulation above.
        close(y, shard(want, "rows", n, r), f"fp8 delayed mlp ub={handle}: y", 0.25)
    ub.destroy()


def pipeline(tp: Any, gen: torch.Generator) -> None:
    """Two layers (LayerNormMLP then LayerNormLinear) share one set of buffers; three
    micro-batches run forward, then backward in reverse order. Each micro-batch's gradients
    must equal those of running it alone (forward then backward), bit for bit: nothing saved
    for backward may alias a buffer that later forwards overwrite, and FP8 backwards use the
    scale_inv saved with their data, not the quantizers' latest."""
    for recipe in (None, Fp8Recipe()):
        _pipeline(tp, gen, recipe)


def _pipeline(tp: Any, gen: torch.Generator, recipe: Fp8Recipe | None) -> None:
    tokens = 16 * tp.size
    dtype = torch.bfloat16
    ub = make_ub(tp, tokens, dtype, use_fp8=recipe is not None)
    # NOTE [userbuffer memory]: every op of both layers runs on a window of one buffer, and
    # the windows of different kinds share bytes (all but the bulk pair's).
    windows = {ub.get(n).buffer for n in overlap.ub.GEMM_NAMES if ub.is_overlapped(n)}
    assert {w.root for w in windows} == {ub.buffer}, [w.name for w in windows]
    assert sum(w.nbytes for w in windows) > ub.buffer.nbytes  # shared bytes
    mlp_state = {k: v.bfloat16() for k, v in KINDS["mlp_swiglu"].state(gen).items()}
    qkv_state = {k: v.bfloat16() for k, v in KINDS["ln_linear"].state(gen).items()}

    def build(handle: overlap.ub.Userbuffers | None) -> tuple[Any, Any]:
        kw = {"tp_group": tp.group, "ub": handle, "params_dtype": dtype, "device": DEVICE}
        mlp, qkv = KINDS["mlp_swiglu"].build(**kw), KINDS["ln_linear"].build(**kw)
        mlp.load_full_state_dict(mlp_state)
        qkv.load_full_state_dict(qkv_state)
        return mlp, qkv

    mlp, qkv = build(ub)
    plain_mlp, plain_qkv = build(None)
    xs = [rand(tokens // tp.size, H, gen=gen).bfloat16().to(DEVICE) for _ in range(3)]
    gys = [rand(tokens, N // tp.size, gen=gen).bfloat16().to(DEVICE) for _ in range(3)]

    def forward(x: torch.Tensor, layers: tuple[Any, Any] = (mlp, qkv)) -> tuple[Any, Any]:
        x = x.clone().requires_grad_()
        with fp8_autocast(recipe, enabled=recipe is not None):
            return x, layers[1](layers[0](x) + x)

    def grads(x: torch.Tensor, layers: tuple[Any, Any] = (mlp, qkv)) -> list[torch.Tensor]:
        params = [*layers[0].parameters(), *layers[1].parameters()]
        out = [x.grad.clone(), *(p.grad.clone() for p in params)]
        x.grad = None
        for p in params:
            p.grad = None
        return out

    alone = []
    for x, gy in zip(xs, gys, strict=True):
        xi, y = forward(x)
        (y * gy).sum().backward()
        alone.append(grads(xi))
        if recipe is not None:  # FP8 against its emulated reference: the fp8 scenario
            continue
        # The same micro-batch without userbuffers: the shared buffer changes no result.
        xi, y = forward(x, (plain_mlp, plain_qkv))
        (y * gy).sum().backward()
        plain = grads(xi, (plain_mlp, plain_qkv))
        for k, (a, b) in enumerate(zip(alone[-1], plain, strict=True)):
            close(a, b, f"pipeline: gradient {k} against ub=None", tol(dtype))
    runs = [forward(x) for x in xs]  # three forwards: the buffers are overwritten twice
    piped: list[list[torch.Tensor]] = [[], [], []]
    for i in (2, 1, 0):
        xi, y = runs[i]
        (y * gys[i]).sum().backward()
        piped[i] = grads(xi)
    for i in range(3):
        for k, (a, b) in enumerate(zip(alone[i], piped[i], strict=True)):
            assert torch.equal(a, b), (
                f"pipeline fp8={recipe is not None}: micro-batch {i} gradient {k} differs "
                f"(max |diff| {(a.float() - b.float()).abs().max()})"
            )
    ub.destroy()


def train_eval(tp: Any, gen: torch.Generator) -> None:
    """FP8 with cached weights: train, eval, train (an optimizer step between): every step
    equals a fresh layer loaded with the same weights (no stale transposed data). The layer's
    quantizers are pickled and deep-copied between a forward and its backward."""
    tokens = 16 * tp.size
    dtype = torch.bfloat16
    ub = make_ub(tp, tokens, dtype, use_fp8=True)
    kind = KINDS["mlp_gelu"]
    layer = kind.build(tp_group=tp.group, ub=ub, params_dtype=dtype, device=DEVICE)
    layer.load_full_state_dict({k: v.bfloat16() for k, v in kind.state(gen).items()})
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    recipe = Fp8Recipe()

    def fresh() -> torch.nn.Module:
        f = kind.build(tp_group=tp.group, ub=ub, params_dtype=dtype, device=DEVICE)
        f.load_state_dict(layer.state_dict())
        return f

    gy = rand(tokens // tp.size, H, gen=gen).to(DEVICE)

    def step(model: torch.nn.Module, x: torch.Tensor, mid: Callable[[], None] | None = None):
        x = x.clone().requires_grad_()
        with fp8_autocast(recipe):
            y = model(x)
        if mid is not None:
            mid()
        (y.float() * gy).sum().backward()
        return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]

    def scramble() -> None:
        """Pickle and deep-copy the quantizers mid-run, and run them on junk."""
        for sub in (layer.fc1, layer.fc2):
            state = sub._fp8
            clone = pickle.loads(pickle.dumps(state))
            twin = copy.deepcopy(state)
            for q in (clone.input, twin.grad):
                q.quantize(torch.randn(16, 16, device=DEVICE) * 1000)
            state.input.quantize(torch.randn(16, 16, device=DEVICE) * 1000)

    for i in range(3):
        x = rand(tokens // tp.size, H, gen=gen).bfloat16().to(DEVICE)
        want = step(fresh(), x)
        opt.zero_grad(set_to_none=True)
        got = step(layer, x, mid=scramble if i == 1 else None)
        assert all(torch.isfinite(t).all() for t in got[:2]), f"train step {i}: not finite"
        for a, b in zip(got[:2], want[:2], strict=True):
            assert torch.equal(a, b), f"train step {i}: output or dx differs from a fresh layer"
        for a, b in zip(got[2], want[2], strict=True):
            assert torch.equal(a, b), f"train step {i}: a gradient differs from a fresh layer"
        opt.step()  # the weights change: the cache must follow
        layer.eval()
        with torch.no_grad(), fp8_autocast(recipe):
            y_eval = layer(x)
            y_fresh = fresh().eval()(x)
        assert torch.equal(y_eval, y_fresh), f"eval after step {i} differs from a fresh layer"
        layer.train()
    ub.destroy()


def timeout(tp: Any, gen: torch.Generator) -> None:
    """A peer that never joins (it sleeps past the deadline): every other rank gets
    CommTimeoutError from the layers' forward; then, with new buffers, from their backward.
    (Column then row layer without biases: every collective of their passes runs on the
    userbuffers. The all-reduce of a replicated parameter's gradient runs on the
    ProcessGroup, whose own timeout applies.)"""
    tokens = 4 * tp.size
    absent = tp.size - 1
    dtype = torch.bfloat16

    def model(ub: Any) -> torch.nn.Module:
        return torch.nn.Sequential(
            ColumnParallelLinear(
                H, N, tp_group=tp.group, ub=ub, bias=False, params_dtype=dtype, device=DEVICE
            ),
            RowParallelLinear(
                N, H, tp_group=tp.group, ub=ub, bias=False, params_dtype=dtype, device=DEVICE
            ),
        )

    # Warm up first: a rank's first call of a custom op imports parts of torch (seconds on a
    # CI machine), which a 1 s deadline must not count.
    x = rand(tokens // tp.size, H, gen=gen).to(dtype).to(DEVICE).requires_grad_()
    model(None)(x).float().sum().backward()
    for stage in ("forward", "backward"):
        ub = make_ub(tp, tokens, dtype, timeout_s=30.0)  # the calls that must succeed
        layers = model(ub)
        y = layers(x) if stage == "backward" else None
        for buf in ub.comm._buffers:
            buf.timeout_s = 1.0  # the stalled stage
        if tp.rank == absent:
            time.sleep(3.0)
        else:
            t0 = time.monotonic()
            try:
                if y is None:
                    y = layers(x)
                y.float().sum().backward()
                ub.comm.synchronize()
            except CommTimeoutError as exc:
                assert time.monotonic() - t0 < 8.0, "the timeout came too late"
                assert "timed out" in str(exc), str(exc)
            else:
                raise AssertionError(f"an absent peer in the {stage} raised nothing")
        dist.barrier(group=tp.group)
        ub.destroy()


def negative(tp: Any, gen: torch.Generator) -> None:
    """Typed errors before any communication, on every rank alike."""
    tokens = 4 * tp.size
    ub = make_ub(tp, tokens, torch.float32)
    row = RowParallelLinear(N, H, tp_group=tp.group, ub=ub, device=DEVICE)
    col = ColumnParallelLinear(H, N, tp_group=tp.group, ub=ub, device=DEVICE)
    x_odd = torch.randn(tokens + 1, N // tp.size, device=DEVICE)
    _worker.expect_raises(InvalidArgumentError, "multiple of it", lambda: row(x_odd))
    _worker.expect_raises(
        InvalidArgumentError,
        f"must be [tokens, {H}]",
        lambda: col(torch.randn(4, 7, device=DEVICE)),
    )
    big = torch.randn(tokens, H, device=DEVICE)  # tp * tokens rows gathered: over the size
    _worker.expect_raises(
        InvalidArgumentError, "userbuffers were sized for at most", lambda: col(big)
    )
    _worker.expect_raises(
        ConfigError,
        "needs userbuffers",
        lambda: ColumnParallelLinear(H, N, tp_group=tp.group, ub_overlap_ag=True),
    )
    _worker.expect_raises(
        ConfigError,
        "excludes",
        lambda: ColumnParallelLinear(
            H,
            N,
            tp_group=tp.group,
            ub=make_ub(
                tp,
                tokens,
                torch.float32,
                ub_cfgs={
                    "qkv_dgrad": GemmOverlapConfig(method=OverlapMethod.PIPELINE_RS),
                    "qkv_wgrad": GemmOverlapConfig(method=OverlapMethod.BULK_RS),
                },
            ),
            ub_overlap_rs_dgrad=True,
            ub_bulk_wgrad=True,
        ),
    )
    _worker.expect_raises(
        ConfigError,
        "needs the userbuffers GEMM proj_fprop",
        lambda: RowParallelLinear(
            N,
            H,
            tp_group=tp.group,
            ub=make_ub(
                tp,
                tokens,
                torch.float32,
                ub_cfgs={"proj_fprop": GemmOverlapConfig(method=OverlapMethod.NONE)},
            ),
            ub_overlap_rs=True,
        ),
    )
    _worker.expect_raises(
        ConfigError, "out_features 63", lambda: ColumnParallelLinear(H, 63, tp_group=tp.group)
    )
    _worker.expect_raises(
        ConfigError,
        "gemm must be one of",
        lambda: ColumnParallelLinear(H, N, gemm="proj", tp_group=tp.group),
    )
    _worker.expect_raises(
        ConfigError,
        "normalization must be one of",
        lambda: LayerNormLinear(H, N, tp_group=tp.group, normalization="BatchNorm"),
    )
    # FP8 through a handle built for high precision: a ConfigError naming the fix.
    with fp8_autocast(Fp8Recipe()):
        _worker.expect_raises(
            ConfigError, "use_fp8=True", lambda: col(torch.randn(4, H, device=DEVICE))
        )
    ub.destroy()


def compiled(tp: Any, gen: torch.Generator) -> None:
    """torch.compile(fullgraph=True) of a column- then a row-parallel layer (BF16), forward
    and backward, equals eager: the custom ops trace without graph breaks. CPU: the
    aot_eager backend (inductor's C++ build takes minutes on a CI machine); cuda: inductor."""
    tokens = 8 * tp.size
    ub = make_ub(tp, tokens, torch.bfloat16)
    for handle in (None, ub):
        _compiled(tp, gen, handle, tokens)
    ub.destroy()


def _compiled(tp: Any, gen: torch.Generator, handle: Any, tokens: int) -> None:
    dtype = torch.bfloat16
    model = torch.nn.Sequential(
        ColumnParallelLinear(H, N, tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE),
        RowParallelLinear(N, H, tp_group=tp.group, ub=handle, params_dtype=dtype, device=DEVICE),
    )
    x0 = rand(tokens // tp.size, H, gen=gen).bfloat16().to(DEVICE)

    def run(m: torch.nn.Module) -> list[torch.Tensor]:
        for p in model.parameters():
            p.grad = None
        x = x0.clone().requires_grad_()
        y = m(x)
        y.float().square().sum().backward()
        return [y.detach(), x.grad, *(p.grad for p in model.parameters())]

    eager = run(model)
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    torch._dynamo.reset()
    got = run(torch.compile(model, fullgraph=True, backend=backend))
    for i, (a, b) in enumerate(zip(eager, got, strict=True)):
        assert torch.equal(a, b), f"compiled ub={handle}: tensor {i} differs from eager"


def main() -> None:
    global DEVICE, TRANSPORT, H, N, FFN, HEADS, GROUPS
    s = _worker.setup(sys.argv)
    DEVICE, TRANSPORT = s.device, s.transport
    if s.tp.size > 4:
        # TP 8 (issue 33): every shard still 16 bytes wide at least (FP8 GEMMs' leading
        # dimensions), and as many key/value heads as ranks.
        H, N, FFN = 64, 128, 128
        HEADS, GROUPS = 16, 8
        KINDS.update(_kinds())
    scenarios = {
        "modules": modules,
        "plans": plans,
        "switches": switches,
        "fp8": fp8,
        "pipeline": pipeline,
        "train_eval": train_eval,
        "timeout": timeout,
        "negative": negative,
        "compile": compiled,
    }
    # Several scenarios in one launch (comma-separated): a launch costs seconds of start-up.
    for name in s.scenario.split(","):
        gen = torch.Generator().manual_seed(1234)  # the same whole tensors on every rank
        scenarios[name](s.tp, gen)
        if s.tp.rank == 0:
            print(f"scenario {name}: ok", flush=True)


if __name__ == "__main__":
    _worker.run(main)

"""Single-process references of the layers: the same math on whole tensors, plain torch.

Each function takes the whole layer's parameters as the layers' ``full_state_dict()`` gives
them (and ``load_full_state_dict()`` takes them) and the whole input ``[T, ...]``, and returns
the whole output, computed in float32. They are the oracle of the layers' tests (docs/design.md
§5) and a way to check a sharded model against an unsharded one.
"""

from __future__ import annotations

import torch

__all__ = ["layernorm_linear", "layernorm_mlp", "linear", "norm", "transformer_layer"]


def linear(x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """``x W^T + b`` (``state``: ``weight`` ``[N, K]``, optional ``bias`` ``[N]``)."""
    y = x.float() @ state["weight"].float().t()
    if state.get("bias") is not None:
        y = y + state["bias"].float()
    return y


def norm(x: torch.Tensor, state: dict[str, torch.Tensor], normalization: str, eps: float):
    """LayerNorm (``layer_norm_weight``, ``layer_norm_bias``) or RMSNorm over the last dim."""
    h = x.shape[-1]
    w = state["layer_norm_weight"].float()
    if normalization == "RMSNorm":
        return torch.nn.functional.rms_norm(x.float(), (h,), w, eps)
    b = state.get("layer_norm_bias")
    b = None if b is None else b.float()
    return torch.nn.functional.layer_norm(x.float(), (h,), w, b, eps)


def layernorm_linear(
    x: torch.Tensor, state: dict[str, torch.Tensor], normalization: str = "LayerNorm", eps=1e-5
) -> torch.Tensor:
    """The norm, then ``linear``."""
    return linear(norm(x, state, normalization, eps), state)


def layernorm_mlp(
    x: torch.Tensor,
    state: dict[str, torch.Tensor],
    activation: str = "gelu",
    normalization: str = "LayerNorm",
    eps: float = 1e-5,
) -> torch.Tensor:
    """The norm, fc1, GELU (tanh) or SwiGLU (``fc1_weight`` = gate rows, then up rows), fc2."""
    h = linear(norm(x, state, normalization, eps), _prefixed(state, "fc1_"))
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        a = torch.nn.functional.silu(gate) * up
    else:
        a = torch.nn.functional.gelu(h, approximate="tanh")
    return linear(a, _prefixed(state, "fc2_"))


def _prefixed(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def transformer_layer(
    x: torch.Tensor,
    state: dict[str, torch.Tensor],
    *,
    num_attention_heads: int,
    num_query_groups: int | None = None,
    head_dim: int | None = None,
    activation: str = "swiglu",
    normalization: str = "RMSNorm",
    eps: float = 1e-5,
) -> torch.Tensor:
    """:class:`~overlap.layers.TransformerLayer` on the whole ``[s, b, H]`` input (its
    ``full_state_dict()`` keys): pre-norm causal grouped-query attention, then the MLP."""
    s, b, hidden = x.shape
    heads = num_attention_heads
    groups = num_query_groups or heads
    d = head_dim or hidden // heads
    x = x.float()
    ln = norm(x, {"layer_norm_weight": state["qkv_norm_weight"],
                  "layer_norm_bias": state.get("qkv_norm_bias")}, normalization, eps)  # fmt: skip
    q, k, v = (
        linear(ln, {"weight": state[f"{n}_weight"], "bias": state.get(f"{n}_bias")}) for n in "qkv"
    )
    q = q.view(s, b, heads, d).permute(1, 2, 0, 3)
    k, v = (t.view(s, b, groups, d).permute(1, 2, 0, 3) for t in (k, v))
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=groups != heads
    )
    o = o.permute(2, 0, 1, 3).reshape(s, b, heads * d)
    h = x + linear(o, {"weight": state["proj_weight"], "bias": state.get("proj_bias")})
    mlp = {k.removeprefix("mlp_"): v for k, v in state.items() if k.startswith("mlp_")}
    return h + layernorm_mlp(h, mlp, activation, normalization, eps)

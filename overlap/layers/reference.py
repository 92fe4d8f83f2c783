"""Single-process references of the layers: the same math on whole tensors, plain torch.

Each function takes the whole layer's parameters as the layers' ``full_state_dict()`` gives
them (and ``load_full_state_dict()`` takes them) and the whole input ``[T, ...]``, and returns
the whole output, computed in float32. They are the oracle of the layers' tests (docs/design.md
§5) and a way to check a sharded model against an unsharded one.
"""

from __future__ import annotations

import torch

__all__ = ["layernorm_linear", "layernorm_mlp", "linear", "norm"]


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
    b = state["layer_norm_bias"].float()
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

"""A pre-norm, sequence-parallel transformer layer built from the tensor-parallel layers.

::

    x [s/tp, b, H] --- LayerNormLinear (qkv) --> causal attention on the local heads ---
      |                  [s, b, (q + 2 kv) heads/tp x d]     (scaled_dot_product_attention)
      |                                                                              |
      +------------------------------ + <---------- RowParallelLinear (proj) <-------+
                                      | [s/tp, b, H]
                                      +--- LayerNormMLP (fc1, activation, fc2) --- + --> out

Grouped-query attention: ``num_attention_heads`` query heads share ``num_query_groups``
key/value heads; each rank computes ``num_attention_heads / tp`` query heads and
``num_query_groups / tp`` key/value heads, so both must be divisible by the TP size. The qkv
weight shard of a rank holds its query rows, then its key rows, then its value rows; a whole
layer's state dict keeps them apart (``q_weight``, ``k_weight``, ``v_weight``).

One :class:`~overlap.ub.Userbuffers` handle serves every layer of a model: the layers run one
after another, and the buffers are shared (docs/design.md §3, invariant 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from overlap.errors import ConfigError, InvalidArgumentError
from overlap.layers.layernorm import LayerNormLinear, LayerNormMLP
from overlap.layers.linear import ParallelLinearBase, RowParallelLinear, _rows

if TYPE_CHECKING:
    from overlap.layers.fp8 import Fp8Recipe
    from overlap.ub import Userbuffers

__all__ = ["TransformerLayer"]


class TransformerLayer(ParallelLinearBase):
    """``x + attn(norm(x))``, then ``+ mlp(norm(.))``, tensor- and sequence-parallel.

    Args:
        hidden_size: ``H``.
        ffn_hidden_size: the MLP's ``F``.
        num_attention_heads: query heads of the whole layer.
        num_query_groups: key/value heads (grouped-query attention; default: one per query
            head).
        head_dim: default ``H / num_attention_heads``.
        activation, normalization, eps: of the MLP and both norms (:class:`LayerNormMLP`).
        bias: biases on every linear.
        tp_group, ub, params_dtype, device, fuse_wgrad_accumulation, fp8_recipe: as
            :class:`~overlap.layers.ColumnParallelLinear` (the qkv, proj, fc1 and fc2 GEMMs of
            the handle).

    Shapes: ``[s/tp, b, H]`` in and out (sequence-first, the sequence sharded), or
    ``[T/tp, H]`` for a single sequence of ``T`` tokens.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        *,
        num_query_groups: int | None = None,
        head_dim: int | None = None,
        activation: str = "swiglu",
        normalization: str = "RMSNorm",
        eps: float = 1e-5,
        bias: bool = False,
        tp_group: Any = None,
        ub: Userbuffers | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        fuse_wgrad_accumulation: bool = False,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> None:
        super().__init__(tp_group=tp_group, ub=ub, fp8_recipe=fp8_recipe)
        tp = self.tp_size
        groups = num_query_groups or num_attention_heads
        if num_attention_heads % groups or num_attention_heads % tp or groups % tp:
            raise ConfigError(
                f"{num_attention_heads} query heads and {groups} key/value heads: both must be "
                f"divisible by the TP size {tp}, and the query heads by the key/value heads"
            )
        if head_dim is None:
            if hidden_size % num_attention_heads:
                raise ConfigError(
                    f"hidden_size {hidden_size} is not divisible by {num_attention_heads} heads; "
                    "give head_dim"
                )
            head_dim = hidden_size // num_attention_heads
        self.hidden_size, self.head_dim = int(hidden_size), int(head_dim)
        self.num_heads, self.num_groups = int(num_attention_heads), int(groups)
        common = {
            "tp_group": self.tp.group,
            "ub": ub,
            "params_dtype": params_dtype,
            "device": device,
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "fp8_recipe": fp8_recipe,
            "bias": bias,
        }
        qkv_out = (self.num_heads + 2 * self.num_groups) * self.head_dim
        self.qkv = LayerNormLinear(
            hidden_size, qkv_out, gemm="qkv", normalization=normalization, eps=eps, **common
        )
        self.proj = RowParallelLinear(
            self.num_heads * self.head_dim, hidden_size, gemm="proj", **common
        )
        self.mlp = LayerNormMLP(
            hidden_size,
            ffn_hidden_size,
            activation=activation,
            normalization=normalization,
            eps=eps,
            **common,
        )

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, heads={self.num_heads}, "
            f"query_groups={self.num_groups}, head_dim={self.head_dim}, tp={self.tp_size}"
        )

    def forward(self, x: torch.Tensor, *, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """``[s/tp, b, H]`` (or ``[T/tp, H]``) -> the same shape."""
        if x.dim() not in (2, 3) or x.shape[-1] != self.hidden_size:
            raise InvalidArgumentError(
                f"TransformerLayer: the input must be [s/tp, b, {self.hidden_size}] or "
                f"[T/tp, {self.hidden_size}], got {list(x.shape)}"
            )
        x3 = x if x.dim() == 3 else x.unsqueeze(1)
        qkv = self.qkv(x3, is_first_microbatch=is_first_microbatch)  # [s, b, (q+2kv)/tp * d]
        attn = self._attention(qkv)  # [s, b, q/tp * d]
        h = x3 + self.proj(attn, is_first_microbatch=is_first_microbatch)
        out = h + self.mlp(h, is_first_microbatch=is_first_microbatch)
        return out if x.dim() == 3 else out.squeeze(1)

    def _attention(self, qkv: torch.Tensor) -> torch.Tensor:
        s, b, _ = qkv.shape
        tp, d = self.tp_size, self.head_dim
        hq, hkv = self.num_heads // tp, self.num_groups // tp
        q, k, v = qkv.view(s, b, hq + 2 * hkv, d).split([hq, hkv, hkv], dim=2)
        # [s, b, heads, d] -> [b, heads, s, d], as scaled_dot_product_attention takes it.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=hkv != hq
        )
        return o.permute(2, 0, 1, 3).reshape(s, b, hq * d)

    # ---- full weights ---------------------------------------------------------------------

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load the whole layer's parameters: ``qkv_norm_weight`` (and ``_bias``),
        ``q_weight`` ``[heads d, H]``, ``k_weight`` / ``v_weight`` ``[groups d, H]`` (and
        ``q_bias``...), ``proj_weight`` ``[H, heads d]`` (``proj_bias``), and the MLP's keys
        of :meth:`LayerNormMLP.load_full_state_dict` prefixed with ``mlp_``."""
        tp = self.tp_size
        qkv = {"layer_norm_weight": state["qkv_norm_weight"]}
        if "qkv_norm_bias" in state:
            qkv["layer_norm_bias"] = state["qkv_norm_bias"]
        for part in ("weight", "bias"):
            if f"q_{part}" in state:
                q, k, v = (state[f"{n}_{part}"] for n in "qkv")
                qkv[part] = torch.cat(
                    [
                        t
                        for r in range(tp)
                        for t in (_rows(q, tp, r), _rows(k, tp, r), _rows(v, tp, r))
                    ]
                )
        self.qkv.load_full_state_dict(qkv)
        self.proj.load_full_state_dict(
            {k.removeprefix("proj_"): v for k, v in state.items() if k.startswith("proj_")}
        )
        self.mlp.load_full_state_dict(
            {k.removeprefix("mlp_"): v for k, v in state.items() if k.startswith("mlp_")}
        )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole layer's parameters (the keys of :meth:`load_full_state_dict`)."""
        tp, d = self.tp_size, self.head_dim
        qkv = self.qkv.full_state_dict()
        out = {"qkv_norm_weight": qkv["layer_norm_weight"]}
        if "layer_norm_bias" in qkv:
            out["qkv_norm_bias"] = qkv["layer_norm_bias"]
        sizes = [self.num_heads * d // tp, self.num_groups * d // tp, self.num_groups * d // tp]
        for part in ("weight", "bias"):
            if part not in qkv:
                continue
            blocks = [b.split(sizes) for b in qkv[part].chunk(tp)]
            for i, name in enumerate("qkv"):
                out[f"{name}_{part}"] = torch.cat([b[i] for b in blocks])
        out.update({f"proj_{k}": v for k, v in self.proj.full_state_dict().items()})
        out.update({f"mlp_{k}": v for k, v in self.mlp.full_state_dict().items()})
        return out

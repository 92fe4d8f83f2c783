"""Norm-fused tensor-parallel layers: :class:`LayerNormLinear` and :class:`LayerNormMLP`.

The norm (LayerNorm or RMSNorm) runs on this rank's ``[T/tp, H]`` shard of the residual
stream (sequence parallelism); its parameters are replicated and their gradients summed over
the TP group, since each rank normalises its own tokens only (docs/design.md §9).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import torch

from overlap.errors import ConfigError
from overlap.layers._activation import swiglu
from overlap.layers._functions import all_reduce_grad
from overlap.layers._tp import TensorParallelGroup
from overlap.layers.linear import (
    ColumnParallelLinear,
    ParallelLinearBase,
    RowParallelLinear,
    _factory,
    _rows,
)

if TYPE_CHECKING:
    from overlap.layers.fp8 import Fp8Recipe
    from overlap.ub import Userbuffers

__all__ = ["Activation", "LayerNormLinear", "LayerNormMLP", "Normalization"]


class Normalization(enum.Enum):
    """The norm ahead of a column-parallel GEMM."""

    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"


class Activation(enum.Enum):
    """The MLP's activation."""

    GELU = "gelu"  #: tanh-approximated GELU of ``fc1(x)``
    SWIGLU = "swiglu"  #: ``silu(gate) * up``; fc1 holds the gate and up weights


def _enum(cls: type[enum.Enum], value: object, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(
            f"{what} must be one of {[m.value for m in cls]}, got {value!r}"
        ) from None


class _Norm(torch.nn.Module):
    """A replicated LayerNorm / RMSNorm over the last dim, gradients summed over the group."""

    def __init__(
        self,
        hidden: int,
        kind: Normalization,
        eps: float,
        group: TensorParallelGroup,
        factory: dict[str, Any],
    ) -> None:
        super().__init__()
        self.kind, self.eps, self.hidden, self.group = kind, float(eps), hidden, group
        self.weight = torch.nn.Parameter(torch.ones(hidden, **factory))
        self.bias = (
            torch.nn.Parameter(torch.zeros(hidden, **factory))
            if kind is Normalization.LAYER_NORM
            else None
        )
        for p in self.parameters():
            p.sequence_parallel = True  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = all_reduce_grad(self.weight, self.group).to(x.dtype)
        if self.kind is Normalization.RMS_NORM:
            return torch.nn.functional.rms_norm(x, (self.hidden,), w, self.eps)
        b = all_reduce_grad(self.bias, self.group).to(x.dtype)  # type: ignore[arg-type]
        return torch.nn.functional.layer_norm(x, (self.hidden,), w, b, self.eps)


class LayerNormLinear(ColumnParallelLinear):
    """Norm on the local shard, then the column-parallel GEMM (qkv).

    Args:
        in_features, out_features: as :class:`ColumnParallelLinear` (``in_features`` is the
            hidden size the norm runs over).
        normalization: ``"LayerNorm"`` or ``"RMSNorm"`` (:class:`Normalization`).
        eps: the norm's epsilon.
        return_layernorm_output: also return the norm's output ``[T/tp, H]`` (e.g. for a
            residual taken after the norm).
        **kwargs: every other argument of :class:`ColumnParallelLinear`.

    Parameters: ``layer_norm_weight`` / ``layer_norm_bias`` (``[H]``, replicated; no bias
    for RMSNorm), then the column-parallel ``weight`` / ``bias``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        normalization: Normalization | str = Normalization.LAYER_NORM,
        eps: float = 1e-5,
        return_layernorm_output: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(in_features, out_features, **kwargs)
        kind = _enum(Normalization, normalization, "normalization")
        factory = {"dtype": self.weight.dtype, "device": self.weight.device}
        self.norm = _Norm(in_features, kind, eps, self.tp, factory)
        self.return_layernorm_output = bool(return_layernorm_output)

    @property
    def layer_norm_weight(self) -> torch.nn.Parameter:
        return self.norm.weight

    @property
    def layer_norm_bias(self) -> torch.nn.Parameter | None:
        return self.norm.bias

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, *, is_first_microbatch: bool | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``[T/tp, H]`` (or ``[s/tp, b, H]``) -> ``[T, N/tp]``; with
        ``return_layernorm_output``, ``(output, norm output [T/tp, H])``."""
        ln = self.norm(x)
        y = super().forward(ln, is_first_microbatch=is_first_microbatch)
        return (y, ln) if self.return_layernorm_output else y

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load from ``{"layer_norm_weight", "layer_norm_bias", "weight", "bias"}`` of the
        whole layer (``layer_norm_bias`` only for LayerNorm)."""
        _load_norm(self.norm, state)
        super().load_full_state_dict(state)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole layer's parameters (the keys of :meth:`load_full_state_dict`)."""
        return {**_norm_state(self.norm), **super().full_state_dict()}


class LayerNormMLP(ParallelLinearBase):
    """Norm, fc1 (column-parallel), activation, fc2 (row-parallel): a transformer MLP block.

    Args:
        hidden_size: ``H``.
        ffn_hidden_size: ``F`` of the whole layer (every rank holds ``F / tp``).
        activation: ``"gelu"`` or ``"swiglu"`` (:class:`Activation`). With SwiGLU, fc1 holds
            the gate and the up weight of this rank, ``[2 F/tp, H]`` (its gate rows, then its up
            rows): both share one gather and one GEMM.
        normalization, eps, return_layernorm_output: as :class:`LayerNormLinear`.
        bias: fc1 and fc2 biases.
        tp_group, ub, params_dtype, device, fuse_wgrad_accumulation, fp8_recipe: as
            :class:`ColumnParallelLinear` (fc1 uses the handle's ``fc1_*`` GEMMs, fc2 its
            ``fc2_*``).
        ub_overlap_ag, ub_bulk_dgrad, ub_bulk_wgrad, ub_overlap_rs_dgrad: fc1's switches
            (:class:`ColumnParallelLinear`).
        ub_overlap_rs, ub_overlap_ag_dgrad: fc2's forward GEMM+RS and backward AG+GEMM
            (:class:`RowParallelLinear`'s ``ub_overlap_rs`` / ``ub_overlap_ag``).

    Shapes: ``[T/tp, H]`` (or ``[s/tp, b, H]``) in and out.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        *,
        activation: Activation | str = Activation.GELU,
        normalization: Normalization | str = Normalization.LAYER_NORM,
        eps: float = 1e-5,
        return_layernorm_output: bool = False,
        bias: bool = True,
        tp_group: Any = None,
        ub: Userbuffers | None = None,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        fuse_wgrad_accumulation: bool = False,
        fp8_recipe: Fp8Recipe | None = None,
        ub_overlap_ag: bool | None = None,
        ub_bulk_dgrad: bool | None = None,
        ub_bulk_wgrad: bool | None = None,
        ub_overlap_rs_dgrad: bool | None = None,
        ub_overlap_rs: bool | None = None,
        ub_overlap_ag_dgrad: bool | None = None,
    ) -> None:
        super().__init__(tp_group=tp_group, ub=ub, fp8_recipe=fp8_recipe)
        self.activation = _enum(Activation, activation, "activation")
        kind = _enum(Normalization, normalization, "normalization")
        if ffn_hidden_size % self.tp_size:
            raise ConfigError(
                f"ffn_hidden_size {ffn_hidden_size} must be divisible by the TP size {self.tp_size}"
            )
        self.hidden_size, self.ffn_hidden_size = int(hidden_size), int(ffn_hidden_size)
        gated = self.activation is Activation.SWIGLU
        common = {
            "tp_group": self.tp.group,
            "ub": ub,
            "params_dtype": params_dtype,
            "device": device,
            "fuse_wgrad_accumulation": fuse_wgrad_accumulation,
            "fp8_recipe": fp8_recipe,
            "bias": bias,
        }
        self.fc1 = ColumnParallelLinear(
            hidden_size,
            ffn_hidden_size * (2 if gated else 1),
            gemm="fc1",
            ub_overlap_ag=ub_overlap_ag,
            ub_bulk_dgrad=ub_bulk_dgrad,
            ub_bulk_wgrad=ub_bulk_wgrad,
            ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
            **common,
        )
        self.fc2 = RowParallelLinear(
            ffn_hidden_size,
            hidden_size,
            gemm="fc2",
            ub_overlap_rs=ub_overlap_rs,
            ub_overlap_ag=ub_overlap_ag_dgrad,
            **common,
        )
        factory = _factory(params_dtype, device, self.tp)
        factory["device"] = self.fc1.weight.device
        self.norm = _Norm(hidden_size, kind, eps, self.tp, factory)
        self.return_layernorm_output = bool(return_layernorm_output)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
            f"activation={self.activation.value}, tp={self.tp_size}"
        )

    def forward(
        self, x: torch.Tensor, *, is_first_microbatch: bool | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``[T/tp, H]`` -> ``[T/tp, H]``; with ``return_layernorm_output``, also the norm's
        output."""
        ln = self.norm(x)
        h = self.fc1(ln, is_first_microbatch=is_first_microbatch)
        if self.activation is Activation.SWIGLU:
            # One fused pass over h (NOTE [fused swiglu] in csrc/kernels/activation.h); h
            # is fc1's fresh output, so contiguous() costs nothing but keeps the contract.
            a = swiglu(h.contiguous())
        else:
            a = torch.nn.functional.gelu(h, approximate="tanh")
        y = self.fc2(a, is_first_microbatch=is_first_microbatch)
        return (y, ln) if self.return_layernorm_output else y

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load from the whole block's ``{"layer_norm_weight", "layer_norm_bias",
        "fc1_weight" [F, H] (SwiGLU: [2F, H], gate rows then up rows), "fc1_bias",
        "fc2_weight" [H, F], "fc2_bias"}``."""
        _load_norm(self.norm, state)
        fc1 = {"weight": self._fc1_shardable(state["fc1_weight"])}
        if "fc1_bias" in state:
            fc1["bias"] = self._fc1_shardable(state["fc1_bias"])
        self.fc1.load_full_state_dict(fc1)
        self.fc2.load_full_state_dict(
            {
                "weight": state["fc2_weight"],
                **({"bias": state["fc2_bias"]} if "fc2_bias" in state else {}),
            }
        )

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole block's parameters (the keys of :meth:`load_full_state_dict`)."""
        fc1, fc2 = self.fc1.full_state_dict(), self.fc2.full_state_dict()
        out = {**_norm_state(self.norm), "fc1_weight": self._fc1_whole(fc1["weight"])}
        if "bias" in fc1:
            out["fc1_bias"] = self._fc1_whole(fc1["bias"])
        out["fc2_weight"] = fc2["weight"]
        if "bias" in fc2:
            out["fc2_bias"] = fc2["bias"]
        return out

    def _fc1_shardable(self, t: torch.Tensor) -> torch.Tensor:
        """A whole fc1 tensor reordered so that its row blocks are the ranks' shards: SwiGLU
        ``[gate; up]`` -> ``[gate_0; up_0; gate_1; up_1; ...]``."""
        if self.activation is not Activation.SWIGLU:
            return t
        tp = self.tp_size
        gate, up = t.chunk(2, dim=0)
        return torch.cat([x for r in range(tp) for x in (_rows(gate, tp, r), _rows(up, tp, r))])

    def _fc1_whole(self, t: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`_fc1_shardable`."""
        if self.activation is not Activation.SWIGLU:
            return t
        blocks = t.chunk(2 * self.tp_size, dim=0)
        return torch.cat([*blocks[0::2], *blocks[1::2]])


def _load_norm(norm: _Norm, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        norm.weight.copy_(state["layer_norm_weight"])
        if norm.bias is not None:
            norm.bias.copy_(state["layer_norm_bias"])


def _norm_state(norm: _Norm) -> dict[str, torch.Tensor]:
    out = {"layer_norm_weight": norm.weight.detach().clone()}
    if norm.bias is not None:
        out["layer_norm_bias"] = norm.bias.detach().clone()
    return out

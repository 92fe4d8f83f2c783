"""Column- and row-parallel linear layers with sequence parallelism (Megatron layout).

``T`` tokens (sequence x micro-batch), ``tp`` ranks in the TP group; a rank holds ``T / tp``
rows of the residual stream (sequence parallelism):

* :class:`ColumnParallelLinear` (qkv, fc1): ``[T/tp, K]`` in, ``[T, N/tp]`` out; the input is
  all-gathered into the GEMM (AG+GEMM), its weight shard is ``[N/tp, K]``.
* :class:`RowParallelLinear` (proj, fc2): ``[T, K/tp]`` in, ``[T/tp, N]`` out; the GEMM's
  partial sums are reduce-scattered (GEMM+RS), then the bias is added once; its weight shard
  is ``[N, K/tp]``.

Inputs may also be ``[s/tp, b, K]`` (column) / ``[s, b, K/tp]`` (row): sequence-first, the
sequence dimension sharded. Each layer runs its collectives through a
:class:`~overlap.ub.Userbuffers` handle (the overlap ops) or, with ``ub=None``, through plain
``torch.distributed`` collectives on its TP group (the no-overlap baseline, and the path for
TP groups that span hosts). Every overlap can be switched off per layer, as TransformerEngine's
``ub_overlap_*`` / ``ub_bulk_*`` flags do; a flag left at None follows the handle's
configuration (the method of the GEMM name). The math is the same either way.

FP8 (per-tensor, current or delayed scaling): :func:`~overlap.layers.fp8_autocast` or
``fp8_recipe=``; NOTE [layer fp8 state] in :mod:`overlap.layers.fp8`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from overlap.errors import ConfigError, InvalidArgumentError
from overlap.layers._functions import (
    ColumnSpec,
    Fp8Call,
    RowSpec,
    all_reduce_grad,
    column_parallel,
    row_parallel,
)
from overlap.layers._tp import TensorParallelGroup
from overlap.layers.fp8 import Fp8Recipe, Fp8State, fp8_recipe
from overlap.ub import OverlapMethod

if TYPE_CHECKING:
    from overlap.ub import Userbuffers

__all__ = ["ColumnParallelLinear", "ParallelLinearBase", "RowParallelLinear"]

_GEMM_RS = (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS)
# Methods whose buffer holds shards of the operand's own dtype (FP8 or not, NOTE [ub buffer
# sharing] in overlap/ub/handle.py): the layer must run in the precision they were built for.
_GATHERING = (OverlapMethod.RING_AG, OverlapMethod.BULK_AG)


def _check_bool(name: str, value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{name} must be True, False or None (the handle's default)")
    return value


class ParallelLinearBase(torch.nn.Module):
    """What every tensor-parallel layer shares: its TP group, its userbuffers switches, its
    FP8 state. Not used directly."""

    def __init__(
        self,
        *,
        tp_group: Any,
        ub: Userbuffers | None,
        fp8_recipe: Fp8Recipe | None,
    ) -> None:
        super().__init__()
        if fp8_recipe is not None and not isinstance(fp8_recipe, Fp8Recipe):
            raise ConfigError(f"fp8_recipe must be an Fp8Recipe or None, got {type(fp8_recipe)}")
        self.tp = TensorParallelGroup(tp_group, ub)
        self.fp8_recipe = fp8_recipe
        self._fp8: Fp8State | None = None

    @property
    def tp_size(self) -> int:
        return self.tp.size

    @property
    def tp_rank(self) -> int:
        return self.tp.rank

    @property
    def ub(self) -> Userbuffers | None:
        return self.tp.ub

    def _switch(
        self, name: str, flag: str, value: bool | None, want: tuple[OverlapMethod, ...]
    ) -> bool:
        """A userbuffers switch: the given value (checked against the handle) or, None, whether
        the handle runs GEMM ``name`` with one of ``want``."""
        _check_bool(flag, value)
        ub = self.tp.ub
        if ub is None:
            if value:
                raise ConfigError(f"{flag}=True needs userbuffers (the layer has ub=None)")
            return False
        method = ub.method(name)
        if value is None:
            return method in want
        if value and method not in want:
            raise ConfigError(
                f"{flag}=True needs the userbuffers GEMM {name} to run "
                f"{' or '.join(m.value for m in want)}, but the handle has {method.value} "
                f"(initialize_ub(..., ub_cfgs={{{name!r}: GemmOverlapConfig(method=...)}}))"
            )
        return value

    def _check_ub_precision(self, names: list[str], fp8: bool) -> None:
        """The gathering ops this call uses hold shards of this call's precision."""
        ub = self.tp.ub
        if ub is None:
            return
        for name in names:
            if ub.method(name) in _GATHERING and ub.fp8(name) != fp8:
                raise ConfigError(
                    f"the layer runs {'FP8' if fp8 else 'high precision'} but the userbuffers "
                    f"GEMM {name} was built for {'FP8' if ub.fp8(name) else 'high precision'} "
                    f"inputs: initialize_ub(..., use_fp8={fp8})"
                )

    def _fp8_state(self) -> Fp8State | None:
        """The FP8 state of the active recipe (the layer's own, else fp8_autocast's)."""
        recipe = self.fp8_recipe or fp8_recipe()
        if recipe is None:
            return None
        if self._fp8 is None or self._fp8.recipe != recipe:
            self._fp8 = Fp8State(recipe)
        return self._fp8

    def _fp8_call(
        self, weight: torch.Tensor, name: str, is_first_microbatch: bool | None
    ) -> Fp8Call | None:
        state = self._fp8_state()
        if state is None:
            return None
        training = self.training and torch.is_grad_enabled()
        qw = state.weight_fp8(
            name, weight, training=training, is_first_microbatch=is_first_microbatch
        )
        return Fp8Call(state, qw)


def _init_uniform(fan_in: int) -> Callable[[torch.Tensor], None]:
    """``nn.Linear``'s default initialisation for the full layer's fan-in."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(t: torch.Tensor) -> None:
        torch.nn.init.uniform_(t, -bound, bound)

    return init


def _as_2d(x: torch.Tensor, features: int, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-1] != features:
        raise InvalidArgumentError(
            f"{what}: the input must be [tokens, {features}] or [s, b, {features}], got "
            f"{type(x).__name__}{list(getattr(x, 'shape', []))}"
        )
    return x.reshape(-1, features)


def _compute_weight(weight: torch.Tensor, x: torch.Tensor, fp8: Fp8Call | None) -> torch.Tensor:
    """The weight in the activations' dtype (a differentiable cast: e.g. float32 parameters
    for the optimizer, bfloat16 GEMMs); FP8 quantizes from the parameter itself."""
    if fp8 is not None or weight.dtype == x.dtype:
        return weight
    return weight.to(x.dtype)


def _main_grad(weight: torch.Tensor, fuse: bool) -> torch.Tensor | None:
    if not fuse:
        return None
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise ConfigError(
            "fuse_wgrad_accumulation=True: the weight has no main_grad (an fp32 tensor of its "
            "shape, as Megatron-LM's distributed optimizer allocates); set weight.main_grad"
        )
    if main_grad.shape != weight.shape or main_grad.dtype != torch.float32:
        raise ConfigError(
            f"weight.main_grad must be float32 of the weight's shape {list(weight.shape)}, got "
            f"{main_grad.dtype}{list(main_grad.shape)}"
        )
    return main_grad


class ColumnParallelLinear(ParallelLinearBase):
    """``Y = AllGather(X) W^T + b``: a sequence-parallel input, the output split by columns.

    Args:
        in_features: ``K``.
        out_features: ``N`` of the whole layer (every rank holds ``N / tp`` of it).
        tp_group: the TP ProcessGroup (default: the one ``ub`` was built from, else the
            world group).
        ub: the :class:`~overlap.ub.Userbuffers` handle (its ``{gemm}_fprop`` /
            ``_dgrad`` / ``_wgrad`` ops), or None for plain collectives.
        gemm: the handle's GEMM name family this layer uses: ``"qkv"`` or ``"fc1"``.
        bias: add a learnable ``[N / tp]`` bias.
        params_dtype: dtype of the parameters (default: torch's default dtype). The GEMMs run
            in the input's dtype (the weight is cast to it, e.g. float32 parameters and
            bfloat16 activations) or in FP8.
        device: where the parameters live (default: the current CUDA device on a cuda
            handle, else the CPU).
        init_method: called on the weight shard (default: ``nn.Linear``'s uniform for the
            fan-in ``K``).
        ub_overlap_ag: forward AG+GEMM (default: the handle's ``{gemm}_fprop`` is
            ``RING_AG``).
        ub_bulk_dgrad: backward: all-gather the saved input shard beside dgrad (default:
            ``{gemm}_dgrad`` is ``BULK_AG``).
        ub_bulk_wgrad: backward: reduce-scatter dgrad beside wgrad (default: ``{gemm}_wgrad``
            is ``BULK_RS``).
        ub_overlap_rs_dgrad: backward: dgrad as a GEMM+RS instead of the bulk pair (default:
            ``{gemm}_dgrad`` is a GEMM+RS method).
        fuse_wgrad_accumulation: accumulate the weight gradient into ``weight.main_grad``
            (float32) instead of returning it (Megatron-LM's gradient-accumulation fusion).
        fp8_recipe: run in FP8 with this recipe (default: the active
            :func:`~overlap.layers.fp8_autocast`).

    Shapes: input ``[T/tp, K]`` or ``[s/tp, b, K]`` (bfloat16/float16/float32), output
    ``[T, N/tp]`` or ``[s, b, N/tp]`` in the input's dtype. The weight shard is
    ``[N/tp, K]``.

    Construction is not collective; every call (forward and backward) is COLLECTIVE over the
    TP group.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tp_group: Any = None,
        ub: Userbuffers | None = None,
        gemm: str = "qkv",
        bias: bool = True,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        init_method: Callable[[torch.Tensor], None] | None = None,
        ub_overlap_ag: bool | None = None,
        ub_bulk_dgrad: bool | None = None,
        ub_bulk_wgrad: bool | None = None,
        ub_overlap_rs_dgrad: bool | None = None,
        fuse_wgrad_accumulation: bool = False,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> None:
        super().__init__(tp_group=tp_group, ub=ub, fp8_recipe=fp8_recipe)
        self.in_features, self.out_features = _check_features(in_features, out_features)
        if out_features % self.tp_size:
            raise ConfigError(
                f"out_features {out_features} must be divisible by the TP size {self.tp_size}"
            )
        self.gemm = _check_gemm(gemm, ("qkv", "fc1"))
        self.spec = self._column_spec(
            self.gemm, ub_overlap_ag, ub_bulk_dgrad, ub_bulk_wgrad, ub_overlap_rs_dgrad
        )
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        factory = _factory(params_dtype, device, self.tp)
        shard = out_features // self.tp_size
        self.weight = torch.nn.Parameter(torch.empty(shard, in_features, **factory))
        (init_method or _init_uniform(in_features))(self.weight.data)
        self.bias = (
            torch.nn.Parameter(torch.zeros(shard, **factory)) if bias else None
        )  # zero: every shard starts alike, as nn.Linear's init would not

    def _column_spec(
        self,
        gemm: str,
        overlap_ag: bool | None,
        bulk_dgrad: bool | None,
        bulk_wgrad: bool | None,
        rs_dgrad: bool | None,
    ) -> ColumnSpec:
        ag = self._switch(f"{gemm}_fprop", "ub_overlap_ag", overlap_ag, (OverlapMethod.RING_AG,))
        rs = self._switch(f"{gemm}_dgrad", "ub_overlap_rs_dgrad", rs_dgrad, _GEMM_RS)
        bd = self._switch(f"{gemm}_dgrad", "ub_bulk_dgrad", bulk_dgrad, (OverlapMethod.BULK_AG,))
        bw = self._switch(f"{gemm}_wgrad", "ub_bulk_wgrad", bulk_wgrad, (OverlapMethod.BULK_RS,))
        if rs and (bd or bw):
            if bulk_dgrad or bulk_wgrad:
                raise ConfigError(
                    "ub_overlap_rs_dgrad reduce-scatters dgrad inside its GEMM: it excludes "
                    "ub_bulk_dgrad and ub_bulk_wgrad"
                )
            bd = bw = False
        return ColumnSpec(self.tp, gemm, ag, bd, bw, rs)

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={self.tp_size}, bias={self.bias is not None}, gemm={self.gemm}, "
            f"ub_overlap_ag={s.overlap_ag}, ub_bulk_dgrad={s.bulk_dgrad}, "
            f"ub_bulk_wgrad={s.bulk_wgrad}, ub_overlap_rs_dgrad={s.rs_dgrad}"
        )

    def forward(self, x: torch.Tensor, *, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """``[T/tp, K]`` (or ``[s/tp, b, K]``) -> ``[T, N/tp]`` (or ``[s, b, N/tp]``).

        Args:
            x: this rank's input shard.
            is_first_microbatch: FP8: re-quantize the cached weight (True), reuse it (False),
                or decide from whether the weight changed since the last call (None).
        """
        x2d = _as_2d(x, self.in_features, "ColumnParallelLinear")
        fp8 = self._fp8_call(self.weight, "weight", is_first_microbatch)
        self._check_column_ub(fp8 is not None)
        y = column_parallel(
            x2d,
            _compute_weight(self.weight, x2d, fp8),
            self.bias,
            self.spec,
            main_grad=_main_grad(self.weight, self.fuse_wgrad_accumulation),
            fp8=fp8,
        )
        return y.reshape(self.tp_size * x.shape[0], *x.shape[1:-1], y.shape[-1])

    def _check_column_ub(self, fp8: bool) -> None:
        s = self.spec
        names = [f"{self.gemm}_fprop"] if s.overlap_ag else []
        if s.bulk_dgrad:
            names.append(f"{self.gemm}_dgrad")
        self._check_ub_precision(names, fp8)

    # ---- full weights ---------------------------------------------------------------------

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load this rank's shard of a whole layer's ``{"weight": [N, K], "bias": [N]}`` (an
        ``nn.Linear``'s state dict)."""
        with torch.no_grad():
            self.weight.copy_(_rows(state["weight"], self.tp_size, self.tp_rank))
            if self.bias is not None:
                self.bias.copy_(_rows(state["bias"], self.tp_size, self.tp_rank))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole layer's ``{"weight", "bias"}`` on every rank."""
        out = {"weight": self.tp.all_gather_rows(self.weight.detach())}
        if self.bias is not None:
            out["bias"] = self.tp.all_gather_rows(self.bias.detach())
        return out


class RowParallelLinear(ParallelLinearBase):
    """``Y = ReduceScatter(X W^T) + b``: the input split by columns, a sequence-parallel output.

    Args:
        in_features: ``K`` of the whole layer (every rank holds ``K / tp`` input columns).
        out_features: ``N``.
        tp_group, ub, params_dtype, device, fuse_wgrad_accumulation, fp8_recipe: as
            :class:`ColumnParallelLinear`.
        gemm: the handle's GEMM name family: ``"proj"`` or ``"fc2"``.
        bias: add a learnable ``[N]`` bias, once, after the reduce-scatter (its gradient is
            summed over the TP group).
        init_method: called on the weight shard (default: ``nn.Linear``'s uniform for the
            whole layer's fan-in ``K``).
        ub_overlap_rs: forward GEMM+RS (default: the handle's ``{gemm}_fprop`` is a GEMM+RS
            method).
        ub_overlap_ag: backward: dgrad as an AG+GEMM of the output gradient, which keeps the
            gathered gradient for wgrad (default: ``{gemm}_dgrad`` is ``RING_AG``).

    Shapes: input ``[T, K/tp]`` or ``[s, b, K/tp]`` (``T``, or ``s``, a multiple of the TP
    size), output ``[T/tp, N]`` or ``[s/tp, b, N]``. The weight shard is ``[N, K/tp]``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        tp_group: Any = None,
        ub: Userbuffers | None = None,
        gemm: str = "proj",
        bias: bool = True,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        init_method: Callable[[torch.Tensor], None] | None = None,
        ub_overlap_rs: bool | None = None,
        ub_overlap_ag: bool | None = None,
        fuse_wgrad_accumulation: bool = False,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> None:
        super().__init__(tp_group=tp_group, ub=ub, fp8_recipe=fp8_recipe)
        self.in_features, self.out_features = _check_features(in_features, out_features)
        if in_features % self.tp_size:
            raise ConfigError(
                f"in_features {in_features} must be divisible by the TP size {self.tp_size}"
            )
        self.gemm = _check_gemm(gemm, ("proj", "fc2"))
        rs = self._switch(f"{self.gemm}_fprop", "ub_overlap_rs", ub_overlap_rs, _GEMM_RS)
        ag = self._switch(
            f"{self.gemm}_dgrad", "ub_overlap_ag", ub_overlap_ag, (OverlapMethod.RING_AG,)
        )
        self.spec = RowSpec(self.tp, self.gemm, overlap_ag=ag, overlap_rs=rs)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        factory = _factory(params_dtype, device, self.tp)
        shard = in_features // self.tp_size
        self.weight = torch.nn.Parameter(torch.empty(out_features, shard, **factory))
        (init_method or _init_uniform(in_features))(self.weight.data)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, **factory)) if bias else None
        if self.bias is not None:
            self.bias.sequence_parallel = True  # type: ignore[attr-defined]

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"tp={self.tp_size}, bias={self.bias is not None}, gemm={self.gemm}, "
            f"ub_overlap_rs={s.overlap_rs}, ub_overlap_ag={s.overlap_ag}"
        )

    def forward(self, x: torch.Tensor, *, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """``[T, K/tp]`` (or ``[s, b, K/tp]``) -> ``[T/tp, N]`` (or ``[s/tp, b, N]``)."""
        x2d = _as_2d(x, self.in_features // self.tp_size, "RowParallelLinear")
        if x.shape[0] % self.tp_size:
            raise InvalidArgumentError(
                f"RowParallelLinear: {x.shape[0]} rows (the first dim) do not split over the "
                f"TP size {self.tp_size}: the tokens (or sequence) must be a multiple of it"
            )
        fp8 = self._fp8_call(self.weight, "weight", is_first_microbatch)
        if self.spec.overlap_ag:
            self._check_ub_precision([f"{self.gemm}_dgrad"], fp8 is not None)
        y = row_parallel(
            x2d,
            _compute_weight(self.weight, x2d, fp8),
            self.spec,
            main_grad=_main_grad(self.weight, self.fuse_wgrad_accumulation),
            fp8=fp8,
        )
        if self.bias is not None:
            y = y + all_reduce_grad(self.bias, self.tp).to(y.dtype)
        return y.reshape(x.shape[0] // self.tp_size, *x.shape[1:-1], y.shape[-1])

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load this rank's shard of a whole layer's ``{"weight": [N, K], "bias": [N]}``."""
        with torch.no_grad():
            self.weight.copy_(_cols(state["weight"], self.tp_size, self.tp_rank))
            if self.bias is not None:
                self.bias.copy_(state["bias"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE: the whole layer's ``{"weight", "bias"}`` on every rank."""
        w = self.tp.all_gather_rows(self.weight.detach().t().contiguous()).t().contiguous()
        out = {"weight": w}
        if self.bias is not None:
            out["bias"] = self.bias.detach().clone()
        return out


# ---- helpers ----------------------------------------------------------------------------------


def _check_features(in_features: object, out_features: object) -> tuple[int, int]:
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be a positive int, got {v!r}")
    return int(in_features), int(out_features)  # type: ignore[call-overload]


def _check_gemm(gemm: object, allowed: tuple[str, ...]) -> str:
    if gemm not in allowed:
        raise ConfigError(f"gemm must be one of {allowed} (a userbuffers GEMM name), got {gemm!r}")
    return str(gemm)


def _factory(
    dtype: torch.dtype | None, device: torch.device | str | None, tp: TensorParallelGroup
) -> dict[str, Any]:
    if device is None:
        ub = tp.ub
        if ub is not None and ub.comm.device >= 0:
            device = torch.device("cuda", ub.comm.device)
        elif tp.backend == "nccl" and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
    return {"dtype": dtype or torch.get_default_dtype(), "device": device}


def _rows(t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s block of rows of ``t``."""
    if t.shape[0] % tp:
        raise InvalidArgumentError(f"{t.shape[0]} rows do not split over {tp} ranks")
    n = t.shape[0] // tp
    return t[rank * n : (rank + 1) * n]


def _cols(t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s block of columns of a 2-D ``t``."""
    return _rows(t.t(), tp, rank).t()

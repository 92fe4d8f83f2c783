"""The autograd functions of the tensor-parallel linears (column- and row-parallel).

Each function quantizes (FP8) or passes through (high precision) its operands, calls the
custom ops of :mod:`overlap.layers._ops` for everything that communicates, and saves what its
backward needs. NOTE [saved tensors] (docs/design.md §3, invariant 2): what is saved is this
rank's own memory, never a view of a symmetric buffer: the column-parallel input's local
shard (re-gathered in backward), the row-parallel input, the weights and the FP8 data they
were quantized to. The custom ops return new tensors only; a gathered input kept in a buffer
is read inside the op that gathered it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from overlap.layers import _ops
from overlap.layers._tp import TensorParallelGroup

if TYPE_CHECKING:
    from overlap.layers.fp8 import Fp8State
    from overlap.quantization import QuantizedTensor

__all__ = ["ColumnSpec", "RowSpec", "all_reduce_grad", "column_parallel", "row_parallel"]


@dataclass(frozen=True)
class ColumnSpec:
    """How a column-parallel call communicates (constants of the layer).

    Attributes:
        group: the TP group; holding it here keeps it alive for every autograd node of the
            layer (NOTE [group ids]), whose custom ops get its id.
        gemm: the userbuffers GEMM name family (``qkv``, ``fc1``...).
        overlap_ag: forward AG+GEMM through userbuffers.
        bulk_dgrad: backward: the input's all-gather beside dgrad (bulk AG).
        bulk_wgrad: backward: dgrad's reduce-scatter beside wgrad (bulk RS).
        rs_dgrad: backward: dgrad as a GEMM+RS (excludes the two bulk ops).
    """

    group: TensorParallelGroup
    gemm: str
    overlap_ag: bool
    bulk_dgrad: bool
    bulk_wgrad: bool
    rs_dgrad: bool

    @property
    def group_id(self) -> int:
        return self.group.id


@dataclass(frozen=True)
class RowSpec:
    """How a row-parallel call communicates (constants of the layer).

    Attributes:
        group: the TP group (as :class:`ColumnSpec`).
        gemm: the userbuffers GEMM name family (``proj``, ``fc2``...).
        overlap_rs: forward GEMM+RS through userbuffers.
        overlap_ag: backward: dgrad as an AG+GEMM of the output gradient.
    """

    group: TensorParallelGroup
    gemm: str
    overlap_ag: bool
    overlap_rs: bool

    @property
    def group_id(self) -> int:
        return self.group.id


@dataclass
class Fp8Call:
    """What one FP8 call of a linear uses: the layer's FP8 state and its quantized weight
    (rowwise for forward, columnwise too when training)."""

    state: Fp8State
    weight: QuantizedTensor


def _scale(t: QuantizedTensor, columnwise: bool = False) -> torch.Tensor | None:
    return t.columnwise_scale_inv if columnwise else t.rowwise_scale_inv


class _ColumnParallel(torch.autograd.Function):
    """``Y [T, N/tp] = AllGather(x [T/tp, K]) W^T (+ b)``, W the ``[N/tp, K]`` shard."""

    @staticmethod
    def forward(  # noqa: PLR0917 (autograd.Function.apply is positional)
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        main_grad: torch.Tensor | None,
        spec: ColumnSpec,
        fp8: Fp8Call | None,
    ) -> torch.Tensor:
        out_dtype = x.dtype
        gemm_bias = None if bias is None else bias.to(out_dtype)
        if fp8 is None:
            y = _ops.dispatch(
                "column_forward",
                x, None, weight, None, gemm_bias, spec.group_id, spec.gemm, spec.overlap_ag,
                out_dtype,
            )  # fmt: skip
            ctx.save_for_backward(x, weight)
        else:
            # The amax is reduced over the group: every shard and the gathered input share one
            # scale (invariant 3). Only the rowwise data travels; wgrad transposes the gathered
            # rows.
            amax_group = spec.group.amax_group
            qx = fp8.state.input.quantize(x, amax_group=amax_group, rowwise=True, columnwise=False)
            qw = fp8.weight
            y = _ops.dispatch(
                "column_forward",
                qx.rowwise_data, _scale(qx), qw.rowwise_data, _scale(qw), gemm_bias,
                spec.group_id, spec.gemm, spec.overlap_ag, out_dtype,
            )  # fmt: skip
            saved = (qx.rowwise_data, _scale(qx), qw.columnwise_data, _scale(qw, True))
            ctx.save_for_backward(*saved)
            ctx.grad_quantizer = fp8.state.grad
        ctx.fp8 = fp8 is not None
        ctx.spec = spec
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        ctx.main_grad = main_grad
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        spec: ColumnSpec = ctx.spec
        dy = dy.contiguous()
        wgrad = ctx.needs_input_grad[1]
        main_grad = ctx.main_grad if wgrad else None
        if not ctx.fp8:
            x, weight = ctx.saved_tensors
            dx, dw = _ops.dispatch(
                "column_backward",
                dy, None, None, x, None, weight, None, main_grad, spec.group_id, spec.gemm,
                spec.bulk_dgrad, spec.bulk_wgrad, spec.rs_dgrad, wgrad, ctx.x_dtype,
                ctx.weight_dtype,
            )  # fmt: skip
        else:
            x, x_scale_inv, w_t, w_scale_inv = ctx.saved_tensors
            # dY stays local (each rank holds its own columns): its own scale.
            qdy = ctx.grad_quantizer.quantize(dy, rowwise=True, columnwise=wgrad)
            dx, dw = _ops.dispatch(
                "column_backward",
                qdy.rowwise_data, _scale(qdy), qdy.columnwise_data, x, x_scale_inv, w_t,
                w_scale_inv, main_grad, spec.group_id, spec.gemm, spec.bulk_dgrad,
                spec.bulk_wgrad, spec.rs_dgrad, wgrad, ctx.x_dtype, ctx.weight_dtype,
            )  # fmt: skip
        dbias = dy.sum(0).to(ctx.bias_dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if not wgrad or main_grad is not None:
            dw = None  # accumulated into main_grad (gradient-accumulation fusion), or frozen
        return dx, dw, dbias, None, None, None


class _RowParallel(torch.autograd.Function):
    """``Y [T/tp, N] = ReduceScatter(x [T, K/tp] W^T)``, W the ``[N, K/tp]`` shard; the bias
    is added by the caller, once, after the reduce-scatter."""

    @staticmethod
    def forward(  # noqa: PLR0917 (autograd.Function.apply is positional)
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        main_grad: torch.Tensor | None,
        spec: RowSpec,
        fp8: Fp8Call | None,
    ) -> torch.Tensor:
        out_dtype = x.dtype
        if fp8 is None:
            y = _ops.dispatch(
                "row_forward",
                x,
                None,
                weight,
                None,
                spec.group_id,
                spec.gemm,
                spec.overlap_rs,
                out_dtype,
            )
            ctx.save_for_backward(x, weight)
        else:
            # x stays local: its own scale; the columnwise data feeds wgrad.
            qx = fp8.state.input.quantize(x, rowwise=True, columnwise=True)
            qw = fp8.weight
            y = _ops.dispatch(
                "row_forward",
                qx.rowwise_data, _scale(qx), qw.rowwise_data, _scale(qw), spec.group_id,
                spec.gemm, spec.overlap_rs, out_dtype,
            )  # fmt: skip
            saved = (qx.columnwise_data, _scale(qx, True), qw.columnwise_data, _scale(qw, True))
            ctx.save_for_backward(*saved)
            ctx.grad_quantizer = fp8.state.grad
        ctx.fp8 = fp8 is not None
        ctx.spec = spec
        ctx.weight_dtype = weight.dtype
        ctx.main_grad = main_grad
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        spec: RowSpec = ctx.spec
        dy = dy.contiguous()
        wgrad = ctx.needs_input_grad[1]
        main_grad = ctx.main_grad if wgrad else None
        if not ctx.fp8:
            x, weight = ctx.saved_tensors
            dx, dw = _ops.dispatch(
                "row_backward",
                dy, None, x, None, weight, None, main_grad, spec.group_id, spec.gemm,
                spec.overlap_ag, wgrad, ctx.x_dtype, ctx.weight_dtype,
            )  # fmt: skip
        else:
            x_t, x_scale_inv, w_t, w_scale_inv = ctx.saved_tensors
            # dY is gathered: its amax is reduced over the group (one scale, invariant 3).
            amax_group = spec.group.amax_group
            qdy = ctx.grad_quantizer.quantize(
                dy, amax_group=amax_group, rowwise=True, columnwise=False
            )
            dx, dw = _ops.dispatch(
                "row_backward",
                qdy.rowwise_data, _scale(qdy), x_t, x_scale_inv, w_t, w_scale_inv, main_grad,
                spec.group_id, spec.gemm, spec.overlap_ag, wgrad, ctx.x_dtype, ctx.weight_dtype,
            )  # fmt: skip
        if not wgrad or main_grad is not None:
            dw = None
        return dx, dw, None, None, None


class _AllReduceGrad(torch.autograd.Function):
    """Identity forward; the gradient is summed over the TP group (a replicated parameter
    applied to this rank's tokens only: norm weights, a row-parallel bias)."""

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, group: TensorParallelGroup) -> torch.Tensor:
        ctx.group = group  # alive until the backward (NOTE [group ids])
        return param.view_as(param)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _ops.dispatch("tp_all_reduce", grad.contiguous(), ctx.group.id), None


def column_parallel(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    spec: ColumnSpec,
    *,
    main_grad: torch.Tensor | None = None,
    fp8: Fp8Call | None = None,
) -> torch.Tensor:
    """``AllGather(x) W^T + b`` for a 2-D shard ``x`` ``[m, K]``: ``[tp * m, N]``."""
    return _ColumnParallel.apply(x, weight, bias, main_grad, spec, fp8)


def row_parallel(
    x: torch.Tensor,
    weight: torch.Tensor,
    spec: RowSpec,
    *,
    main_grad: torch.Tensor | None = None,
    fp8: Fp8Call | None = None,
) -> torch.Tensor:
    """``ReduceScatter(x W^T)`` for a 2-D ``x`` ``[T, K]``: ``[T / tp, N]``."""
    return _RowParallel.apply(x, weight, main_grad, spec, fp8)


def all_reduce_grad(param: torch.Tensor, group: TensorParallelGroup) -> torch.Tensor:
    """``param`` as it is, its gradient summed over the TP group: use it for a parameter
    every rank holds whole but applies to its own tokens only (sequence parallelism), e.g.
    ``F.embedding(tokens, all_reduce_grad(emb.weight, tp))``."""
    return _AllReduceGrad.apply(param, group)

"""The side GEMM of a bulk op (:mod:`overlap.ops.bulk`): its checks, its plan (NOTE [op plans]
in :mod:`overlap.ops._operands`) and the native call's ``gemm`` dict.

The GEMM is described as for :func:`overlap.gemm.gemm` (``a``, ``b``, ``transa``, ``transb``,
``out``, ``out_dtype``, ``alpha``, ``beta``, ``bias``, ``gelu``, FP8 ``out_scale`` /
``out_amax``, ``fast_accum``, ``sm_count``); FP8 operands are per-tensor scaled, given as a
:class:`~overlap.quantization.QuantizedTensor` (its rowwise data) or as an FP8 tensor with its
``a_scale_inv`` / ``b_scale_inv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from overlap.errors import InvalidArgumentError
from overlap.ops._operands import Operand, Split, is_fp8, split_as, split_of, split_operand

if TYPE_CHECKING:
    import torch

__all__ = ["SIDE_TENSORS", "SidePlan", "plan_side_gemm", "side_gemm", "side_gemm_as"]

#: The side GEMM's keywords that take a tensor (or None): a call's key holds their
#: signatures, and the values of the others (NOTE [op plans]).
SIDE_TENSORS = frozenset({"out", "bias", "a_scale_inv", "b_scale_inv", "out_scale", "out_amax"})


@dataclass(frozen=True)
class SidePlan:
    """What the checks of a side GEMM derived (NOTE [op plans]); it holds no tensor."""

    a: Split  # how ``a`` splits (None: a tensor, FP8 ones with the call's a_scale_inv)
    b: Split
    out_shape: tuple[int, int]  # of the output the op allocates when the call gives none
    out_dtype: torch.dtype  # likewise
    fp8: bool  # FP8 operands: fast_accum's default


def _gemm_operand(
    op: str, name: str, x: object, scale_inv: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A side-GEMM operand as (2-D data, per-tensor scale_inv or None)."""
    import torch

    if isinstance(x, torch.Tensor) and is_fp8(x.dtype):
        if scale_inv is None:
            raise InvalidArgumentError(
                f"{op}: the GEMM's {name} is an FP8 tensor without {name}_scale_inv; pass it "
                "(or a QuantizedTensor)"
            )
        if x.dim() != 2:
            raise InvalidArgumentError(
                f"{op}: the GEMM's {name} must be 2-D, got shape {tuple(x.shape)}"
            )
        return x, scale_inv
    if scale_inv is not None:
        raise InvalidArgumentError(
            f"{op}: {name}_scale_inv is only for a bare FP8 tensor {name} (a QuantizedTensor "
            "carries its own)"
        )
    return split_operand(op, f"the GEMM's {name}", x)


def plan_side_gemm(
    op: str,
    a: Operand,
    b: Operand,
    device: torch.device,
    *,
    transa: bool = False,
    transb: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    alpha: float = 1.0,  # (all of side_gemm's keywords: the unused ones too)
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    sm_count: int = 0,
) -> SidePlan:
    """Every Python check of a side GEMM (raises as :func:`side_gemm`), and what they
    derive."""
    import torch

    ad, _ = _gemm_operand(op, "a", a, a_scale_inv)
    bd, _ = _gemm_operand(op, "b", b, b_scale_inv)
    for name, t in (("a", ad), ("b", bd)):
        if t.device != device:
            raise InvalidArgumentError(
                f"{op}: the GEMM's {name} is on {t.device}, the op on {device}"
            )
    if is_fp8(ad.dtype) != is_fp8(bd.dtype) or (not is_fp8(ad.dtype) and ad.dtype != bd.dtype):
        raise InvalidArgumentError(
            f"{op}: the GEMM's a ({ad.dtype}) and b ({bd.dtype}) must both be FP8 or share one "
            "dtype"
        )
    m = ad.shape[1] if transa else ad.shape[0]
    n = bd.shape[0] if transb else bd.shape[1]
    if out is None:
        if beta != 0.0:
            raise InvalidArgumentError(f"{op}: beta={beta} accumulates into out: pass out=")
        if out_dtype is None:
            out_dtype = torch.bfloat16 if is_fp8(ad.dtype) else ad.dtype
    elif tuple(out.shape) != (m, n) or (out_dtype is not None and out.dtype != out_dtype):
        raise InvalidArgumentError(
            f"{op}: the GEMM's out must be [{m}, {n}]"
            + (f" of {out_dtype}" if out_dtype is not None else "")
            + f", got {out.dtype}{list(out.shape)}"
        )
    return SidePlan(
        a=split_of(a),
        b=split_of(b),
        out_shape=(m, n),
        out_dtype=out_dtype,  # type: ignore[arg-type]
        fp8=is_fp8(ad.dtype),
    )


def side_gemm_as(
    plan: SidePlan,
    a: Operand,
    b: Operand,
    device: torch.device,
    *,
    transa: bool = False,
    transb: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,  # (the plan's, when out is allocated)
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    sm_count: int = 0,
) -> dict[str, Any]:
    """The native call's ``gemm`` dict of a side GEMM that :func:`plan_side_gemm` planned as
    ``plan`` (the same keywords): no check; ``out`` allocated when not given."""
    ad, asi = split_as(a, plan.a)
    bd, bsi = split_as(b, plan.b)
    if out is None:
        import torch

        out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=device)
    return {
        "a": ad,
        "b": bd,
        "out": out,
        "transa": bool(transa),
        "transb": bool(transb),
        "a_scale_inv": a_scale_inv if plan.a is None else asi,
        "b_scale_inv": b_scale_inv if plan.b is None else bsi,
        "alpha": float(alpha),
        "beta": float(beta),
        "bias": bias,
        "gelu": bool(gelu),
        "out_scale": out_scale,
        "out_amax": out_amax,
        "fast_accum": plan.fp8 if fast_accum is None else bool(fast_accum),
        "sm_count": int(sm_count),
    }


def side_gemm(op: str, a: Operand, b: Operand, device: torch.device, **gemm: Any) -> dict[str, Any]:
    """The side GEMM of a bulk op as the native call's ``gemm`` dict, checked (``out``
    allocated when not given: ``[m, n]`` of ``out_dtype``, default the inputs' dtype, bfloat16
    for FP8). Also the reference's description of the same GEMM (:mod:`overlap.ops.reference`).
    """
    return side_gemm_as(plan_side_gemm(op, a, b, device, **gemm), a, b, device, **gemm)

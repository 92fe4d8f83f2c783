"""Pure-torch float64 reference of overlap.gemm, written from its definition (NOTE [gemm
output] in csrc/gemm/gemm.h), independent of the C++ host reference; and input makers shared
by the host and GPU tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from overlap.quantization import ScalingMode, quantize_block_1x128, quantize_block_128x128

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor | None, mode: ScalingMode | None):
    """float64 values of stored data ``q`` (any layout) under its scaling."""
    v = q.cpu().double()
    if scale_inv is None:
        return v
    s = scale_inv.cpu().double()
    rows, cols = v.shape
    if mode in (None, ScalingMode.TENSOR):
        return v * s.reshape(())
    if mode == ScalingMode.BLOCK_1X128:
        return v * s.repeat_interleave(128, 1)[:, :cols]
    if mode == ScalingMode.BLOCK_128X128:
        return v * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    raise ValueError(mode)


def gelu_tanh(v: torch.Tensor) -> torch.Tensor:
    return 0.5 * v * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def reference(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    transa: bool = False,
    transb: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    a_scaling: ScalingMode | None = None,
    b_scaling: ScalingMode | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    old: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
) -> torch.Tensor:
    """``v`` of the definition, float64 on cpu, [m, n]."""
    av = dequantize(a, a_scale_inv, a_scaling)
    bv = dequantize(b, b_scale_inv, b_scaling)
    v = alpha * ((av.T if transa else av) @ (bv.T if transb else bv))
    if beta != 0.0:
        v = v + beta * old.cpu().double()
    if bias is not None:
        v = v + bias.cpu().double()
    return gelu_tanh(v) if gelu else v


def to_fp8(v: torch.Tensor, scale: float, fmt: torch.dtype) -> torch.Tensor:
    """Saturating cast of float64 ``v * scale`` (computed in float32, as the GEMM does)."""
    m = FP8_MAX[fmt]
    return (v.float() * scale).clamp(-m, m).to(fmt)


@dataclass
class Fp8Operand:
    data: torch.Tensor
    scale_inv: torch.Tensor
    scaling: ScalingMode


def scales(qa: Fp8Operand, qb: Fp8Operand, device: str | None = None) -> dict:
    """The scale arguments of an FP8 pair for gemm() and reference(), on ``device``."""

    def move(t: torch.Tensor) -> torch.Tensor:
        return t if device is None else t.to(device)

    return {
        "a_scale_inv": move(qa.scale_inv),
        "b_scale_inv": move(qb.scale_inv),
        "a_scaling": qa.scaling,
        "b_scaling": qb.scaling,
    }


def per_tensor_fp8(x: torch.Tensor, fmt: torch.dtype) -> Fp8Operand:
    """x quantized with one scale mapping its amax to the format's max / 2."""
    scale = FP8_MAX[fmt] / 2 / float(x.abs().max())
    return Fp8Operand(
        to_fp8(x.double(), scale, fmt), torch.tensor([1.0 / scale]), ScalingMode.TENSOR
    )


def block_fp8(x: torch.Tensor, fmt: torch.dtype, mode: ScalingMode) -> Fp8Operand:
    """x [rows, cols] quantized rowwise by overlap's own block quantizer (host)."""
    fn = quantize_block_1x128 if mode == ScalingMode.BLOCK_1X128 else quantize_block_128x128
    q = fn(x.float().contiguous(), fp8_dtype=fmt)
    data = q.rowwise_data
    if data.dtype == torch.uint8:
        data = data.view(fmt)
    return Fp8Operand(data, q.rowwise_scale_inv, mode)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def run_fp8(
    qa: Fp8Operand,
    qb: Fp8Operand,
    out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    beta: float = 0.0,
    **options: object,
) -> torch.Tensor:
    """Runs the K-contiguous FP8 GEMM ``qa @ qb^T`` into ``out`` on out's device (operands,
    scales and bias are moved there) and returns the float64 reference ``v`` of that call."""
    from overlap.gemm import gemm

    device = str(out.device)
    old = out.cpu() if beta != 0.0 else None
    gemm(
        qa.data.to(device),
        qb.data.to(device),
        transb=True,
        **scales(qa, qb, device),
        bias=None if bias is None else bias.to(device),
        gelu=gelu,
        beta=beta,
        out=out,
        **options,
    )
    return reference(
        qa.data, qb.data, transb=True, **scales(qa, qb), bias=bias, gelu=gelu, beta=beta, old=old
    )

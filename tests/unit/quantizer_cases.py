"""Shared cases of the quantizer tests (CPU and GPU): one quantizer per format, input shapes,
and an independent reader of quantized tensors with a float64 error bound.

The reader decodes the stored bytes with torch's own float8 dtypes and expands the scales
with the pure-torch helpers of :mod:`tests.unit.fp8_reference`, so it shares no code with
:meth:`QuantizedTensor.dequantize` or the kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from overlap.quantization import (
    AmaxComputeAlgo,
    BlockScalingConfig,
    BlockScalingQuantizer,
    CurrentScalingConfig,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    HighPrecisionConfig,
    HighPrecisionQuantizer,
    HybridQuantizer,
    MXFP8Config,
    MXFP8Quantizer,
    QuantizedTensor,
    Quantizer,
    ScalingMode,
)
from tests.unit.fp8_reference import FP8_MAX, decode, e8m0_value, expand

# name -> (factory, needs whole MXFP8 blocks)
QUANTIZERS: dict[str, tuple[Callable[[], Quantizer], bool]] = {
    "delayed-e4m3": (lambda: DelayedScalingQuantizer(DelayedScalingConfig(history_len=4)), False),
    "delayed-e5m2-recent": (
        lambda: DelayedScalingQuantizer(
            DelayedScalingConfig(
                fp8="e5m2", margin=1, amax_compute_algo=AmaxComputeAlgo.MOST_RECENT
            )
        ),
        False,
    ),
    "current-e4m3": (CurrentScalingQuantizer, False),
    "current-e5m2-pow2": (
        lambda: CurrentScalingQuantizer(
            CurrentScalingConfig(fp8=torch.float8_e5m2, margin=2, power_of_2=True)
        ),
        False,
    ),
    "block1x128-e4m3": (BlockScalingQuantizer, False),
    "block128x128-e5m2": (
        lambda: BlockScalingQuantizer(
            BlockScalingConfig(fp8="e5m2", block=ScalingMode.BLOCK_128X128, power_of_2=True)
        ),
        False,
    ),
    "mxfp8-e4m3": (MXFP8Quantizer, True),
    "mxfp8-e5m2": (lambda: MXFP8Quantizer(MXFP8Config(fp8="e5m2")), True),
    "high-precision": (HighPrecisionQuantizer, False),
    "high-precision-bf16": (
        lambda: HighPrecisionQuantizer(HighPrecisionConfig(torch.bfloat16)),
        False,
    ),
    "hybrid-current-block": (
        lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
        False,
    ),
    "hybrid-delayed-block128": (
        lambda: HybridQuantizer(
            DelayedScalingQuantizer(DelayedScalingConfig(history_len=2)),
            BlockScalingQuantizer(BlockScalingConfig(block="block_128x128")),
        ),
        False,
    ),
    "hybrid-mxfp8-hp": (lambda: HybridQuantizer(MXFP8Quantizer(), HighPrecisionQuantizer()), True),
}

SHAPES = [(1, 1), (7, 129), (130, 257), (3, 5, 200), (300,)]
MX_SHAPES = [(32, 32), (64, 96), (2, 48, 64), (160, 32)]
IN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]

_MANTISSA = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}
_MIN_SUBNORMAL = {torch.float8_e4m3fn: 2.0**-9, torch.float8_e5m2: 2.0**-16}


def shape_id(s: tuple[int, ...]) -> str:
    return "x".join(map(str, s))


def cases() -> list[tuple[str, tuple[int, ...]]]:
    """Every (quantizer name, shape) pair the formats can hold."""
    out = []
    for name, (_, mx) in QUANTIZERS.items():
        out += [(name, s) for s in (MX_SHAPES if mx else SHAPES)]
    return out


def random_nd(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values with magnitudes varying by row and column (distinct block scales)."""
    g = torch.Generator().manual_seed(seed)
    m = 1
    for s in shape[:-1]:
        m *= s
    x = torch.randn(m, shape[-1], generator=g)
    x = x * torch.pow(2.0, torch.randint(-6, 7, (m, 1), generator=g).float())
    x = x * torch.pow(2.0, torch.randint(-3, 4, (1, shape[-1]), generator=g).float())
    return x.reshape(shape).to(dtype)


def quantize_primed(q: Quantizer, x: torch.Tensor, **kw: object) -> QuantizedTensor:
    """``q.quantize(x)``; delayed scaling is called once before, so that its history holds the
    amax of ``x`` (its first scale is 1, which may saturate)."""
    subs = [q, getattr(q, "rowwise_quantizer", None), getattr(q, "columnwise_quantizer", None)]
    if any(isinstance(s, DelayedScalingQuantizer) for s in subs):
        q.quantize(x, **kw)
    return q.quantize(x, **kw)


def element_scale_inv(t: QuantizedTensor, columnwise: bool) -> torch.Tensor | None:
    """float64 ``[M, K]``: the factor each element's FP8 value is multiplied by (None: high
    precision)."""
    fmt = t.format(columnwise)
    data = (t.columnwise_data if columnwise else t.rowwise_data).cpu()
    s = (t.columnwise_scale_inv if columnwise else t.rowwise_scale_inv).cpu()
    if fmt.mode is None:
        return None
    if fmt.mode is ScalingMode.TENSOR:
        full = torch.full(data.shape, s.item(), dtype=torch.float64)
    else:
        br, bc = fmt.mode.block_shape
        s = e8m0_value(s.view(torch.uint8)) if s.dtype != torch.float32 else s
        full = expand(s.double(), br, bc, data.shape)
    return full.t() if fmt.transposed(columnwise) else full


def read_reference(t: QuantizedTensor, columnwise: bool) -> torch.Tensor:
    """float64 ``[M, K]`` values of one direction, decoded without overlap's code."""
    fmt = t.format(columnwise)
    data = (t.columnwise_data if columnwise else t.rowwise_data).cpu()
    if fmt.mode is None:
        return data.double()
    values = decode(data.contiguous(), fmt.fp8.torch_dtype).double()
    values = values.t() if fmt.transposed(columnwise) else values
    return values * element_scale_inv(t, columnwise)


def assert_within_fp8_error(t: QuantizedTensor, x: torch.Tensor, columnwise: bool) -> None:
    """Every element of one direction of ``t`` is within the rounding error of its format of
    ``x`` (float64): half an FP8 ulp (relative), half the subnormal step of its scale, and the
    saturation excess above ``fp8_max * scale_inv``; high-precision data equal ``x`` cast."""
    fmt = t.format(columnwise)
    x2 = x.detach().cpu().double().reshape(-1, x.shape[-1])
    got = read_reference(t, columnwise)
    deq = t.dequantize(columnwise=columnwise, dtype=torch.float32).cpu().double()
    assert deq.shape == x.shape
    # dequantize() (the kernels) agrees with the independent reader (float32 products).
    assert torch.equal(deq.reshape(got.shape), got.float().double()), "dequantize != reader"
    if fmt.mode is None:
        hp = t.columnwise_data if columnwise else t.rowwise_data
        assert torch.equal(got, x2.to(hp.dtype).double())
        return
    f8 = fmt.fp8.torch_dtype
    s = element_scale_inv(t, columnwise)
    saturation = (x2.abs() - FP8_MAX[f8] * s).clamp(min=0)
    tol = x2.abs() * 2.0 ** -(_MANTISSA[f8] + 1) + s * _MIN_SUBNORMAL[f8] / 2 + saturation
    err = (got - x2).abs()
    bad = err > tol * (1 + 2.0**-16)
    assert not bad.any(), (
        f"{int(bad.sum())} elements beyond the FP8 error of {fmt}: first at "
        f"{bad.nonzero()[0].tolist()}, x={x2[bad][0].item()}, got={got[bad][0].item()}"
    )

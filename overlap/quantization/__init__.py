"""Quantizers and quantized tensors (per-tensor FP8, block FP8, MXFP8, hybrid).

Available now: the kernel-level ops of :mod:`overlap.quantization.ops` (CUDA kernels, and
host references that they match bit for bit): amax, per-tensor scale and casts, 1x128 and
128x128 block scaling, MXFP8, dequantization and the reduction of partial sums. Quantizers
and quantized tensors arrive with the quantization issue; see DESIGN.md §3-§4.
"""

from overlap.quantization.ops import (
    BlockScaledFP8,
    ScalingMode,
    amax,
    cast_to_fp8,
    cast_transpose,
    compute_scale,
    dequantize,
    quantize_block_1x128,
    quantize_block_128x128,
    quantize_mxfp8,
    reduce_partials,
)

__all__ = [
    "BlockScaledFP8",
    "ScalingMode",
    "amax",
    "cast_to_fp8",
    "cast_transpose",
    "compute_scale",
    "dequantize",
    "quantize_block_1x128",
    "quantize_block_128x128",
    "quantize_mxfp8",
    "reduce_partials",
]

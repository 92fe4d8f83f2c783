"""Quantizers and quantized tensors (per-tensor FP8, block FP8, MXFP8, hybrid).

* :mod:`~overlap.quantization.ops`: the kernel-level ops (CUDA kernels, and host references
  that they match bit for bit): amax, per-tensor scale and casts, 1x128 / 128x128 block
  scaling, MXFP8, dequantization and the reduction of partial sums.
* :mod:`~overlap.quantization.quantizers`: typed configs and the quantizers built on the ops
  (delayed / current per-tensor scaling, block scaling, MXFP8, hybrid, high precision).
* :mod:`~overlap.quantization.tensor`: :class:`QuantizedTensor`, rowwise / columnwise data
  with their own scale_inv and per-direction formats (:mod:`~overlap.quantization.formats`).
* :mod:`~overlap.quantization.amax_reduction`: the amax group given at the call.
* :mod:`~overlap.quantization.cached`: :class:`CachedWeight` (usages only added).

See docs/design.md §3-§4.
"""

from overlap.quantization.amax_reduction import (
    AmaxReducer,
    BootstrapAmaxReducer,
    CallableAmaxReducer,
    ProcessGroupAmaxReducer,
    as_amax_reducer,
)
from overlap.quantization.cached import CachedWeight, RecipeChangePolicy
from overlap.quantization.formats import DirectionFormat, Fp8Format, direction_format
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
    transpose_fp8,
)
from overlap.quantization.quantizers import (
    AmaxComputeAlgo,
    BlockScalingConfig,
    BlockScalingQuantizer,
    CurrentScalingConfig,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    HighPrecisionConfig,
    HighPrecisionQuantizer,
    HybridConfig,
    HybridQuantizer,
    MXFP8Config,
    MXFP8Quantizer,
    Quantizer,
    QuantizerConfig,
    SimpleQuantizerConfig,
    make_quantizer,
)
from overlap.quantization.tensor import QuantizedTensor, QuantizedTensorMeta

__all__ = [
    "AmaxComputeAlgo",
    "AmaxReducer",
    "BlockScaledFP8",
    "BlockScalingConfig",
    "BlockScalingQuantizer",
    "BootstrapAmaxReducer",
    "CachedWeight",
    "CallableAmaxReducer",
    "CurrentScalingConfig",
    "CurrentScalingQuantizer",
    "DelayedScalingConfig",
    "DelayedScalingQuantizer",
    "DirectionFormat",
    "Fp8Format",
    "HighPrecisionConfig",
    "HighPrecisionQuantizer",
    "HybridConfig",
    "HybridQuantizer",
    "MXFP8Config",
    "MXFP8Quantizer",
    "ProcessGroupAmaxReducer",
    "QuantizedTensor",
    "QuantizedTensorMeta",
    "Quantizer",
    "QuantizerConfig",
    "RecipeChangePolicy",
    "ScalingMode",
    "SimpleQuantizerConfig",
    "amax",
    "as_amax_reducer",
    "cast_to_fp8",
    "cast_transpose",
    "compute_scale",
    "dequantize",
    "direction_format",
    "make_quantizer",
    "quantize_block_1x128",
    "quantize_block_128x128",
    "quantize_mxfp8",
    "reduce_partials",
    "transpose_fp8",
]

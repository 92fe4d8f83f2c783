"""Quantizers and quantized tensors (per-tensor FP8, block FP8, MXFP8, hybrid).

Available now: :func:`amax`, the per-tensor absolute maximum that FP8 scaling starts from.
Quantizers and quantized tensors arrive with the quantization issue; see DESIGN.md §3-§4.
"""

from overlap.quantization.ops import amax

__all__ = ["amax"]

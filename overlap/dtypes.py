"""Numeric formats that the GEMM, the quantization and the overlap ops share.

A base module (docs/design.md §1.2): :mod:`overlap.gemm` and :mod:`overlap.quantization` both
read it, so that neither imports the other for a dtype fact or a scaling mode.

* :class:`ScalingMode`: how a quantized tensor's ``scale_inv`` maps onto its data;
* the dtypes data may travel and be multiplied in: :data:`HIGH_PRECISION_DTYPES` and
  :data:`FP8_DTYPES` (torch names without the ``torch.`` prefix), :func:`is_fp8` and
  :func:`is_high_precision` (torch dtypes or their names).
"""

from __future__ import annotations

import contextlib
import enum

__all__ = [
    "BLOCK_EDGE",
    "FP8_DTYPES",
    "HIGH_PRECISION_DTYPES",
    "MX_BLOCK",
    "ScalingMode",
    "dtype_name",
    "is_fp8",
    "is_high_precision",
]

BLOCK_EDGE = 128  #: block edge of the 1x128 / 128x128 formats
MX_BLOCK = 32  #: block length of MXFP8

HIGH_PRECISION_DTYPES = ("bfloat16", "float16", "float32")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


class ScalingMode(enum.Enum):
    """How a quantized tensor's ``scale_inv`` maps onto its data (see
    :func:`overlap.quantization.dequantize`)."""

    TENSOR = "tensor"  #: one float32 scale_inv for the whole tensor
    BLOCK_1X128 = "block_1x128"  #: float32 per 1x128 block, [rows, ceil(cols/128)]
    BLOCK_128X128 = "block_128x128"  #: float32 per 128x128 tile
    MXFP8_ROWWISE = "mxfp8_rowwise"  #: E8M0 byte per 1x32 block, [rows, cols/32]
    MXFP8_COLUMNWISE = "mxfp8_columnwise"  #: E8M0 byte per 32x1 block, [rows/32, cols]

    @property
    def block_shape(self) -> tuple[int, int] | None:
        """``(block_rows, block_cols)`` of the data, or None for per-tensor scaling."""
        return _BLOCK_SHAPES[self._value_]  # by value: an enum member hashes in Python


# ScalingMode's block shapes, by the mode's value (read on every quantized tensor's checks).
_BLOCK_SHAPES: dict[str, tuple[int, int] | None] = {
    ScalingMode.TENSOR.value: None,
    ScalingMode.BLOCK_1X128.value: (1, BLOCK_EDGE),
    ScalingMode.BLOCK_128X128.value: (BLOCK_EDGE, BLOCK_EDGE),
    ScalingMode.MXFP8_ROWWISE.value: (1, MX_BLOCK),
    ScalingMode.MXFP8_COLUMNWISE.value: (MX_BLOCK, 1),
}


def dtype_name(dtype: object) -> str:
    """A torch dtype (or its name, with or without ``torch.``) as its bare name:
    ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


# Answers of is_fp8 / is_high_precision by dtype object: both sit on every op's and layer's
# launch path, where formatting a dtype's name each time was a measurable share of the host
# time. Dtypes (and their names) are immutable and hashable, so an answer never goes stale;
# the size bound guards against a caller that makes new objects each time.
_FP8_ANSWERS: dict[object, bool] = {}
_HIGH_PRECISION_ANSWERS: dict[object, bool] = {}


def is_fp8(dtype: object) -> bool:
    """Whether ``dtype`` (a torch dtype or its name) is an FP8 dtype."""
    try:
        return _FP8_ANSWERS[dtype]
    except (KeyError, TypeError):
        answer = dtype_name(dtype) in FP8_DTYPES
        if len(_FP8_ANSWERS) < 256:
            with contextlib.suppress(TypeError):  # unhashable: answered, not remembered
                _FP8_ANSWERS[dtype] = answer
        return answer


def is_high_precision(dtype: object) -> bool:
    """Whether ``dtype`` (a torch dtype or its name) is bfloat16, float16 or float32."""
    try:
        return _HIGH_PRECISION_ANSWERS[dtype]
    except (KeyError, TypeError):
        answer = dtype_name(dtype) in HIGH_PRECISION_DTYPES
        if len(_HIGH_PRECISION_ANSWERS) < 256:
            with contextlib.suppress(TypeError):
                _HIGH_PRECISION_ANSWERS[dtype] = answer
        return answer

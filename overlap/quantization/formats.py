"""Formats of quantized data, one per direction (rowwise / columnwise).

A :class:`DirectionFormat` says how one direction of a quantized tensor is stored: its
:class:`~overlap.dtypes.ScalingMode` (or ``None`` for high-precision data that is
not quantized at all) and its FP8 encoding (:class:`Fp8Format`). Rowwise and columnwise may
use different formats (docs/design.md §3, invariant 5).

NOTE [layouts]: a tensor of logical shape ``[..., K]`` is quantized as the 2-D matrix
``[M, K]`` with ``M = prod(shape[:-1])``. Stored layouts, per direction (the conventions of
the kernels in :mod:`overlap.quantization.ops`):

* high precision (mode None): rowwise ``[M, K]``, columnwise ``[M, K]`` (one tensor may
  serve both); no scales;
* TENSOR: rowwise ``[M, K]``, columnwise ``[K, M]`` (the transpose); scale_inv ``[1]``;
* BLOCK_1X128: data as TENSOR; scale_inv ``[M, K/128]`` rowwise, ``[K, M/128]`` columnwise;
* BLOCK_128X128: data as TENSOR; scale_inv ``[M/128, K/128]`` rowwise, ``[K/128, M/128]``
  columnwise (the same tiles);
* MXFP8_ROWWISE / MXFP8_COLUMNWISE: data ``[M, K]`` in both directions (not transposed);
  scales ``[M, K/32]`` rowwise, ``[M/32, K]`` columnwise

(block counts round up; MXFP8 needs whole blocks). Block scales are float32 ``scale_inv``;
MXFP8 scales are uint8 E8M0 bytes. In every stored layout a block's extent along the logical
rows ``M`` is what a row range must align to (:meth:`DirectionFormat.row_alignment`).
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from overlap.dtypes import ScalingMode
from overlap.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DirectionFormat", "Fp8Format", "direction_format"]

_ROWWISE_MODES = (
    ScalingMode.TENSOR,
    ScalingMode.BLOCK_1X128,
    ScalingMode.BLOCK_128X128,
    ScalingMode.MXFP8_ROWWISE,
)
_COLUMNWISE_MODES = (
    ScalingMode.TENSOR,
    ScalingMode.BLOCK_1X128,
    ScalingMode.BLOCK_128X128,
    ScalingMode.MXFP8_COLUMNWISE,
)
# Columnwise data of these modes is stored transposed, [K, M] (the TN layout of Hopper GEMMs).
_TRANSPOSED_COLUMNWISE = (ScalingMode.TENSOR, ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_128X128)


class Fp8Format(enum.Enum):
    """An FP8 encoding: E4M3 (``torch.float8_e4m3fn``, max 448) or E5M2 (max 57344)."""

    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of this encoding."""
        import torch

        return torch.float8_e4m3fn if self is Fp8Format.E4M3 else torch.float8_e5m2

    @property
    def max(self) -> float:
        """Largest finite magnitude."""
        return 448.0 if self is Fp8Format.E4M3 else 57344.0

    @classmethod
    def of(cls, value: Fp8Format | str | Any) -> Fp8Format:
        """``value`` as an :class:`Fp8Format`: the enum itself, its name or value ("e4m3",
        "E5M2"), or ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``.

        Raises:
            ConfigError: anything else, with the accepted values.
        """
        if isinstance(value, Fp8Format):
            return value
        if isinstance(value, str):
            for f in Fp8Format:
                if value.lower() in (f.value, f.name.lower()):
                    return f
        else:
            try:
                import torch

                by_dtype = {torch.float8_e4m3fn: cls.E4M3, torch.float8_e5m2: cls.E5M2}
                if value in by_dtype:
                    return by_dtype[value]
            except (ImportError, TypeError):
                pass
        raise ConfigError(
            f"unknown FP8 format {value!r}; use Fp8Format.E4M3 / Fp8Format.E5M2, 'e4m3' / "
            "'e5m2', or torch.float8_e4m3fn / torch.float8_e5m2"
        )


@dataclass(frozen=True)
class DirectionFormat:
    """How one direction (rowwise or columnwise) of a quantized tensor is stored.

    Attributes:
        mode: the scaling of the data, or ``None`` for high-precision (unquantized) data.
        fp8: the FP8 encoding; ``None`` exactly when ``mode`` is ``None``. Strings and torch
            FP8 dtypes are accepted and converted (see :meth:`Fp8Format.of`).
    """

    mode: ScalingMode | None = None
    fp8: Fp8Format | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and not isinstance(self.mode, ScalingMode):
            raise ConfigError(
                f"DirectionFormat.mode must be a ScalingMode or None, got {self.mode!r}"
            )
        if self.fp8 is not None:
            object.__setattr__(self, "fp8", Fp8Format.of(self.fp8))
        if (self.mode is None) != (self.fp8 is None):
            raise ConfigError(
                "DirectionFormat: mode and fp8 are both set (quantized data) or both None "
                f"(high-precision data), got mode={self.mode}, fp8={self.fp8}"
            )

    @property
    def quantized(self) -> bool:
        """False for high-precision (passthrough) data."""
        return self.mode is not None

    def check_direction(self, columnwise: bool) -> None:
        """Raise ConfigError unless this format can be used for the given direction."""
        allowed = _COLUMNWISE_MODES if columnwise else _ROWWISE_MODES
        if self.mode is not None and self.mode not in allowed:
            which = "columnwise" if columnwise else "rowwise"
            raise ConfigError(
                f"{self.mode} cannot be the {which} format; {which} formats are "
                f"{[m.name for m in allowed]} or None (high precision)"
            )

    def transposed(self, columnwise: bool) -> bool:
        """True if this direction's data is stored as the transpose ``[K, M]``."""
        return columnwise and self.mode in _TRANSPOSED_COLUMNWISE

    def data_shape(self, columnwise: bool, rows: int, cols: int) -> tuple[int, int]:
        """Shape of the stored data for a logical ``[rows, cols]`` matrix."""
        return (cols, rows) if self.transposed(columnwise) else (rows, cols)

    def scale_shape(self, columnwise: bool, rows: int, cols: int) -> tuple[int, ...] | None:
        """Shape of the stored scale_inv (None: high precision, no scales)."""
        if self.mode is None:
            return None
        block = self.mode.block_shape
        if block is None:
            return (1,)
        d0, d1 = self.data_shape(columnwise, rows, cols)
        return (-(-d0 // block[0]), -(-d1 // block[1]))

    def row_alignment(self, columnwise: bool) -> int:
        """Extent of one scale block along the logical rows ``M`` (1 if the scales do not
        depend on the row: per-tensor or high precision). A row range ``[start, stop)`` of
        this direction must have ``start`` (and ``stop``, unless it is the end) a multiple of
        it, so that no scale block is cut."""
        if self.mode is None or self.mode.block_shape is None:
            return 1
        return self.mode.block_shape[1 if self.transposed(columnwise) else 0]

    def __str__(self) -> str:
        if self.mode is None:
            return "high-precision"
        return f"{self.mode.name}/{self.fp8.name if self.fp8 else '?'}"


def direction_format(mode: ScalingMode | None = None, fp8: Any = None) -> DirectionFormat:
    """The :class:`DirectionFormat` of ``mode`` and ``fp8`` (any form :meth:`Fp8Format.of`
    takes), one shared object per value. Formats are frozen, so sharing is safe. It spares a
    validated construction per quantize call, and keys that hold formats (NOTE [op plans])
    compare them by identity first.

    Raises:
        ConfigError: as :class:`DirectionFormat`.
    """
    return _shared_format(mode, None if fp8 is None else Fp8Format.of(fp8))


@functools.cache
def _shared_format(mode: ScalingMode | None, fp8: Fp8Format | None) -> DirectionFormat:
    return DirectionFormat(mode, fp8)

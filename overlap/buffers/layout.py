"""Byte layout of a gathered (quantized) tensor inside a symmetric buffer.

A gather moves up to four PARTS of every rank's shard: rowwise data, rowwise scale_inv,
columnwise data, columnwise scale_inv (a plain tensor is a single data part). Each part gets
its own REGION of the buffer, 256-byte aligned, holding ``tp_size`` SLOTS back to back: rank
``k``'s part lives at ``region.offset + k * slot_nbytes`` on every rank after the gather (the
placement of :meth:`~overlap.comm.SymmetricBuffer.all_gather_into`)::

    offset 0           256-aligned        256-aligned        256-aligned
    | rowwise data     | rowwise scales   | columnwise data  | columnwise scales |
    | s0 | s1 | ... |  | s0 | s1 | ... |  | s0 | s1 | ... |  | s0 | s1 | ... |

NOTE [which directions travel] (docs/design.md §3, invariant 5): a direction whose data can be made
exactly from the gathered other direction is not gathered: per-tensor FP8 (both directions
TENSOR of one encoding) gathers rowwise data and its scale_inv and transposes after the
gather; high precision gathers one ``[M, K]`` tensor that serves both directions. Every other
format (1x128 and 128x128 blocks, MXFP8, hybrids) gathers each needed direction with its own
scales. 128x128 tiles could be transposed exactly too, but the design gathers block formats
in both directions, which keeps the columnwise scales those the quantizer produced.

NOTE [one scale slot]: a per-tensor scale_inv (one float32) takes a slot of the size the
runtime's overlap ops use (``SCALE_SLOT_BYTES`` of the native module, NOTE [ag_gemm layout] in
``csrc/comm/overlap/overlap_ops.h``), its value in the slot's first 4 bytes. So a
per-tensor FP8 gather of a manager and an AG+GEMM's buffer lay the same tensor out byte for
byte (data region at 0, scale slots at the next 256-byte boundary), and one model reads
either. Verdict: the runtime owns the number; this layout asks for it.

NOTE [slot contiguity]: slots are concatenated along the first stored dimension. For data
stored ``[M, K]`` (rowwise, MXFP8, high precision) the region IS the gathered tensor; data
stored transposed ``[K, M]`` (columnwise TENSOR / BLOCK_*) gathers as ``tp_size`` contiguous
``[K, m]`` slots that a copy assembles into ``[K, tp_size * m]``. Block scales follow their
data; a shard boundary must not cut a scale block (:func:`check_gatherable`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlap.dtypes import ScalingMode
from overlap.errors import InvalidArgumentError
from overlap.quantization.formats import DirectionFormat

if TYPE_CHECKING:
    import torch

__all__ = [
    "FormatPair",
    "GatherLayout",
    "PartKind",
    "PartLayout",
    "alignment",
    "check_gatherable",
    "derived_after_gather",
    "gather_layout",
    "gathered_directions",
    "scale_slot_bytes",
]


def alignment() -> int:
    """Byte alignment of every region (and of the buffer's start): the runtime's slot
    alignment (``SLOT_ALIGNMENT`` of the native module, ``kSlotAlignment`` in
    ``csrc/comm/overlap/overlap_ops.h``), so that a manager's layout and an overlap op's agree
    (NOTE [one scale slot]). Also importable as ``ALIGNMENT``, read on first use."""
    from overlap._native import native

    return int(native().comm_ops.SLOT_ALIGNMENT)


def __getattr__(name: str) -> int:
    # ALIGNMENT: the native module's, loaded lazily (the extension may not be built when
    # this module is imported).
    if name == "ALIGNMENT":
        return alignment()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FormatPair = tuple[DirectionFormat, DirectionFormat]


class PartKind(enum.Enum):
    """One part of a shard that travels in a gather."""

    DATA = "data"  #: a plain (not quantized) tensor
    ROWWISE_DATA = "rowwise_data"
    ROWWISE_SCALE_INV = "rowwise_scale_inv"
    COLUMNWISE_DATA = "columnwise_data"
    COLUMNWISE_SCALE_INV = "columnwise_scale_inv"

    @property
    def columnwise(self) -> bool:
        return self in (PartKind.COLUMNWISE_DATA, PartKind.COLUMNWISE_SCALE_INV)

    @property
    def is_scale(self) -> bool:
        return self in (PartKind.ROWWISE_SCALE_INV, PartKind.COLUMNWISE_SCALE_INV)


_DATA_KIND = (PartKind.ROWWISE_DATA, PartKind.COLUMNWISE_DATA)
_SCALE_KIND = (PartKind.ROWWISE_SCALE_INV, PartKind.COLUMNWISE_SCALE_INV)


@dataclass(frozen=True)
class PartLayout:
    """Where one part of every rank's shard lives in the buffer.

    Attributes:
        kind: which part.
        dtype: element type of the stored part (FP8 dtype, float32 / uint8 scales, or the
            high-precision / plain dtype).
        slot_shape: shape of one rank's part.
        offset: byte offset of the region (a multiple of :func:`alignment`).
        slot_nbytes: bytes of one slot; slot ``k`` starts at ``offset + k * slot_nbytes``.
        tp_size: number of slots.
    """

    kind: PartKind
    dtype: torch.dtype
    slot_shape: tuple[int, ...]
    offset: int
    slot_nbytes: int
    tp_size: int

    def slot_offset(self, k: int) -> int:
        """Byte offset of rank ``k``'s slot."""
        return self.offset + k * self.slot_nbytes

    @property
    def end(self) -> int:
        """First byte after the region."""
        return self.offset + self.tp_size * self.slot_nbytes

    @property
    def padded(self) -> bool:
        """Whether a slot holds more bytes than its part (a per-tensor scale's slot, NOTE
        [one scale slot]): the slots are then not one contiguous tensor."""
        return self.slot_nbytes > math.prod(self.slot_shape) * self.dtype.itemsize


@dataclass(frozen=True)
class GatherLayout:
    """The layout of one gather: the parts of a shard of ``shape`` in a group of ``tp_size``.

    Attributes:
        shape: logical shape of one rank's shard ``[s0, ..., K]``; the gathered tensor has
            shape ``[tp_size * s0, ..., K]``.
        tp_size: ranks of the group.
        formats: ``(rowwise, columnwise)`` formats, or None for a plain tensor.
        directions: ``(rowwise, columnwise)``: the directions that travel (see
            :func:`gathered_directions`); ``(True, False)`` for a plain tensor.
        parts: the regions, in increasing offset.
        nbytes: bytes of the buffer the gather needs (end of the last region).
    """

    shape: tuple[int, ...]
    tp_size: int
    formats: FormatPair | None
    directions: tuple[bool, bool]
    parts: tuple[PartLayout, ...]
    nbytes: int

    @property
    def gathered_shape(self) -> tuple[int, ...]:
        return (self.tp_size * self.shape[0], *self.shape[1:])

    @property
    def matrix(self) -> tuple[int, int]:
        """``(m, K)`` of one shard as the 2-D matrix ``[prod(shape[:-1]), K]``."""
        return math.prod(self.shape[:-1]), self.shape[-1]

    def part(self, kind: PartKind) -> PartLayout | None:
        """The layout of ``kind``, or None when that part does not travel."""
        return next((p for p in self.parts if p.kind is kind), None)


def gathered_directions(formats: FormatPair, rowwise: bool, columnwise: bool) -> tuple[bool, bool]:
    """The directions that must travel so that the gathered tensor can have the requested
    usages (NOTE [which directions travel]).

    Raises:
        InvalidArgumentError: neither usage requested.
    """
    if not (rowwise or columnwise):
        raise InvalidArgumentError("a gather needs rowwise or columnwise usage (or both)")
    if columnwise and derived_after_gather(formats):
        return True, False
    return rowwise, columnwise


def derived_after_gather(formats: FormatPair) -> bool:
    """True when the columnwise direction is made from the gathered rowwise data (one format
    for both directions, per-tensor FP8 or high precision)."""
    row, col = formats
    return row == col and row.mode in (None, ScalingMode.TENSOR)


def check_gatherable(
    formats: FormatPair, directions: tuple[bool, bool], m: int, k: int, tp_size: int
) -> None:
    """Raise unless shards of ``[m, k]`` can be gathered exactly in these formats.

    A shard boundary (a multiple of ``m`` rows) must not cut a scale block: ``m`` must be a
    multiple of each travelling direction's :meth:`DirectionFormat.row_alignment` (128 for
    128x128 tiles and columnwise 1x128 blocks, 32 for columnwise MXFP8) unless there is a
    single rank; MXFP8 rowwise blocks need ``k % 32 == 0``, columnwise ``m % 32 == 0``.

    Raises:
        InvalidArgumentError: naming the format, the direction and the sizes.
    """
    for col, wanted in enumerate(directions):
        if not wanted:
            continue
        fmt = formats[col]
        which = "columnwise" if col else "rowwise"
        b = fmt.row_alignment(bool(col))
        if fmt.mode is ScalingMode.MXFP8_ROWWISE and k % 32:
            raise InvalidArgumentError(
                f"{which} {fmt} needs whole 1x32 blocks: the last dim ({k}) must be a multiple "
                "of 32"
            )
        if fmt.mode is ScalingMode.MXFP8_COLUMNWISE and m % 32:
            raise InvalidArgumentError(
                f"{which} {fmt} needs whole 32x1 blocks: each shard's {m} rows must be a "
                "multiple of 32"
            )
        if tp_size > 1 and m % b:
            raise InvalidArgumentError(
                f"cannot gather {which} {fmt} shards of {m} rows: a shard boundary would cut a "
                f"scale block of {b} rows; use shards whose rows (prod of all dims but the "
                f"last) are a multiple of {b}"
            )


_TENSOR = ScalingMode.TENSOR


def scale_slot_bytes() -> int:
    """Bytes of one rank's per-tensor scale_inv slot (NOTE [one scale slot])."""
    from overlap._native import native

    return int(native().comm_ops.SCALE_SLOT_BYTES)


def _align(n: int) -> int:
    a = alignment()
    return -(-n // a) * a


def _scale_dtype(fmt: DirectionFormat) -> torch.dtype:
    import torch

    mx = fmt.mode in (ScalingMode.MXFP8_ROWWISE, ScalingMode.MXFP8_COLUMNWISE)
    return torch.uint8 if mx else torch.float32


def gather_layout(
    shape: Sequence[int],
    tp_size: int,
    *,
    formats: FormatPair | None,
    dtype: torch.dtype,
    directions: tuple[bool, bool] = (True, False),
    validate: bool = True,
) -> GatherLayout:
    """The layout of a gather of shards of ``shape``.

    Args:
        shape: one rank's logical shard shape (at least 1-D, no empty dimension).
        tp_size: ranks in the group (>= 1).
        formats: ``(rowwise, columnwise)`` formats of a quantized tensor, or None for a plain
            tensor.
        dtype: the plain tensor's dtype, or the storage dtype of high-precision data (unused
            for FP8 directions).
        directions: the travelling directions (from :func:`gathered_directions`); ignored for
            a plain tensor.
        validate: check that the formats can gather such shards (False: only size a buffer
            for up to this shape).

    Raises:
        InvalidArgumentError: an empty or negative shape, or a shape the formats cannot
            gather (:func:`check_gatherable`).
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1 or any(s <= 0 for s in shape):
        raise InvalidArgumentError(
            f"a gathered shard needs at least 1 dim and no empty dim, got shape {list(shape)}"
        )
    if tp_size < 1:
        raise InvalidArgumentError(f"tp_size must be >= 1, got {tp_size}")
    m, k = math.prod(shape[:-1]), shape[-1]
    specs: list[tuple[PartKind, torch.dtype, tuple[int, ...]]] = []
    if formats is None:
        directions = (True, False)
        specs.append((PartKind.DATA, dtype, shape))
    else:
        if validate:
            check_gatherable(formats, directions, m, k, tp_size)
        for col in (False, True):
            if not directions[col]:
                continue
            fmt = formats[col]
            data_dtype = fmt.fp8.torch_dtype if fmt.fp8 is not None else dtype
            specs.append((_DATA_KIND[col], data_dtype, fmt.data_shape(col, m, k)))
            scale_shape = fmt.scale_shape(col, m, k)
            if scale_shape is not None:
                specs.append((_SCALE_KIND[col], _scale_dtype(fmt), scale_shape))
    parts = []
    offset = 0
    for kind, part_dtype, slot_shape in specs:
        slot_nbytes = math.prod(slot_shape) * part_dtype.itemsize
        if kind.is_scale and formats is not None and formats[kind.columnwise].mode is _TENSOR:
            slot_nbytes = scale_slot_bytes()  # NOTE [one scale slot]
        parts.append(PartLayout(kind, part_dtype, slot_shape, offset, slot_nbytes, tp_size))
        offset = _align(offset + tp_size * slot_nbytes)
    nbytes = parts[-1].end
    return GatherLayout(shape, tp_size, formats, directions, tuple(parts), nbytes)

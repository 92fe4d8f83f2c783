"""Quantized tensors: rowwise and/or columnwise data with their scale_inv, plus the format.

NOTE [plain storage object]: :class:`QuantizedTensor` is a plain Python object holding torch
tensors, not a ``torch.Tensor`` subclass. Layers hand it to overlap's ops explicitly, so no
``__torch_dispatch__`` is needed, and a plain object is trivially picklable, deep-copyable and
inspectable. Autograd saves it cheaply through :meth:`QuantizedTensor.tensors` /
:attr:`QuantizedTensor.meta` and rebuilds it with :meth:`QuantizedTensor.from_tensors`::

    ctx.save_for_backward(*qx.tensors())
    ctx.qx_meta = qx.meta
    ...
    qx = QuantizedTensor.from_tensors(ctx.saved_tensors, ctx.qx_meta)

NOTE [self-describing]: a quantized tensor stores everything needed to read it: the format of
each direction, the data and its own scale_inv. :meth:`QuantizedTensor.dequantize` never
consults a quantizer (a quantizer may have been called again since, docs/design.md §3, invariant 1).

The stored layouts are those of :mod:`overlap.quantization.formats` (NOTE [layouts]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlap.errors import ConfigError, InvalidArgumentError, StateError
from overlap.quantization import ops
from overlap.quantization.formats import DirectionFormat

if TYPE_CHECKING:
    import torch

__all__ = ["QuantizedTensor", "QuantizedTensorMeta"]

_DIRECTIONS = ("rowwise", "columnwise")


def _name(columnwise: bool) -> str:
    return _DIRECTIONS[columnwise]


def _matrix_dims(shape: Sequence[int]) -> tuple[int, int]:
    """``(M, K)`` of the 2-D view ``[prod(shape[:-1]), shape[-1]]``."""
    return math.prod(shape[:-1]), shape[-1]


@dataclass(frozen=True)
class QuantizedTensorMeta:
    """Everything of a :class:`QuantizedTensor` that is not a tensor (hashable, picklable).

    Attributes:
        shape: logical (high-precision) shape.
        dtype: high-precision dtype, the default of :meth:`QuantizedTensor.dequantize`.
        rowwise_format: format of the rowwise direction (even when it holds no data).
        columnwise_format: format of the columnwise direction.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    rowwise_format: DirectionFormat
    columnwise_format: DirectionFormat


class _Fp8Bytes:
    """An FP8 tensor in a pickle: its bytes as uint8 and the name of its dtype."""

    def __init__(self, data: torch.Tensor, dtype: str) -> None:
        self.data, self.dtype = data, dtype

    def restore(self) -> torch.Tensor:
        import torch

        return self.data.view(getattr(torch, self.dtype.removeprefix("torch.")))


class QuantizedTensor:
    """A tensor quantized in one or two directions.

    Rowwise data feeds ``Y = X Wᵀ`` (both operands rowwise); columnwise data feeds dgrad and
    wgrad (docs/design.md §4). Each direction has its own :class:`DirectionFormat` and its own
    scale_inv tensor (for per-tensor formats, both directions may share one scale_inv tensor).

    Args:
        shape: logical shape ``[..., K]`` (at least 1-D); quantized as ``[M, K]`` with
            ``M = prod(shape[:-1])``.
        dtype: the high-precision dtype (float32, bfloat16 or float16).
        rowwise_format: format of the rowwise direction.
        columnwise_format: format of the columnwise direction.
        rowwise_data: ``[M, K]`` FP8 data (or uint8 FP8 bytes; high-precision data for a
            high-precision format), or None when the tensor has no rowwise usage.
        rowwise_scale_inv: float32 ``[1]`` (TENSOR), float32 per block (BLOCK_*), uint8 E8M0
            per block (MXFP8); None for high precision.
        columnwise_data: ``[K, M]`` for TENSOR / BLOCK_* (the transpose), ``[M, K]`` for MXFP8
            and high precision, or None.
        columnwise_scale_inv: as for rowwise, in the columnwise layout.

    Raises:
        InvalidArgumentError: a shape, dtype or device does not fit the formats (the message
            names the field and the expected value).
    """

    def __init__(
        self,
        *,
        shape: Sequence[int],
        dtype: torch.dtype,
        rowwise_format: DirectionFormat,
        columnwise_format: DirectionFormat,
        rowwise_data: torch.Tensor | None = None,
        rowwise_scale_inv: torch.Tensor | None = None,
        columnwise_data: torch.Tensor | None = None,
        columnwise_scale_inv: torch.Tensor | None = None,
    ) -> None:
        formats = (rowwise_format, columnwise_format)
        data, scale_inv = [rowwise_data, columnwise_data], [rowwise_scale_inv, columnwise_scale_inv]
        self._set_fields(tuple(int(s) for s in shape), dtype, formats, data, scale_inv)
        self._validate()

    def _set_fields(self, shape: tuple[int, ...], dtype: torch.dtype,
                    formats: tuple[DirectionFormat, DirectionFormat],
                    data: list[torch.Tensor | None],
                    scale_inv: list[torch.Tensor | None]) -> None:  # fmt: skip
        """Every field, unchecked: the one list of them (``__init__`` and :meth:`_made`)."""
        self._shape, self._dtype, self._formats = shape, dtype, formats
        self._data, self._scale_inv, self._cached = data, scale_inv, False

    # ---- accessors ------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (high-precision) shape."""
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        """High-precision dtype (what :meth:`dequantize` returns by default)."""
        return self._dtype

    @property
    def rowwise_format(self) -> DirectionFormat:
        return self._formats[0]

    @property
    def columnwise_format(self) -> DirectionFormat:
        return self._formats[1]

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        """``(rowwise_format, columnwise_format)``."""
        return self._formats

    @property
    def rowwise_data(self) -> torch.Tensor | None:
        return self._data[0]

    @property
    def rowwise_scale_inv(self) -> torch.Tensor | None:
        return self._scale_inv[0]

    @property
    def columnwise_data(self) -> torch.Tensor | None:
        return self._data[1]

    @property
    def columnwise_scale_inv(self) -> torch.Tensor | None:
        return self._scale_inv[1]

    @property
    def has_rowwise(self) -> bool:
        return self._data[0] is not None

    @property
    def has_columnwise(self) -> bool:
        return self._data[1] is not None

    @property
    def cached(self) -> bool:
        """True for the tensor of a :class:`~overlap.quantization.CachedWeight`: its usages
        can only be added (docs/design.md §3, invariant 4)."""
        return self._cached

    @property
    def device(self) -> torch.device:
        return next(t for t in self._data if t is not None).device

    @property
    def meta(self) -> QuantizedTensorMeta:
        """The non-tensor part, for :meth:`from_tensors`."""
        return QuantizedTensorMeta(self._shape, self._dtype, *self._formats)

    @property
    def nbytes(self) -> int:
        """Bytes of all data and scales held (a tensor shared by both directions counts once;
        a view counts the elements it spans)."""
        return sum(t.numel() * t.element_size() for t in self._distinct_tensors())

    def format(self, columnwise: bool) -> DirectionFormat:
        """Format of the rowwise (False) or columnwise (True) direction."""
        return self._formats[columnwise]

    # ---- saving and moving ----------------------------------------------------------------

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """``(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)``, the
        directions not held as None (``ctx.save_for_backward`` accepts None)."""
        return (self._data[0], self._scale_inv[0], self._data[1], self._scale_inv[1])

    @classmethod
    def from_tensors(
        cls, tensors: Sequence[torch.Tensor | None], meta: QuantizedTensorMeta
    ) -> QuantizedTensor:
        """Rebuild a tensor from :meth:`tensors` and :attr:`meta` (no copy)."""
        if len(tensors) != 4:
            raise InvalidArgumentError(
                f"from_tensors expects the 4 tensors of QuantizedTensor.tensors(), got "
                f"{len(tensors)}"
            )
        rd, rs, cd, cs = tensors
        return cls(
            shape=meta.shape,
            dtype=meta.dtype,
            rowwise_format=meta.rowwise_format,
            columnwise_format=meta.columnwise_format,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
        )

    @classmethod
    def _made(
        cls,
        tensors: Sequence[torch.Tensor | None],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        formats: tuple[DirectionFormat, DirectionFormat],
    ) -> QuantizedTensor:
        """:meth:`from_tensors` without :meth:`_validate`, for a quantizer's own output.
        NOTE [quantizer outputs]: a quantizer allocates its outputs from its formats' own
        ``data_shape`` / ``scale_shape`` on its input's device: valid by construction.
        Validating anyway (and a new format object per call) cost 4-12 us of a 60-72 us
        quantize of a tiny CPU tensor on 2 cores, 12 times per FP8 TransformerLayer step.
        What users build is still validated; tests/unit/test_quantizers.py validates every
        quantizer's output. Verdict: validate at the boundary, not our own construction.
        """
        t = cls.__new__(cls)
        t._set_fields(shape, dtype, formats, [tensors[0], tensors[2]], [tensors[1], tensors[3]])
        return t

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> QuantizedTensor:
        """This tensor on ``device`` (``self`` when already there); tensors shared between the
        directions stay shared."""
        import torch

        device = torch.device(device)
        if all(t.device == device for t in self._distinct_tensors()):
            return self
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def clone(self) -> QuantizedTensor:
        """A copy that owns its memory (e.g. to save a tensor that lives in a communication
        buffer, docs/design.md §3, invariant 2). Sharing between directions is kept; not cached."""
        import torch

        return self._map(lambda t: t.clone(memory_format=torch.contiguous_format))

    def __getstate__(self) -> dict[str, object]:
        """Pickle state. FP8 tensors travel as uint8 views of their bytes (plain ``pickle``
        of float8 storages fails in some torch versions); sharing between fields is kept."""
        import torch

        fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        done: dict[int, object] = {}

        def enc(t: torch.Tensor | None) -> object:
            if t is None or t.dtype not in fp8:
                return t
            return done.setdefault(id(t), _Fp8Bytes(t.view(torch.uint8), str(t.dtype)))

        state = dict(self.__dict__)
        state["_data"] = [enc(t) for t in self._data]
        state["_scale_inv"] = [enc(t) for t in self._scale_inv]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        done: dict[int, torch.Tensor] = {}

        def dec(t: object) -> object:
            if isinstance(t, _Fp8Bytes):
                return done.setdefault(id(t), t.restore())
            return t

        for key in ("_data", "_scale_inv"):
            state[key] = [dec(t) for t in state[key]]  # type: ignore[attr-defined]
        self.__dict__.update(state)

    # ---- reading --------------------------------------------------------------------------

    def dequantize(
        self, *, dtype: torch.dtype | None = None, columnwise: bool | None = None
    ) -> torch.Tensor:
        """The high-precision values, computed only from what this tensor stores.

        Args:
            dtype: float32, bfloat16 or float16 (default: :attr:`dtype`).
            columnwise: read the columnwise direction (True) or the rowwise one (False);
                default: rowwise when held, else columnwise.

        Returns:
            A new contiguous tensor of :attr:`shape` and ``dtype`` on :attr:`device`.
        """
        if columnwise is None:
            columnwise = not self.has_rowwise
        data, scale_inv = self._data[columnwise], self._scale_inv[columnwise]
        if data is None:
            raise InvalidArgumentError(
                f"dequantize(columnwise={columnwise}): this tensor holds no "
                f"{_name(columnwise)} data (usages: {self._usage_str()})"
            )
        fmt = self._formats[columnwise]
        dtype = dtype or self._dtype
        if data.numel() == 0:
            import torch

            return torch.empty(self._shape, dtype=dtype, device=data.device)
        if fmt.mode is None:
            out = data.to(dtype)
        else:
            assert scale_inv is not None and fmt.fp8 is not None
            out = ops.dequantize(
                data.contiguous(),
                scale_inv.contiguous(),
                mode=fmt.mode,
                fp8_dtype=fmt.fp8.torch_dtype,
                out_dtype=dtype,
            )
        if fmt.transposed(columnwise):
            out = out.t()
        return out.reshape(self._shape).contiguous()

    # ---- usages ---------------------------------------------------------------------------

    def update_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Add or drop directions in place (None leaves a direction as it is).

        A missing direction is created from the other one only where that is exact: per-tensor
        FP8 and 128x128 blocks by transposing the data (and scales), high precision by sharing
        the tensor. 1x128 blocks, MXFP8 and mixed (hybrid) formats scale the two directions
        over different blocks, so the other direction cannot be derived: quantize the
        high-precision source again with the needed usage.

        Raises:
            StateError: dropping a direction of a cached weight (usages of cached weights are
                only added, docs/design.md §3, invariant 4).
            InvalidArgumentError: both directions would be dropped, or a direction cannot be
                created from the other.
        """
        want = [
            self.has_rowwise if rowwise is None else bool(rowwise),
            self.has_columnwise if columnwise is None else bool(columnwise),
        ]
        if not any(want):
            raise InvalidArgumentError(
                "update_usage would drop both rowwise and columnwise data; a quantized tensor "
                "keeps at least one direction"
            )
        for col in (False, True):
            if self._data[col] is not None and not want[col] and self._cached:
                raise StateError(
                    f"cannot drop the {_name(col)} usage of a cached quantized weight: usages "
                    "of cached weights are only ever added, since a later step (e.g. training "
                    "after evaluation) may need them again (docs/design.md §3, invariant 4)"
                )
        made: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [None, None]
        for col in (False, True):
            if want[col] and self._data[col] is None:
                made[col] = self._derive(columnwise=col)
                if made[col] is None:
                    src = self._formats[not col]
                    raise InvalidArgumentError(
                        f"cannot create {_name(col)} data ({self._formats[col]}) from "
                        f"{_name(not col)} data ({src}): only per-tensor FP8 and 128x128 "
                        "blocks of one format can be transposed exactly; other formats (1x128 "
                        "blocks, MXFP8, hybrids) need the high-precision source: quantize it "
                        f"again with {_name(col)} usage"
                    )
        for col in (False, True):
            if made[col] is not None:
                self._data[col], self._scale_inv[col] = made[col]
        for col in (False, True):
            if not want[col]:
                self._data[col] = self._scale_inv[col] = None

    def can_derive(self, *, columnwise: bool) -> bool:
        """True if the given direction is held or :meth:`update_usage` can make it from the
        other direction without the high-precision source."""
        return self._data[columnwise] is not None or self._derive(columnwise=columnwise) is not None

    def _derive(self, *, columnwise: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Data and scale_inv of direction ``columnwise`` made exactly from the other
        direction, or None where that is impossible."""
        src, dst = self._formats[not columnwise], self._formats[columnwise]
        data, scale_inv = self._data[not columnwise], self._scale_inv[not columnwise]
        if data is None or src != dst:
            return None
        if src.mode is None:
            return data, None  # high precision: both directions read the same [M, K] tensor
        if src.mode not in (ops.ScalingMode.TENSOR, ops.ScalingMode.BLOCK_128X128):
            return None
        assert scale_inv is not None
        # Transposing [M, K] <-> [K, M] is exact; per-tensor scale_inv is shared, 128x128
        # tiles are the same tiles seen transposed.
        s = scale_inv if src.mode is ops.ScalingMode.TENSOR else scale_inv.t().contiguous()
        return data.t().contiguous(), s

    def _usage_str(self) -> str:
        held = [_name(c) for c in (False, True) if self._data[c] is not None]
        return "+".join(held)

    # ---- views ----------------------------------------------------------------------------

    def rows(self, start: int, stop: int) -> QuantizedTensor:
        """A view of rows ``[start, stop)`` of the first logical dimension (a chunk of a
        sequence-parallel shard for a pipelined overlap op). No data is copied.

        Per-tensor formats share the scale_inv tensor with ``self``; block formats view the
        scale rows of the range, so the range must not cut a scale block: its bounds (in rows
        of the 2-D ``[M, K]`` matrix) must be multiples of 128 for 128x128 blocks and for
        columnwise 1x128 blocks, of 32 for columnwise MXFP8, of 1 otherwise (the end of the
        tensor is always a valid ``stop``). Columnwise data stored transposed ``[K, M]`` gives
        a strided (non-contiguous) view ``[K, stop - start]``.

        Raises:
            InvalidArgumentError: the range is empty, out of bounds or cuts a scale block.
        """
        if len(self._shape) < 2:
            raise InvalidArgumentError(
                f"rows() needs a tensor of at least 2 dims, got shape {list(self._shape)}"
            )
        n = self._shape[0]
        if not 0 <= start < stop <= n:
            raise InvalidArgumentError(
                f"rows({start}, {stop}): need 0 <= start < stop <= {n} (first dim of shape "
                f"{list(self._shape)})"
            )
        m, _ = _matrix_dims(self._shape)
        inner = m // n
        r0, r1 = start * inner, stop * inner
        views: dict[int, torch.Tensor] = {}  # keeps tensors shared by the directions shared
        data: list[torch.Tensor | None] = [None, None]
        scales: list[torch.Tensor | None] = [None, None]
        for col in (False, True):
            d, s, fmt = self._data[col], self._scale_inv[col], self._formats[col]
            if d is None:
                continue
            b = fmt.row_alignment(col)
            if r0 % b or (r1 % b and r1 != m):
                raise InvalidArgumentError(
                    f"rows({start}, {stop}) spans matrix rows [{r0}, {r1}) of {m}, which cuts "
                    f"a scale block of the {_name(col)} {fmt} data: its row bounds must be "
                    f"multiples of {b} (or the end)"
                )
            axis = 1 if fmt.transposed(col) else 0
            data[col] = views.setdefault(id(d), d.narrow(axis, r0, r1 - r0))
            if s is not None:
                if fmt.mode is not None and fmt.mode.block_shape is not None:
                    lo, hi = r0 // b, -(-r1 // b)
                    s = views.setdefault(id(s), s.narrow(axis, lo, hi - lo))
                scales[col] = s
        return QuantizedTensor(
            shape=(stop - start, *self._shape[1:]),
            dtype=self._dtype,
            rowwise_format=self._formats[0],
            columnwise_format=self._formats[1],
            rowwise_data=data[0],
            rowwise_scale_inv=scales[0],
            columnwise_data=data[1],
            columnwise_scale_inv=scales[1],
        )

    # ---- internals ------------------------------------------------------------------------

    def _distinct_tensors(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        for t in (*self._data, *self._scale_inv):
            if t is not None:
                seen.setdefault(id(t), t)
        return list(seen.values())

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> QuantizedTensor:
        """A new (non-cached) tensor whose tensors are ``fn`` of these, sharing kept."""
        done: dict[int, torch.Tensor] = {}

        def f(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else done.setdefault(id(t), fn(t))

        return QuantizedTensor.from_tensors([f(t) for t in self.tensors()], self.meta)

    def _adopt(self, other: QuantizedTensor, *, columnwise: bool) -> None:
        """Take ``other``'s data of one direction (same shape, dtype and format)."""
        if other.meta.shape != self._shape or other.format(columnwise) != self.format(columnwise):
            raise InvalidArgumentError(
                f"cannot adopt {_name(columnwise)} data of {other!r} into {self!r}"
            )
        self._data[columnwise] = other._data[columnwise]
        self._scale_inv[columnwise] = other._scale_inv[columnwise]
        self._validate()

    def _validate(self) -> None:
        import torch

        if len(self._shape) < 1 or any(s < 0 for s in self._shape):
            raise InvalidArgumentError(
                f"QuantizedTensor shape must have at least 1 dim of sizes >= 0, got "
                f"{list(self._shape)}"
            )
        if self._dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise InvalidArgumentError(
                f"QuantizedTensor dtype (the high-precision dtype) must be float32, bfloat16 "
                f"or float16, got {self._dtype}"
            )
        if self._data[0] is None and self._data[1] is None:
            raise InvalidArgumentError(
                "QuantizedTensor needs rowwise or columnwise data (or both), got neither"
            )
        m, k = _matrix_dims(self._shape)
        devices = {t.device for t in self._distinct_tensors()}
        if len(devices) > 1:
            raise InvalidArgumentError(
                f"QuantizedTensor tensors must be on one device, got {sorted(map(str, devices))}"
            )
        for col in (False, True):
            fmt, data, s = self._formats[col], self._data[col], self._scale_inv[col]
            if not isinstance(fmt, DirectionFormat):
                raise InvalidArgumentError(
                    f"{_name(col)}_format must be a DirectionFormat, got {fmt!r}"
                )
            try:
                fmt.check_direction(col)
            except ConfigError as e:
                raise InvalidArgumentError(f"QuantizedTensor: {e}") from None
            where = f"QuantizedTensor {_name(col)}"
            if data is None:
                if s is not None:
                    raise InvalidArgumentError(f"{where}: scale_inv given without data")
                continue
            want_shape = fmt.data_shape(col, m, k)
            if tuple(data.shape) != want_shape:
                raise InvalidArgumentError(
                    f"{where} data must have shape {list(want_shape)} for logical shape "
                    f"{list(self._shape)} and format {fmt}, got {list(data.shape)}"
                )
            if fmt.fp8 is None:
                if not data.is_floating_point() or data.element_size() < 2:
                    raise InvalidArgumentError(
                        f"{where} high-precision data must be float32/bfloat16/float16, got "
                        f"{data.dtype}"
                    )
                if s is not None:
                    raise InvalidArgumentError(f"{where}: high-precision data has no scale_inv")
                continue
            if data.dtype not in (fmt.fp8.torch_dtype, torch.uint8):
                raise InvalidArgumentError(
                    f"{where} data must be {fmt.fp8.torch_dtype} or uint8 (raw FP8 bytes) for "
                    f"format {fmt}, got {data.dtype}"
                )
            want_scale = fmt.scale_shape(col, m, k)
            assert want_scale is not None
            mx = fmt.mode in (ops.ScalingMode.MXFP8_ROWWISE, ops.ScalingMode.MXFP8_COLUMNWISE)
            scale_dtypes = (
                (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8))
                if mx
                else (torch.float32,)
            )
            if s is None or s.dtype not in scale_dtypes:
                got = "None" if s is None else s.dtype
                raise InvalidArgumentError(
                    f"{where} scale_inv must be {' or '.join(map(str, scale_dtypes))} for "
                    f"format {fmt}, got {got}"
                )
            shape_ok = s.numel() == 1 if want_scale == (1,) else tuple(s.shape) == want_scale
            if not shape_ok:
                raise InvalidArgumentError(
                    f"{where} scale_inv must have shape {list(want_scale)} for data "
                    f"{list(data.shape)} and format {fmt}, got {list(s.shape)}"
                )

    def __repr__(self) -> str:
        fmts = ", ".join(
            f"{_name(c)}={self._formats[c]}" + ("" if self._data[c] is not None else " (absent)")
            for c in (False, True)
        )
        dev = self.device if (self._data[0] is not None or self._data[1] is not None) else "?"
        cached = ", cached" if self._cached else ""
        return (
            f"QuantizedTensor(shape={list(self._shape)}, dtype={self._dtype}, {fmts}, "
            f"device={dev}{cached})"
        )

"""Quantizers: configured plain objects that turn a tensor into a :class:`QuantizedTensor`.

Each quantizer takes one frozen, validated config and makes data of fixed formats
(rowwise / columnwise):

* :class:`DelayedScalingQuantizer` (:class:`DelayedScalingConfig`): per-tensor FP8, TENSOR /
  TENSOR, scale from the amax history of earlier calls;
* :class:`CurrentScalingQuantizer` (:class:`CurrentScalingConfig`): per-tensor FP8, TENSOR /
  TENSOR, scale from this call's amax (all-reduced over the amax group when given);
* :class:`BlockScalingQuantizer` (:class:`BlockScalingConfig`): BLOCK_1X128 (activations,
  gradients) or BLOCK_128X128 (weights) in both directions;
* :class:`MXFP8Quantizer` (:class:`MXFP8Config`): MXFP8_ROWWISE / MXFP8_COLUMNWISE;
* :class:`HighPrecisionQuantizer` (:class:`HighPrecisionConfig`): no quantization (a copy);
* :class:`HybridQuantizer` (:class:`HybridConfig`): one quantizer per direction.

:func:`make_quantizer` builds the quantizer of a config.

NOTE [plain quantizers]: a quantizer holds its frozen config, its usage flags and, for delayed
scaling only, its state as plain tensors (``amax_history``, ``scale``). No process group, no
stream, no closure: quantizers pickle and deep-copy (torch.compile and checkpointing rely on
it). The amax reduction group is an argument of :meth:`Quantizer.quantize` (docs/design.md §3,
invariant 3; :mod:`overlap.quantization.amax_reduction`).

NOTE [usage flags]: ``rowwise_usage`` / ``columnwise_usage`` say which directions
:meth:`Quantizer.quantize` produces; a call may override them (``rowwise=``, ``columnwise=``)
without touching the quantizer. Cached weights add usages and never drop them
(:class:`~overlap.quantization.CachedWeight`).

One file: every quantizer stands next to its frozen config and shares the config checks and
the per-tensor base class, and :func:`make_quantizer` maps every config to its class; a split
by recipe would scatter that one table over six modules.
"""

from __future__ import annotations

import abc
import copy
import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from overlap.dtypes import ScalingMode
from overlap.errors import ConfigError, InvalidArgumentError
from overlap.quantization import ops
from overlap.quantization.amax_reduction import AmaxReducer, as_amax_reducer
from overlap.quantization.formats import DirectionFormat, Fp8Format, direction_format
from overlap.quantization.ops import BlockScaledFP8
from overlap.quantization.tensor import QuantizedTensor

if TYPE_CHECKING:
    import torch

__all__ = [
    "AmaxComputeAlgo",
    "BlockScalingConfig",
    "BlockScalingQuantizer",
    "CurrentScalingConfig",
    "CurrentScalingQuantizer",
    "DelayedScalingConfig",
    "DelayedScalingQuantizer",
    "HighPrecisionConfig",
    "HighPrecisionQuantizer",
    "HybridConfig",
    "HybridQuantizer",
    "MXFP8Config",
    "MXFP8Quantizer",
    "Quantizer",
    "QuantizerConfig",
    "SimpleQuantizerConfig",
    "make_quantizer",
]

# The four outputs of one quantization, a direction not produced being None. The kernels'
# BlockScaledFP8 tuple has exactly these fields; per-tensor formats use it too.
_Parts = BlockScaledFP8
_NO_PARTS = _Parts(None, None, None, None)


class _Request(NamedTuple):
    """What one quantization must produce, handed to the format-specific code."""

    rowwise: bool
    columnwise: bool
    amax_group: AmaxReducer | None
    out: _Parts | None  # tensors to write into (exactly the requested directions)


class AmaxComputeAlgo(enum.Enum):
    """Which amax of the history a delayed-scaling scale is computed from."""

    MAX = "max"  #: the largest amax of the history window
    MOST_RECENT = "most_recent"  #: the amax of the latest call


def _enum(cls: type[enum.Enum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        raise ConfigError(
            f"{what} must be one of {[m.value for m in cls]} (or {cls.__name__}), got {value!r}"
        ) from None


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def _check_epsilon(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"epsilon must be a finite float >= 0, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"epsilon must be a finite float >= 0, got {value!r}")


# ---- configs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DelayedScalingConfig:
    """Per-tensor FP8 with the scale of earlier calls (TransformerEngine's delayed scaling).

    Each call casts with the current ``scale``, records the amax of its input (all-reduced
    over ``amax_group`` when given) in the history, then computes the next scale from the
    history: ``fp8_max / amax / 2**margin``.

    Attributes:
        fp8: FP8 encoding (``Fp8Format``, "e4m3"/"e5m2" or a torch FP8 dtype).
        margin: headroom in powers of two, 0..127.
        history_len: amaxes kept, >= 1.
        amax_compute_algo: ``"max"`` (of the window) or ``"most_recent"``.
    """

    fp8: Fp8Format = Fp8Format.E4M3
    margin: int = 0
    history_len: int = 1024
    amax_compute_algo: AmaxComputeAlgo = AmaxComputeAlgo.MAX

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8", Fp8Format.of(self.fp8))
        _check_int("margin", self.margin, 0, 127)
        _check_int("history_len", self.history_len, 1, 1 << 20)
        object.__setattr__(
            self,
            "amax_compute_algo",
            _enum(AmaxComputeAlgo, self.amax_compute_algo, "amax_compute_algo"),
        )


@dataclass(frozen=True)
class CurrentScalingConfig:
    """Per-tensor FP8 with the scale of this call's amax: ``fp8_max / max(amax, epsilon) /
    2**margin`` (optionally a power of two). With an ``amax_group`` all shards share it.

    Attributes:
        fp8: FP8 encoding.
        margin: headroom in powers of two, 0..127.
        power_of_2: round the scale down to a power of two (exact scale_inv).
        epsilon: lower bound on the amax, finite and >= 0.
    """

    fp8: Fp8Format = Fp8Format.E4M3
    margin: int = 0
    power_of_2: bool = False
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8", Fp8Format.of(self.fp8))
        _check_int("margin", self.margin, 0, 127)
        _check_epsilon(self.epsilon)


@dataclass(frozen=True)
class BlockScalingConfig:
    """Block-scaled FP8: 1x128 blocks (activations, gradients) or 128x128 tiles (weights).

    Attributes:
        fp8: FP8 encoding.
        block: ``ScalingMode.BLOCK_1X128`` or ``ScalingMode.BLOCK_128X128`` (or their values
            "block_1x128" / "block_128x128").
        power_of_2: power-of-two block scales.
        epsilon: lower bound on each block's amax, finite and >= 0.
    """

    fp8: Fp8Format = Fp8Format.E4M3
    block: ScalingMode = ScalingMode.BLOCK_1X128
    power_of_2: bool = False
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8", Fp8Format.of(self.fp8))
        block = _enum(ScalingMode, self.block, "block")
        if block not in (ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_128X128):
            raise ConfigError(
                f"block must be ScalingMode.BLOCK_1X128 or ScalingMode.BLOCK_128X128, got {block}"
            )
        object.__setattr__(self, "block", block)
        _check_epsilon(self.epsilon)


@dataclass(frozen=True)
class MXFP8Config:
    """MXFP8 (OCP MX): blocks of 32 sharing an E8M0 power-of-two scale (1x32 rowwise, 32x1
    columnwise). Rowwise needs K % 32 == 0, columnwise M % 32 == 0.

    Attributes:
        fp8: FP8 encoding of the elements.
    """

    fp8: Fp8Format = Fp8Format.E4M3

    def __post_init__(self) -> None:
        object.__setattr__(self, "fp8", Fp8Format.of(self.fp8))


@dataclass(frozen=True)
class HighPrecisionConfig:
    """No quantization: the data are a copy of the input, optionally cast.

    Attributes:
        dtype: float32, bfloat16 or float16; None keeps the input's dtype.
    """

    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.dtype is None:
            return
        import torch

        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ConfigError(
                f"HighPrecisionConfig.dtype must be torch.float32, torch.bfloat16, "
                f"torch.float16 or None, got {self.dtype!r}"
            )


SimpleQuantizerConfig = (
    DelayedScalingConfig
    | CurrentScalingConfig
    | BlockScalingConfig
    | MXFP8Config
    | HighPrecisionConfig
)


@dataclass(frozen=True)
class HybridConfig:
    """One format for the rowwise direction, another for the columnwise one (e.g. per-tensor
    FP8 forward, block FP8 backward). Neither may itself be hybrid.

    Attributes:
        rowwise: config of the quantizer that makes the rowwise data.
        columnwise: config of the quantizer that makes the columnwise data.
    """

    rowwise: SimpleQuantizerConfig = field(default_factory=CurrentScalingConfig)
    columnwise: SimpleQuantizerConfig = field(default_factory=BlockScalingConfig)

    def __post_init__(self) -> None:
        for which in ("rowwise", "columnwise"):
            cfg = getattr(self, which)
            if isinstance(cfg, HybridConfig):
                raise ConfigError(f"HybridConfig.{which} cannot itself be a HybridConfig")
            if not isinstance(cfg, SimpleQuantizerConfig):
                names = [c.__name__ for c in SimpleQuantizerConfig.__args__]
                raise ConfigError(
                    f"HybridConfig.{which} must be one of {names}, got {type(cfg).__name__}"
                )


QuantizerConfig = SimpleQuantizerConfig | HybridConfig


# ---- quantizers ----------------------------------------------------------------------------


class Quantizer(abc.ABC):
    """Base class: usage flags, argument checks and assembly of the :class:`QuantizedTensor`.

    Args:
        config: the quantizer's frozen config (kept as :attr:`config`), an instance of
            :attr:`config_type`; None: that type's defaults.
        rowwise: produce rowwise data by default.
        columnwise: produce columnwise data by default.
    """

    config_type: type = object

    def __init__(
        self, config: Any = None, *, rowwise: bool = True, columnwise: bool = True
    ) -> None:
        if config is None:
            config = self.config_type()
        if not isinstance(config, self.config_type):
            raise ConfigError(
                f"{type(self).__name__} takes a {self.config_type.__name__}, got "
                f"{type(config).__name__}"
            )
        self.config = config
        self.rowwise_usage = True
        self.columnwise_usage = True
        self.set_usage(rowwise=rowwise, columnwise=columnwise)

    # ---- formats and usages ---------------------------------------------------------------

    @property
    @abc.abstractmethod
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        """``(rowwise_format, columnwise_format)`` of the data this quantizer makes."""

    @property
    def rowwise_format(self) -> DirectionFormat:
        return self.formats[0]

    @property
    def columnwise_format(self) -> DirectionFormat:
        return self.formats[1]

    @property
    def uses_amax_group(self) -> bool:
        """True if :meth:`quantize` reduces an amax over ``amax_group`` (per-tensor scaling);
        formats with local scales (blocks, MXFP8, high precision) ignore the group."""
        return False

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        """Set the default directions (None leaves one as it is).

        Raises:
            ConfigError: both would be False.
        """
        row = self.rowwise_usage if rowwise is None else bool(rowwise)
        col = self.columnwise_usage if columnwise is None else bool(columnwise)
        if not (row or col):
            raise ConfigError(
                f"{type(self).__name__}: at least one of rowwise / columnwise usage must be True"
            )
        self.rowwise_usage, self.columnwise_usage = row, col

    def copy(self) -> Quantizer:
        """A deep copy (delayed-scaling state included)."""
        return copy.deepcopy(self)

    # ---- quantize -------------------------------------------------------------------------

    def quantize(
        self,
        x: torch.Tensor,
        *,
        out: QuantizedTensor | None = None,
        amax_group: AmaxReducer | Any | None = None,
        rowwise: bool | None = None,
        columnwise: bool | None = None,
    ) -> QuantizedTensor:
        """Quantize ``x``.

        Args:
            x: float32, bfloat16 or float16 tensor ``[..., K]`` (at least 1-D), quantized as
                the matrix ``[M, K]``, ``M = prod(shape[:-1])``; non-contiguous inputs are
                copied first.
            out: optional tensor to write into (in place; for cached weights and buffers):
                same shape and dtype as ``x``, this quantizer's formats, and exactly the
                directions produced (so that no direction is left stale).
            amax_group: the ranks that must share a per-tensor scale (an :class:`AmaxReducer`,
                or a ProcessGroup / Bootstrap / callable, see
                :func:`~overlap.quantization.as_amax_reducer`). Used by per-tensor formats,
                ignored by the others (see :attr:`uses_amax_group`). Never stored.
            rowwise: produce rowwise data (default: :attr:`rowwise_usage`).
            columnwise: produce columnwise data (default: :attr:`columnwise_usage`).

        Returns:
            A new :class:`QuantizedTensor` of ``x``'s shape and dtype, or ``out``.

        Raises:
            InvalidArgumentError: bad ``x``, ``out`` or ``amax_group``; from the kernels, a
                shape the format cannot hold (e.g. MXFP8 with K % 32 != 0).
        """
        import torch

        row = self.rowwise_usage if rowwise is None else bool(rowwise)
        col = self.columnwise_usage if columnwise is None else bool(columnwise)
        name = type(self).__name__
        if not (row or col):
            raise InvalidArgumentError(f"{name}.quantize: rowwise and columnwise both False")
        if not isinstance(x, torch.Tensor):
            raise InvalidArgumentError(f"{name}.quantize expects a torch.Tensor, got {type(x)}")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or x.dim() < 1:
            raise InvalidArgumentError(
                f"{name}.quantize expects a float32, bfloat16 or float16 tensor of at least 1 "
                f"dim, got {x.dtype} of shape {list(x.shape)}"
            )
        reducer = None if amax_group is None else as_amax_reducer(amax_group)
        m, k = math.prod(x.shape[:-1]), x.shape[-1]
        x2d = x.reshape(m, k).contiguous()
        out_parts = None
        if out is not None:
            self._check_out(out, x, row, col)
            out_parts = _Parts(*out.tensors())
        req = _Request(row, col, reducer, out_parts)
        parts = self._quantize_empty(x2d, req) if x2d.numel() == 0 else self._quantize_2d(x2d, req)
        if out is not None:
            return out
        # NOTE [quantizer outputs] in overlap/quantization/tensor.py: valid by construction
        return QuantizedTensor._made(parts, tuple(x.shape), x.dtype, self.formats)

    def _check_out(self, out: Any, x: torch.Tensor, row: bool, col: bool) -> None:
        name = type(self).__name__
        if not isinstance(out, QuantizedTensor):
            raise InvalidArgumentError(f"{name}.quantize: out must be a QuantizedTensor")
        if out.shape != tuple(x.shape) or out.dtype != x.dtype or out.device != x.device:
            raise InvalidArgumentError(
                f"{name}.quantize: out is {list(out.shape)} {out.dtype} on {out.device}, "
                f"x is {list(x.shape)} {x.dtype} on {x.device}"
            )
        if out.formats != self.formats:
            raise InvalidArgumentError(
                f"{name}.quantize: out has formats {tuple(map(str, out.formats))}, this "
                f"quantizer makes {tuple(map(str, self.formats))}"
            )
        if (out.has_rowwise, out.has_columnwise) != (row, col):
            raise InvalidArgumentError(
                f"{name}.quantize: out holds rowwise={out.has_rowwise}, "
                f"columnwise={out.has_columnwise} but this call produces rowwise={row}, "
                f"columnwise={col}; a direction of out that is not rewritten would be stale"
            )

    def _quantize_empty(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        """An input with no elements (e.g. an MoE expert without tokens): empty data, unit
        scales. The amax group still takes part in the reduction (with amax 0), so that the
        other ranks of a collective never wait for this one."""
        import torch

        self._empty_amax(x2d.new_zeros(1, dtype=torch.float32), req.amax_group)
        if req.out is not None:
            return req.out
        m, k = x2d.shape
        made: list[torch.Tensor | None] = []
        for col, wanted in ((False, req.rowwise), (True, req.columnwise)):
            fmt = self.formats[col]
            shape = fmt.scale_shape(col, m, k)
            if not wanted:
                made += [None, None]
            elif fmt.fp8 is None:
                dtype = getattr(self.config, "dtype", None) or x2d.dtype
                made += [x2d.new_empty(fmt.data_shape(col, m, k), dtype=dtype), None]
            else:
                mx = fmt.mode in (ScalingMode.MXFP8_ROWWISE, ScalingMode.MXFP8_COLUMNWISE)
                scales = x2d.new_full(
                    shape or (1,),
                    127 if mx else 1.0,  # E8M0 byte 127 is 2**0
                    dtype=torch.uint8 if mx else torch.float32,
                )
                data = x2d.new_empty(fmt.data_shape(col, m, k), dtype=fmt.fp8.torch_dtype)
                made += [data, scales]
        return _Parts(*made)

    def _empty_amax(self, amax: torch.Tensor, amax_group: AmaxReducer | None) -> None:
        """Take part in the amax reduction of an empty input (per-tensor formats)."""
        return None

    @abc.abstractmethod
    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        """Quantize the contiguous ``[M, K]`` matrix into the requested directions (into
        ``out``'s tensors when given)."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.config!r}, rowwise={self.rowwise_usage}, "
            f"columnwise={self.columnwise_usage})"
        )


def _cast_per_tensor(
    x2d: torch.Tensor,
    scale: torch.Tensor,
    fp8: Fp8Format,
    req: _Request,
    amax: torch.Tensor | None = None,
) -> _Parts:
    """Per-tensor cast of ``x2d`` with ``scale`` into the requested directions; the scale_inv
    is a tensor of its own (never the quantizer's state), shared by both directions."""
    o = req.out or _NO_PARTS
    s_inv = o.rowwise_scale_inv if o.rowwise_scale_inv is not None else o.columnwise_scale_inv
    if not req.columnwise:
        data, s_inv = ops.cast_to_fp8(
            x2d, scale, fp8_dtype=fp8.torch_dtype, out=o.rowwise_data, scale_inv=s_inv, amax=amax
        )
        return _Parts(data, s_inv, None, None)
    data, data_t, s_inv = ops.cast_transpose(
        x2d,
        scale,
        fp8_dtype=fp8.torch_dtype,
        rowwise=req.rowwise,
        out=o.rowwise_data,
        out_t=o.columnwise_data,
        scale_inv=s_inv,
        amax=amax,
    )
    col_s_inv = s_inv
    if o.columnwise_scale_inv is not None and o.columnwise_scale_inv is not s_inv:
        o.columnwise_scale_inv.copy_(s_inv)
        col_s_inv = o.columnwise_scale_inv
    return _Parts(data, s_inv if req.rowwise else None, data_t, col_s_inv)


class _PerTensorQuantizer(Quantizer):
    """Per-tensor FP8: one scale for the whole tensor, shared by the amax group."""

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        fmt = direction_format(ScalingMode.TENSOR, self.config.fp8)
        return (fmt, fmt)

    @property
    def uses_amax_group(self) -> bool:
        return True

    def _empty_amax(self, amax: torch.Tensor, amax_group: AmaxReducer | None) -> None:
        if amax_group is not None:
            amax_group.all_reduce_max(amax)


class CurrentScalingQuantizer(_PerTensorQuantizer):
    """Per-tensor FP8, scale from the amax of the input of this call (see
    :class:`CurrentScalingConfig`). With ``amax_group`` the amax is all-reduced (MAX) before
    the scale is computed, so every shard of the group gets the same scale."""

    config_type = CurrentScalingConfig

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        cfg: CurrentScalingConfig = self.config
        amax = ops.amax(x2d)
        if req.amax_group is not None:
            req.amax_group.all_reduce_max(amax)
        scale, _ = ops.compute_scale(
            amax,
            fp8_dtype=cfg.fp8.torch_dtype,
            margin=cfg.margin,
            power_of_2=cfg.power_of_2,
            epsilon=float(cfg.epsilon),
        )
        return _cast_per_tensor(x2d, scale, cfg.fp8, req)


class DelayedScalingQuantizer(_PerTensorQuantizer):
    """Per-tensor FP8 with delayed scaling (see :class:`DelayedScalingConfig`).

    State (plain float32 tensors, moved to the input's device on first use):

    * ``amax_history``: ``[history_len]``, ``amax_history[0]`` the most recent amax;
    * ``scale``: ``[1]``, the scale the next call casts with (1 initially).

    A quantized tensor's scale_inv is its own copy: later calls never change it.
    """

    config_type = DelayedScalingConfig

    def __init__(
        self,
        config: DelayedScalingConfig | None = None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
    ) -> None:
        import torch

        super().__init__(config, rowwise=rowwise, columnwise=columnwise)
        self.amax_history = torch.zeros(self.config.history_len, dtype=torch.float32)
        self.scale = torch.ones(1, dtype=torch.float32)

    def reset(self) -> None:
        """Forget the history; the scale goes back to 1."""
        self.amax_history.zero_()
        self.scale.fill_(1.0)

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        import torch

        if self.scale.device != x2d.device:
            self.amax_history = self.amax_history.to(x2d.device)
            self.scale = self.scale.to(x2d.device)
        amax = torch.empty(1, dtype=torch.float32, device=x2d.device)
        parts = _cast_per_tensor(x2d, self.scale, self.config.fp8, req, amax=amax)
        self._empty_amax(amax, req.amax_group)  # reduce, then record
        return parts

    def _empty_amax(self, amax: torch.Tensor, amax_group: AmaxReducer | None) -> None:
        super()._empty_amax(amax, amax_group)
        self.update_scale(amax)

    def update_scale(self, amax: torch.Tensor) -> None:
        """Record ``amax`` (float32 ``[1]``, already reduced over the group) as the most recent
        history entry and compute the scale of the next call from the history."""
        h = self.amax_history
        h.copy_(h.roll(1))
        h[:1].copy_(amax.reshape(1))
        if self.config.amax_compute_algo is AmaxComputeAlgo.MAX:
            ref = h.amax().reshape(1)  # propagates NaN: the scale then falls back to 1
        else:
            ref = h[:1].clone()
        scale_inv = self.scale.new_empty(1)
        ops.compute_scale(
            ref,
            fp8_dtype=self.config.fp8.torch_dtype,
            margin=self.config.margin,
            out=(self.scale, scale_inv),
        )


class BlockScalingQuantizer(Quantizer):
    """Block-scaled FP8, 1x128 blocks or 128x128 tiles (see :class:`BlockScalingConfig`).
    Scales are local to each block: ``amax_group`` is ignored."""

    config_type = BlockScalingConfig

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        fmt = direction_format(self.config.block, self.config.fp8)
        return (fmt, fmt)

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        cfg: BlockScalingConfig = self.config
        two_d = cfg.block is ScalingMode.BLOCK_128X128
        fn = ops.quantize_block_128x128 if two_d else ops.quantize_block_1x128
        return fn(
            x2d,
            fp8_dtype=cfg.fp8.torch_dtype,
            rowwise=req.rowwise,
            columnwise=req.columnwise,
            power_of_2=cfg.power_of_2,
            epsilon=float(cfg.epsilon),
            out=req.out,
        )


class MXFP8Quantizer(Quantizer):
    """MXFP8 (see :class:`MXFP8Config`). Scales are local to each block: ``amax_group`` is
    ignored."""

    config_type = MXFP8Config

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        return (
            direction_format(ScalingMode.MXFP8_ROWWISE, self.config.fp8),
            direction_format(ScalingMode.MXFP8_COLUMNWISE, self.config.fp8),
        )

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        return ops.quantize_mxfp8(
            x2d,
            fp8_dtype=self.config.fp8.torch_dtype,
            rowwise=req.rowwise,
            columnwise=req.columnwise,
            out=req.out,
        )


class HighPrecisionQuantizer(Quantizer):
    """Passthrough: the data are a copy of the input (cast to ``config.dtype`` if set), never
    an alias of it (the input may live in a communication buffer, docs/design.md §3, invariant 2).
    Both directions share the one ``[M, K]`` copy."""

    config_type = HighPrecisionConfig

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        fmt = direction_format()
        return (fmt, fmt)

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        if req.out is not None:
            o = req.out
            targets = {id(t): t for t in (o.rowwise_data, o.columnwise_data) if t is not None}
            for t in targets.values():
                t.copy_(x2d)
            return o
        data = x2d.to(dtype=self.config.dtype or x2d.dtype, copy=True)
        return _Parts(data if req.rowwise else None, None, data if req.columnwise else None, None)


class HybridQuantizer(Quantizer):
    """One quantizer for the rowwise direction and another for the columnwise direction
    (docs/design.md §3, invariant 5), e.g. per-tensor FP8 forward and 1x128 block FP8 backward.

    Args:
        rowwise_quantizer: makes the rowwise data (its own usage flags are not consulted).
        columnwise_quantizer: makes the columnwise data.
        rowwise: produce rowwise data by default.
        columnwise: produce columnwise data by default.

    ``amax_group`` is passed to both; each uses it only if its format needs it.
    """

    config_type = HybridConfig

    def __init__(
        self,
        rowwise_quantizer: Quantizer,
        columnwise_quantizer: Quantizer,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
    ) -> None:
        for which, q in (("rowwise", rowwise_quantizer), ("columnwise", columnwise_quantizer)):
            if not isinstance(q, Quantizer) or isinstance(q, HybridQuantizer):
                raise ConfigError(
                    f"HybridQuantizer: {which}_quantizer must be a non-hybrid Quantizer, got "
                    f"{type(q).__name__}"
                )
        self.rowwise_quantizer = rowwise_quantizer
        self.columnwise_quantizer = columnwise_quantizer
        super().__init__(
            HybridConfig(rowwise_quantizer.config, columnwise_quantizer.config),
            rowwise=rowwise,
            columnwise=columnwise,
        )

    @property
    def formats(self) -> tuple[DirectionFormat, DirectionFormat]:
        return (self.rowwise_quantizer.formats[0], self.columnwise_quantizer.formats[1])

    @property
    def uses_amax_group(self) -> bool:
        return self.rowwise_quantizer.uses_amax_group or self.columnwise_quantizer.uses_amax_group

    def _quantize_2d(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        return self._per_direction(x2d, req, empty=False)

    def _quantize_empty(self, x2d: torch.Tensor, req: _Request) -> _Parts:
        # Each sub-quantizer takes part in the reductions it would make for a non-empty input.
        return self._per_direction(x2d, req, empty=True)

    def _per_direction(self, x2d: torch.Tensor, req: _Request, *, empty: bool) -> _Parts:
        """Each requested direction from its own quantizer (writing into ``req.out``'s
        tensors of that direction when given)."""
        o = req.out
        row = col = _NO_PARTS
        if req.rowwise:
            r = _Request(True, False, req.amax_group, o and _Parts(o[0], o[1], None, None))
            q = self.rowwise_quantizer
            row = q._quantize_empty(x2d, r) if empty else q._quantize_2d(x2d, r)
        if req.columnwise:
            r = _Request(False, True, req.amax_group, o and _Parts(None, None, o[2], o[3]))
            q = self.columnwise_quantizer
            col = q._quantize_empty(x2d, r) if empty else q._quantize_2d(x2d, r)
        return _Parts(row[0], row[1], col[2], col[3])


_QUANTIZER_OF = {
    DelayedScalingConfig: DelayedScalingQuantizer,
    CurrentScalingConfig: CurrentScalingQuantizer,
    BlockScalingConfig: BlockScalingQuantizer,
    MXFP8Config: MXFP8Quantizer,
    HighPrecisionConfig: HighPrecisionQuantizer,
}


def make_quantizer(
    config: QuantizerConfig, *, rowwise: bool = True, columnwise: bool = True
) -> Quantizer:
    """The quantizer of ``config`` (a :class:`HybridConfig` makes a :class:`HybridQuantizer`
    of two new quantizers).

    Raises:
        ConfigError: ``config`` is not a quantizer config.
    """
    if isinstance(config, HybridConfig):
        return HybridQuantizer(
            make_quantizer(config.rowwise),
            make_quantizer(config.columnwise),
            rowwise=rowwise,
            columnwise=columnwise,
        )
    cls = _QUANTIZER_OF.get(type(config))
    if cls is None:
        raise ConfigError(
            f"make_quantizer: {type(config).__name__} is not a quantizer config; use one of "
            f"{[c.__name__ for c in (*_QUANTIZER_OF, HybridConfig)]}"
        )
    return cls(config, rowwise=rowwise, columnwise=columnwise)

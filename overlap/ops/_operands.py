"""Operands of the overlap ops: plain tensors or per-tensor FP8 :class:`QuantizedTensor` s."""

from __future__ import annotations

import enum
import functools
from typing import TYPE_CHECKING, Union

from overlap._native import native
from overlap.dtypes import ScalingMode, is_fp8, is_high_precision
from overlap.errors import InvalidArgumentError, UnsupportedHardwareError
from overlap.quantization import QuantizedTensor

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from overlap.comm import SymmetricBuffer

# A bfloat16/float16/float32 tensor, or a QuantizedTensor with rowwise per-tensor FP8 data.
Operand = Union["torch.Tensor", QuantizedTensor]

__all__ = [
    "Operand",
    "Split",
    "call_key",
    "check_count",
    "check_flag",
    "check_given_buffer",
    "check_lanes",
    "check_op_dtype",
    "check_pieces",
    "check_sizes",
    "is_fp8",
    "op_device",
    "prepare",
    "signature",
    "split_as",
    "split_of",
    "split_operand",
    "stream_getter",
    "stream_of",
    "travels_as",
    "tuning",
    "weight_transposed",
]


def tuning() -> object:
    """The native module's tuning limits and defaults (NOTE [overlap defaults] in
    ``csrc/comm/overlap/overlap_ops.h``): ``MAX_PIECES``, ``MAX_COMPUTE_LANES``,
    ``ag_gemm_defaults(size)``... The ops read every default and limit from it."""
    return native().comm_ops


def travels_as(dtype: torch.dtype, op_dtype: torch.dtype) -> bool:
    """Whether a shard of ``dtype`` fits an op whose buffer was sized for ``op_dtype``: the
    same dtype, or any FP8 encoding on an FP8 op (E5M2 gradients travel in the buffer of an
    E4M3 layer: both take one byte, and the encoding is the tensor's, not the buffer's)."""
    return dtype == op_dtype or (is_fp8(dtype) and is_fp8(op_dtype))


#: How an op's weight is stored: ``"nk"``, a linear layer's ``[N, K]`` weight used transposed
#: (``Y = X W^T``), or ``"kn"``, a ``[K, N]`` matrix used as it is (``Y = X W``; e.g. dgrad
#: ``dX = dY W`` with the layer's own weight, no transposed copy). FP8 GEMMs on Hopper take
#: ``"nk"`` only (cuBLASLt's FP8 kernels are TN).
WEIGHT_LAYOUTS = ("nk", "kn")


def weight_transposed(op: str, layout: str) -> bool:
    """``transb`` of the native op for a weight layout (checked)."""
    if layout not in WEIGHT_LAYOUTS:
        raise InvalidArgumentError(
            f"{op}: weight_layout must be one of {WEIGHT_LAYOUTS}, got {layout!r}"
        )
    return layout == "nk"


def split_operand(op: str, name: str, x: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` as (2-D data, scale_inv or None), checked before any communication."""
    import torch

    if isinstance(x, QuantizedTensor):
        fmt = x.rowwise_format
        if not x.has_rowwise or fmt.mode is not ScalingMode.TENSOR:
            raise UnsupportedHardwareError(
                f"{op}: {name} must carry rowwise per-tensor FP8 data (got {fmt}, rowwise="
                f"{x.has_rowwise}); block and MX formats are not supported by the overlap ops yet"
            )
        data, scale_inv = x.rowwise_data, x.rowwise_scale_inv
        if data.dtype == torch.uint8:
            data = data.view(fmt.fp8.torch_dtype)
        data = data.reshape(-1, data.shape[-1])
    elif isinstance(x, torch.Tensor):
        if is_fp8(x.dtype):
            raise InvalidArgumentError(
                f"{op}: {name} is a bare FP8 tensor; pass a QuantizedTensor so that its "
                "scale_inv travels with it"
            )
        if not is_high_precision(x.dtype):
            raise InvalidArgumentError(
                f"{op}: {name} must be bfloat16, float16 or float32, got {x.dtype}"
            )
        data, scale_inv = x, None
    else:
        raise InvalidArgumentError(
            f"{op}: {name} must be a torch.Tensor or a QuantizedTensor, got {type(x).__name__}"
        )
    if data.dim() != 2:
        raise InvalidArgumentError(f"{op}: {name} must be 2-D, got shape {tuple(data.shape)}")
    return data, scale_inv


# NOTE [op plans]: an overlap op's Python checks (operand kinds, dtypes, shapes, strides,
# devices, FP8 formats, the epilogue's arguments, the op's sizes) read tensor metadata and
# plain argument values only, never data pointers or tensor values. So a call whose operands
# have the metadata of an earlier checked call, and whose other arguments are equal values of
# the same types, passes the same checks and derives the same things. Each op keeps what its
# last checked call derived, its plan (the output shapes and dtypes to allocate, how each
# operand splits into data and scale_inv: :func:`split_of`, the derived native keywords such
# as transb and the FP8 fast_accum default, its CallRecord entry), keyed by :func:`call_key`:
# the :func:`signature` of every operand, the other arguments with their types (``1`` is not
# ``1.0``), the keyword names (bulk ops' GEMM keywords) and the op attributes the checks read.
# A call whose key equals the plan's skips the checks. Invariants: (1) both paths issue the
# native op through one method (``_issue``), with every value it takes from the call read
# from this call (the tensors, a QuantizedTensor's data and scale_inv, alpha, the flags, the
# stream) and the op's tuning attributes read then, so only derived values come from the
# plan; (2) a plan holds no tensor, so no data or scale_inv pointer outlives its call; (3) any
# change of shape, dtype, stride, device, scaling format, argument value or type, keyword set
# or checked attribute changes the key, and the call takes the checked path (typed errors
# before any GPU work) and re-plans; an argument of another type than bool/int/float/str/
# None/torch.dtype/enum (a tensor alpha) makes no key: always checked; (4) a plan is recorded
# only after the native op accepted its call. What no key covers stays checked on every call
# by the binding and the core: the data pointers (alignment, no view of the op's own buffer, a
# bulk GEMM's independence), the scale_inv tensors (float32 [1], the op's device), the
# buffer's liveness and generation (run_op; StaleBufferError), the collective op sequence.
# Ops: AllGatherGemm (BF16 or FP8, one or several weights), GemmReduceScatter, and the bulk
# AllGatherBesideGemm and ReduceScatterBesideGemm.
# Verdict: the fast path returns what the checked path returns, and raises where it raises.
# Measured: docs/performance-log.md [op plans].


def signature(x: object) -> tuple | None:
    """The metadata the ops' Python checks read of operand ``x`` (NOTE [op plans]): dtype,
    shape, strides and device of a tensor; of a QuantizedTensor also its class, rowwise
    format and its data's and scale_inv's; ``("none",)`` for None. None for anything else
    (such a call is always checked)."""
    if x is None:
        return _NONE
    if type(x) in _TENSOR_TYPES:
        return (x.dtype, x.shape, x.stride(), x.device)  # type: ignore[attr-defined]
    if isinstance(x, QuantizedTensor):
        data = x.rowwise_data
        if data is None:
            return None
        scale_inv = x.rowwise_scale_inv
        return (
            type(x),
            x.dtype,
            x.rowwise_format,
            (data.dtype, data.shape, data.stride(), data.device),
            None if scale_inv is None else signature(scale_inv),
        )
    import torch

    if isinstance(x, torch.Tensor):  # a subclass: checked as a tensor, so keyed as one
        return (x.dtype, x.shape, x.stride(), x.device)
    return None


_NONE = ("none",)
_TENSOR_TYPES: set[type] = set()  # torch.Tensor and nn.Parameter once call_key has run


def _plain_types() -> set[type]:
    import torch

    _TENSOR_TYPES.update({torch.Tensor, torch.nn.Parameter})
    _PLAIN.update({bool, int, float, str, type(None), torch.dtype})
    return _PLAIN


_PLAIN: set[type] = set()  # filled on first use (torch is imported lazily)


def call_key(operands: tuple, arguments: tuple) -> tuple | None:
    """The key of a call (NOTE [op plans]): the :func:`signature` of every operand, and the
    other ``arguments`` with their types (bool/int/float/str/None/torch.dtype values, or
    enum members). None where an operand has no signature or an argument is of another type:
    such a call is always checked."""
    plain = _PLAIN or _plain_types()
    sigs = tuple([_NONE if x is None else signature(x) for x in operands])
    if None in sigs:
        return None
    types = tuple(map(type, arguments))
    if not plain.issuperset(types) and not all(
        t in plain or issubclass(t, enum.Enum) for t in types
    ):
        return None
    return (sigs, arguments, types)


# How a checked call split an operand (NOTE [op plans]): None for a plain tensor, else
# (the FP8 dtype its uint8 rowwise data is viewed as or None, whether the data is flattened
# to 2-D) for a QuantizedTensor.
Split = tuple["torch.dtype | None", bool] | None


def split_of(x: object) -> Split:
    """How :func:`split_operand` split ``x``, which it accepted (for :func:`split_as`)."""
    import torch

    if not isinstance(x, QuantizedTensor):
        return None
    data = x.rowwise_data
    view = x.rowwise_format.fp8.torch_dtype if data.dtype == torch.uint8 else None
    return (view, data.dim() != 2)


def split_as(x: object, how: Split) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`split_operand` of an operand whose signature is that of a checked call's
    operand that split as ``how``: the same (data, scale_inv), without the checks."""
    if how is None:
        return x, None  # type: ignore[return-value]
    data = x.rowwise_data  # type: ignore[attr-defined]
    view, flatten = how
    if view is not None:
        data = data.view(view)
    if flatten:
        data = data.reshape(-1, data.shape[-1])
    return data, x.rowwise_scale_inv  # type: ignore[attr-defined]


def check_pair(op: str, a: torch.Tensor, b: torch.Tensor, device: torch.device) -> None:
    """Both operands on the op's device, both FP8 or of one high-precision dtype."""
    for name, t in (("input", a), ("weight", b)):
        if t.device != device:
            raise InvalidArgumentError(f"{op}: the {name} is on {t.device}, the op on {device}")
    if is_fp8(a.dtype) != is_fp8(b.dtype) or (not is_fp8(a.dtype) and a.dtype != b.dtype):
        raise InvalidArgumentError(
            f"{op}: input ({a.dtype}) and weight ({b.dtype}) must both be FP8 or share one dtype"
        )


def stream_of(device: torch.device) -> int:
    """The handle of the current stream of ``device`` (0 on the cpu), as the native ops take
    it."""
    import torch

    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


def stream_getter(device: torch.device) -> Callable[[], int]:
    """:func:`stream_of` ``(device)`` as a callable for the ops' fast paths (NOTE [op plans]):
    on cuda, torch's raw handle of the current stream, which builds no ``torch.cuda.Stream``
    (the checked path, run first, has initialised torch's CUDA state), else the general path."""
    import torch

    if device.type != "cuda":
        return _no_stream
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return functools.partial(stream_of, device)
    return functools.partial(raw, device.index)


def _no_stream() -> int:
    return 0


def default_fast_accum(fast_accum: bool | None, fp8: bool) -> bool:
    """As :func:`overlap.gemm.gemm`: on for per-tensor FP8, off otherwise."""
    return fp8 if fast_accum is None else bool(fast_accum)


def op_device(comm: object) -> torch.device:
    import torch

    device = comm.device  # type: ignore[attr-defined]
    return torch.device("cpu") if device < 0 else torch.device("cuda", device)


def check_count(op: str, name: str, value: object, lo: int, hi: int | None = None) -> int:
    """An int argument (not a bool, not a float) in ``lo..hi``, as an int."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise InvalidArgumentError(f"{op}: {name} must be {allowed}, got {value!r}")
    return int(value)


def check_flag(op: str, name: str, value: object) -> bool:
    """A bool argument."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{op}: {name} must be True or False, got {value!r}")
    return value


def check_op_dtype(op: str, name: str, dtype: object, *, fp8: bool) -> None:
    """An op's dtype argument: a torch dtype, bfloat16/float16/float32 (or FP8 where ``fp8``)."""
    import torch

    ok = isinstance(dtype, torch.dtype) and (is_high_precision(dtype) or (fp8 and is_fp8(dtype)))
    if not ok:
        allowed = "bfloat16, float16, float32" + (" or FP8" if fp8 else "")
        raise InvalidArgumentError(f"{op}: {name} must be a torch dtype ({allowed}), got {dtype!r}")


def check_sizes(op: str, tp: int, max_tokens: object, features: tuple[str, object]) -> None:
    """Constructor arguments of an op object: ints, ``max_tokens`` >= the TP size."""
    name, value = features
    for what, v in (("max_tokens", max_tokens), (name, value)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgumentError(f"{op}: {what} must be an int, got {v!r}")
    if max_tokens < tp or value < 1:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{op}: max_tokens ({max_tokens}) must be >= the TP size ({tp}) and {name} "
            f"({value}) >= 1"
        )


def check_lanes(op: str, lanes: object) -> int:
    """The ``compute_lanes`` argument of an op object (1..the core's bound)."""
    return check_count(op, "compute_lanes", lanes, 1, tuning().MAX_COMPUTE_LANES)


def check_pieces(op: str, pieces: object) -> int:
    """The ``pieces`` argument of an op object (NOTE [ag_gemm pieces], NOTE [gemm_rs pieces])."""
    return check_count(op, "pieces", pieces, 1, tuning().MAX_PIECES)


def check_given_buffer(op: str, buffer: SymmetricBuffer, tp: int, nbytes: int) -> None:
    """A symmetric buffer an op runs on: live, of the op's group size, large enough."""
    if buffer.destroyed or buffer.size != tp or buffer.nbytes < nbytes:
        raise InvalidArgumentError(
            f"{op}: buffer {buffer.name!r} ({buffer.nbytes} bytes, group size {buffer.size}"
            f"{', destroyed' if buffer.destroyed else ''}) cannot hold this op: it needs a live "
            f"buffer of >= {nbytes} bytes over {tp} ranks"
        )


def prepare(
    op: str, x: object, weight: object, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(input data, its scale_inv, weight data, its scale_inv), checked as a pair."""
    a, a_scale_inv = split_operand(op, "the input", x)
    b, b_scale_inv = split_operand(op, "the weight", weight)
    check_pair(op, a, b, device)
    return a, a_scale_inv, b, b_scale_inv

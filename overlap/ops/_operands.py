"""Operands of the overlap ops: plain tensors or per-tensor FP8 :class:`QuantizedTensor` s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from overlap._native import native
from overlap.dtypes import ScalingMode, is_fp8, is_high_precision
from overlap.errors import InvalidArgumentError, UnsupportedHardwareError
from overlap.quantization import QuantizedTensor

if TYPE_CHECKING:
    import torch

    from overlap.comm import SymmetricBuffer

# A bfloat16/float16/float32 tensor, or a QuantizedTensor with rowwise per-tensor FP8 data.
Operand = Union["torch.Tensor", QuantizedTensor]

__all__ = [
    "Operand",
    "check_count",
    "check_flag",
    "check_given_buffer",
    "check_lanes",
    "check_op_dtype",
    "check_pieces",
    "check_sizes",
    "gemm_kwargs",
    "is_fp8",
    "op_device",
    "prepare",
    "signature",
    "split_operand",
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
# devices, FP8 formats, the epilogue's arguments) read tensor metadata only, never data
# pointers or values. So a call whose every operand has the metadata of an earlier checked
# call passes the same checks: the op keeps the checked call's plan (the output shapes and
# dtype, the native call's fixed keywords, its CallRecord entry) keyed by that metadata
# (:func:`signature` of each operand, the call's other arguments and the op's tuning), and a
# call whose key equals the plan's skips the checks and goes to the native op. Any change of
# shape, dtype, stride, device, scaling format or argument changes the key: the call takes the
# checked path (typed errors before any GPU work, as before) and re-plans. What the key does
# not cover stays checked on every call by the binding and the core: the data pointers
# (alignment, no view of the op's own buffer), the buffer's liveness and generation
# (run_op; StaleBufferError), the collective op sequence. A plan is recorded only after the
# native op accepted the call, so a rejected call never leaves one behind.
# Verdict: the fast path returns what the checked path returns, and raises where it raises.


def signature(x: object) -> tuple | None:
    """The metadata the ops' Python checks read of operand ``x`` (NOTE [op plans]): dtype,
    shape, strides and device of a tensor; of a QuantizedTensor also its class, rowwise
    format and its data's and scale_inv's; ``("none",)`` for None. None for anything else
    (such a call is always checked)."""
    import torch

    if x is None:
        return ("none",)
    if type(x) is torch.Tensor or isinstance(x, torch.Tensor):
        return (x.dtype, x.shape, x.stride(), x.device)
    if isinstance(x, QuantizedTensor):
        if not x.has_rowwise:
            return None
        data, scale_inv = x.rowwise_data, x.rowwise_scale_inv
        return (
            type(x),
            x.dtype,
            x.rowwise_format,
            signature(data),
            signature(scale_inv),
        )
    return None


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
    import torch

    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


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


def gemm_kwargs(
    a: torch.Tensor,
    scale_invs: tuple[torch.Tensor | None, torch.Tensor | None],
    *,
    alpha: float,
    fast_accum: bool | None,
    sm_count: int,
    compute_lanes: int,
    device: torch.device,
    transb: bool = True,
) -> dict[str, object]:
    """The keyword arguments every native overlap op takes (``transb``: the weight is stored
    ``[N, K]``, a linear layer's; see :data:`WEIGHT_LAYOUTS`)."""
    return {
        "transb": transb,
        "a_scale_inv": scale_invs[0],
        "b_scale_inv": scale_invs[1],
        "alpha": float(alpha),
        "fast_accum": default_fast_accum(fast_accum, is_fp8(a.dtype)),
        "sm_count": int(sm_count),
        "compute_lanes": compute_lanes,
        "stream": stream_of(device),
    }

"""Thin torch wrappers over the core's quantization kernels.

Every function takes torch tensors, allocates the outputs it is not given, and calls the core
(``overlap._C.kernels``), which validates every argument and raises
:class:`~overlap.errors.InvalidArgumentError` naming what was wrong. FP8 data may be held in a
tensor of the FP8 dtype itself or as raw bytes in a ``uint8`` tensor (what communication
buffers carry); ``fp8_dtype`` names the format and defaults to the FP8 dtype of a given
output, else ``torch.float8_e4m3fn``.

Every op runs on CPU tensors (the host reference, also the oracle of the tests) and on CUDA
tensors (a CUDA kernel, bit-exact against the host reference). All tensors of one call must be
on one device; CUDA kernels are enqueued on that device's current stream and never
synchronise the host: scales, ``scale_inv`` and ``amax`` stay in device memory. On CUDA,
``scale``, ``scale_inv`` and ``amax`` must be separate tensors (the host tolerates aliasing).
NaN is the one exception to bit-exactness: CUDA writes the hardware's canonical NaN (FP8
``0x7F`` whatever the sign), the host keeps the sign.

Conventions (the C++ headers in ``csrc/kernels`` give the details):

- FP8 encoding rounds to nearest even and saturates to the format's finite maximum (448 for
  e4m3fn, 57344 for e5m2); NaN stays NaN.
- ``q = fp8(x * scale)`` and ``x ~= float(q) * scale_inv`` with ``scale_inv = 1 / scale``.

One file: every function is a thin wrapper over one kernel of ``overlap._C.kernels`` with the
same conventions and the same private argument helpers; together they are that module's one
Python face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from overlap._native import native
from overlap.dtypes import BLOCK_EDGE, MX_BLOCK, ScalingMode
from overlap.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

__all__ = [
    "BlockScaledFP8",
    "ScalingMode",  # overlap.dtypes's, re-exported
    "amax",
    "cast_to_fp8",
    "cast_transpose",
    "compute_scale",
    "dequantize",
    "quantize_block_1x128",
    "quantize_block_128x128",
    "quantize_mxfp8",
    "reduce_partials",
    "transpose_fp8",
]

_BLOCK = BLOCK_EDGE
_MX_BLOCK = MX_BLOCK


class BlockScaledFP8(NamedTuple):
    """Data and scales of a block-scaled quantization; a direction not produced is None.

    For 1x128 and 128x128 the columnwise data is the transpose ``[cols, rows]`` of the input;
    for MXFP8 it keeps the input's layout ``[rows, cols]`` (only the blocks run down the
    columns). Block scales are float32 ``scale_inv``; MXFP8 scales are uint8 E8M0 bytes
    (``scale = 2 ** (byte - 127)``; the data is dequantized by multiplying with it).
    """

    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None


def _stream_of(t: torch.Tensor) -> int:
    """The handle of the current stream of ``t``'s CUDA device (0 for a CPU tensor).

    On the launch path of every op: ``torch._C._cuda_getCurrentRawStream`` returns the handle
    as an int without building a ``torch.cuda.Stream`` object (what
    ``torch.cuda.current_stream(device).cuda_stream`` does, the fallback where the private
    function is missing).
    """
    if not t.is_cuda:
        return 0
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _require_tensor(op: str, name: str, t: object) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(
            f"{op} expects {name} to be a torch.Tensor, got {type(t).__name__}"
        )


def _fp8_dtype(
    op: str, fp8_dtype: torch.dtype | None, *tensors: torch.Tensor | None
) -> torch.dtype:
    """The FP8 format: the one given, else the FP8 dtype of the given data tensors, else
    e4m3fn. Raw uint8 data without an explicit format is refused: guessing e4m3fn there
    would silently misread e5m2 bytes."""
    import torch

    if fp8_dtype is not None:
        return fp8_dtype
    for t in tensors:
        if t is not None and t.dtype == torch.uint8:
            raise InvalidArgumentError(
                f"{op}: FP8 data given as raw uint8 bytes {list(t.shape)}; pass "
                "fp8_dtype=torch.float8_e4m3fn or torch.float8_e5m2 to say which format they hold"
            )
    for t in tensors:
        if t is not None and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return t.dtype
    return torch.float8_e4m3fn


def _scalar_f32(device: torch.device) -> torch.Tensor:
    import torch

    return torch.empty(1, dtype=torch.float32, device=device)


def amax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Largest absolute value of ``x``; NaN if ``x`` holds a NaN.

    Args:
        x: contiguous tensor of any shape; float32, float16 or bfloat16; cpu or cuda.
        out: optional float32 tensor of one element on ``x``'s device, written in place.

    Returns:
        A float32 tensor of shape ``[1]`` (``out`` when given). On cuda the kernel runs on the
        current stream without synchronising the host. The cross-rank reduction for sequence
        parallelism is the caller's (docs/design.md §3, invariant 3).
    """
    import torch

    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError(f"amax expects a torch.Tensor, got {type(x).__name__}")
    if out is None:
        out = torch.empty(1, dtype=torch.float32, device=x.device)
    native().kernels.amax(x, out, stream=_stream_of(x))
    return out


def compute_scale(
    amax: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    margin: int = 0,
    power_of_2: bool = False,
    epsilon: float = 0.0,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 scale from an amax: ``scale = (fp8_max / amax) / 2**margin``.

    ``amax < epsilon`` counts as ``epsilon``; amax 0 gives scale 1; a non-finite amax (the
    tensor held inf or NaN) gives scale 1. The scale is clamped to the normal float32 range
    so that it and ``scale_inv`` stay finite; ``power_of_2`` rounds it down to a power of two
    (``scale_inv`` is then exact).

    Args:
        amax: contiguous float32 tensor of n elements (typically ``[1]``), cpu or cuda.
        fp8_dtype: ``torch.float8_e4m3fn`` (max 448, the default) or ``torch.float8_e5m2``
            (max 57344).
        margin: headroom in powers of two, 0..127.
        power_of_2: round the scale down to a power of two.
        epsilon: lower bound on amax, finite and >= 0.
        out: optional ``(scale, scale_inv)`` float32 tensors of n elements, written in place.

    Returns:
        ``(scale, scale_inv)``, float32, n elements each, ``scale_inv = 1 / scale``.
    """
    _require_tensor("compute_scale", "amax", amax)
    if out is None:
        import torch

        out = (
            torch.empty_like(amax, dtype=torch.float32),
            torch.empty_like(amax, dtype=torch.float32),
        )
    scale, scale_inv = out
    native().kernels.compute_scale(
        amax,
        scale,
        scale_inv,
        fp8_dtype=_fp8_dtype("compute_scale", fp8_dtype),
        margin=margin,
        power_of_2=power_of_2,
        epsilon=epsilon,
        stream=_stream_of(amax),
    )
    return scale, scale_inv


def cast_to_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 cast: ``out = fp8(x * scale)``, with ``scale_inv = 1 / scale``.

    Args:
        x: contiguous float32, float16 or bfloat16 tensor of any shape, cpu or cuda.
        scale: float32 tensor of one element.
        fp8_dtype: the FP8 format; defaults to ``out``'s FP8 dtype, else e4m3fn.
        out: optional output of ``x``'s shape, ``fp8_dtype`` or uint8 (raw FP8 bytes).
        scale_inv: optional float32 ``[1]`` output for ``1 / scale``.
        amax: optional float32 ``[1]`` output, overwritten with ``max |x|`` of the unscaled
            input (NaN propagates): the amax the next scale is computed from.

    Returns:
        ``(out, scale_inv)``.
    """
    _require_tensor("cast_to_fp8", "x", x)
    fmt = _fp8_dtype("cast_to_fp8", fp8_dtype, out)
    if out is None:
        import torch

        out = torch.empty(x.shape, dtype=fmt, device=x.device)
    if scale_inv is None:
        scale_inv = _scalar_f32(x.device)
    native().kernels.cast_to_fp8(
        x, scale, out, scale_inv, fp8_dtype=fmt, amax=amax, stream=_stream_of(x)
    )
    return out, scale_inv


def cast_transpose(
    x: torch.Tensor,
    scale: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    rowwise: bool = True,
    out: torch.Tensor | None = None,
    out_t: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 cast into rowwise ``[rows, cols]`` and columnwise ``[cols, rows]`` data.

    The columnwise data is the exact transpose of the rowwise data (same scale), the layout
    Hopper FP8 GEMMs need for dgrad/wgrad operands.

    Args:
        x: contiguous 2-D ``[rows, cols]`` float32, float16 or bfloat16, cpu or cuda.
        scale: float32 tensor of one element.
        fp8_dtype: the FP8 format; defaults to an output's FP8 dtype, else e4m3fn.
        rowwise: also produce the rowwise data (False: columnwise only; ``out`` must be None).
        out: optional rowwise output ``[rows, cols]``, ``fp8_dtype`` or uint8.
        out_t: optional columnwise output ``[cols, rows]``, ``fp8_dtype`` or uint8.
        scale_inv: optional float32 ``[1]`` output for ``1 / scale``.
        amax: optional float32 ``[1]`` output for ``max |x|`` (see :func:`cast_to_fp8`).

    Returns:
        ``(out or None, out_t, scale_inv)``.
    """
    _require_tensor("cast_transpose", "x", x)
    if not rowwise and out is not None:
        raise InvalidArgumentError("cast_transpose: out was given but rowwise=False")
    if x.dim() != 2:
        raise InvalidArgumentError(
            f"cast_transpose: x must be 2-D [rows, cols], got shape {list(x.shape)}"
        )
    fmt = _fp8_dtype("cast_transpose", fp8_dtype, out, out_t)
    import torch

    rows, cols = x.shape
    if rowwise and out is None:
        out = torch.empty((rows, cols), dtype=fmt, device=x.device)
    if out_t is None:
        out_t = torch.empty((cols, rows), dtype=fmt, device=x.device)
    if scale_inv is None:
        scale_inv = _scalar_f32(x.device)
    native().kernels.cast_transpose(
        x, scale, out, out_t, scale_inv, fp8_dtype=fmt, amax=amax, stream=_stream_of(x)
    )
    return out, out_t, scale_inv


def transpose_fp8(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The transpose of FP8 data: ``out [cols, rows] = x [rows, cols]^T``, bytes unchanged.

    What a weight gradient needs from FP8 data that was gathered rowwise (Hopper's FP8 GEMMs
    take both operands K-major): one pass through shared-memory tiles with 16-byte accesses,
    several times faster than ``x.t().contiguous()`` on GPUs (NOTE [fp8 transpose] in
    csrc/kernels/transpose.h). The scale_inv is the input's (a transpose moves no values).

    Args:
        x: contiguous 2-D ``[rows, cols]`` of ``float8_e4m3fn``, ``float8_e5m2`` or ``uint8``
            (FP8 carried as bytes), cpu or cuda.
        out: optional ``[cols, rows]`` output of x's dtype and device, not overlapping x.

    Returns:
        ``out`` (new when not given), on x's current CUDA stream.

    Raises:
        InvalidArgumentError: another dtype, not 2-D, not contiguous, a wrong ``out``.
    """
    _require_tensor("transpose_fp8", "x", x)
    if out is None:
        if x.dim() != 2:
            raise InvalidArgumentError(
                f"transpose_fp8: x must be 2-D [rows, cols], got shape {list(x.shape)}"
            )
        out = x.new_empty((x.shape[1], x.shape[0]))
    else:
        _require_tensor("transpose_fp8", "out", out)
    native().kernels.transpose_fp8(x, out, stream=_stream_of(x))
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _alloc_blocks(
    x: torch.Tensor,
    fmt: torch.dtype,
    *,
    rowwise: bool,
    columnwise: bool,
    shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]],
    scale_dtype: torch.dtype,
) -> BlockScaledFP8:
    import torch

    row_data, row_scale, col_data, col_scale = shapes

    def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=x.device)

    return BlockScaledFP8(
        empty(row_data, fmt) if rowwise else None,
        empty(row_scale, scale_dtype) if rowwise else None,
        empty(col_data, fmt) if columnwise else None,
        empty(col_scale, scale_dtype) if columnwise else None,
    )


def _quantize_block(
    op: str,
    x: torch.Tensor,
    *,
    two_d: bool,
    fp8_dtype: torch.dtype | None,
    rowwise: bool,
    columnwise: bool,
    power_of_2: bool,
    epsilon: float,
    out: BlockScaledFP8 | None,
) -> BlockScaledFP8:
    import torch

    _require_tensor(op, "x", x)
    if out is None:
        if x.dim() != 2:
            raise InvalidArgumentError(
                f"{op}: x must be 2-D [rows, cols], got shape {list(x.shape)}"
            )
        rows, cols = x.shape
        br = _BLOCK if two_d else 1
        shapes = (
            (rows, cols),
            (_ceil_div(rows, br), _ceil_div(cols, _BLOCK)),
            (cols, rows),
            (_ceil_div(cols, br), _ceil_div(rows, _BLOCK)),
        )
        fmt = _fp8_dtype(op, fp8_dtype)
        out = _alloc_blocks(
            x, fmt, rowwise=rowwise, columnwise=columnwise, shapes=shapes, scale_dtype=torch.float32
        )
    else:
        fmt = _fp8_dtype(op, fp8_dtype, out.rowwise_data, out.columnwise_data)
    kernel = (
        native().kernels.quantize_block_128x128 if two_d else native().kernels.quantize_block_1x128
    )
    kernel(
        x,
        rowwise_data=out.rowwise_data,
        rowwise_scale_inv=out.rowwise_scale_inv,
        columnwise_data=out.columnwise_data,
        columnwise_scale_inv=out.columnwise_scale_inv,
        fp8_dtype=fmt,
        power_of_2=power_of_2,
        epsilon=epsilon,
        stream=_stream_of(x),
    )
    return out


def quantize_block_1x128(
    x: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
    power_of_2: bool = False,
    epsilon: float = 0.0,
    out: BlockScaledFP8 | None = None,
) -> BlockScaledFP8:
    """1x128 block-scaled FP8 (activations and gradients, DeepSeek-V3 style).

    Each run of 128 consecutive elements of a row gets ``scale = fp8_max / max(amax,
    epsilon)`` (amax 0 or non-finite: 1; ``power_of_2`` rounds it down to a power of two) and
    stores ``scale_inv = 1 / scale``. ``cols`` need not be a multiple of 128: the last block
    of a row is partial.

    Args:
        x: contiguous 2-D ``[rows, cols]`` float32, float16 or bfloat16, cpu or cuda.
        fp8_dtype: the FP8 format; defaults to an output's FP8 dtype, else e4m3fn.
        rowwise: produce rowwise data ``[rows, cols]`` and scale_inv ``[rows, ceil(cols/128)]``.
        columnwise: produce columnwise data ``[cols, rows]`` (the transpose, quantized with
            1x128 blocks running down x's columns) and scale_inv ``[cols, ceil(rows/128)]``.
        power_of_2: power-of-two scales.
        epsilon: lower bound on each block's amax, finite and >= 0.
        out: optional preallocated outputs (FP8 or uint8 data, float32 scales); the
            directions given in it are produced and ``rowwise``/``columnwise`` are ignored.

    Returns:
        A :class:`BlockScaledFP8` (``out`` when given).
    """
    return _quantize_block(
        "quantize_block_1x128",
        x,
        two_d=False,
        fp8_dtype=fp8_dtype,
        rowwise=rowwise,
        columnwise=columnwise,
        power_of_2=power_of_2,
        epsilon=epsilon,
        out=out,
    )


def quantize_block_128x128(
    x: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
    power_of_2: bool = False,
    epsilon: float = 0.0,
    out: BlockScaledFP8 | None = None,
) -> BlockScaledFP8:
    """128x128 block-scaled FP8 (weights): one scale per 128x128 tile.

    Scales as in :func:`quantize_block_1x128`; partial tiles at the bottom and right edges.

    Args:
        x: contiguous 2-D ``[rows, cols]`` float32, float16 or bfloat16, cpu or cuda.
        fp8_dtype: the FP8 format; defaults to an output's FP8 dtype, else e4m3fn.
        rowwise: produce rowwise data ``[rows, cols]`` and scale_inv
            ``[ceil(rows/128), ceil(cols/128)]``.
        columnwise: produce columnwise data ``[cols, rows]`` (the transpose) and scale_inv
            ``[ceil(cols/128), ceil(rows/128)]``: the same tiles, so the rowwise scales
            transposed.
        power_of_2: power-of-two scales.
        epsilon: lower bound on each tile's amax, finite and >= 0.
        out: optional preallocated outputs (see :func:`quantize_block_1x128`).

    Returns:
        A :class:`BlockScaledFP8` (``out`` when given).
    """
    return _quantize_block(
        "quantize_block_128x128",
        x,
        two_d=True,
        fp8_dtype=fp8_dtype,
        rowwise=rowwise,
        columnwise=columnwise,
        power_of_2=power_of_2,
        epsilon=epsilon,
        out=out,
    )


def quantize_mxfp8(
    x: torch.Tensor,
    *,
    fp8_dtype: torch.dtype | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
    out: BlockScaledFP8 | None = None,
) -> BlockScaledFP8:
    """MXFP8 (OCP MX v1.0): blocks of 32 elements sharing one E8M0 power-of-two scale.

    A block's exponent byte is ``clamp(floor(log2(amax)) - emax, -127, 127) + 127`` with
    ``emax`` 8 for e4m3fn and 15 for e5m2; elements are ``fp8(x / 2**(byte - 127))``,
    saturating. amax 0 gives byte 0; a NaN in a block gives byte 0xFF (NaN) and NaN elements.

    Args:
        x: contiguous 2-D ``[rows, cols]`` float32, float16 or bfloat16, cpu or cuda.
        fp8_dtype: the FP8 format; defaults to an output's FP8 dtype, else e4m3fn.
        rowwise: produce data ``[rows, cols]`` with 1x32 blocks and scales ``[rows, cols/32]``
            (cols must be a multiple of 32).
        columnwise: produce data ``[rows, cols]`` (not transposed) with 32x1 blocks running
            down the columns and scales ``[rows/32, cols]`` (rows must be a multiple of 32).
        out: optional preallocated outputs: FP8 or uint8 data, uint8 (or
            ``torch.float8_e8m0fnu``) scales; its directions are the ones produced.

    Returns:
        A :class:`BlockScaledFP8` whose scales are uint8 E8M0 bytes (``out`` when given).
    """
    import torch

    _require_tensor("quantize_mxfp8", "x", x)
    if out is None:
        if x.dim() != 2:
            raise InvalidArgumentError(
                f"quantize_mxfp8: x must be 2-D [rows, cols], got shape {list(x.shape)}"
            )
        rows, cols = x.shape
        # Shapes of ragged inputs are rounded here only so that the core's check, which says
        # what to do, is the one that fires.
        shapes = (
            (rows, cols),
            (rows, cols // _MX_BLOCK),
            (rows, cols),
            (rows // _MX_BLOCK, cols),
        )
        fmt = _fp8_dtype("quantize_mxfp8", fp8_dtype)
        out = _alloc_blocks(
            x, fmt, rowwise=rowwise, columnwise=columnwise, shapes=shapes, scale_dtype=torch.uint8
        )
    else:
        fmt = _fp8_dtype("quantize_mxfp8", fp8_dtype, out.rowwise_data, out.columnwise_data)
    native().kernels.quantize_mxfp8(
        x,
        rowwise_data=out.rowwise_data,
        rowwise_scale_inv=out.rowwise_scale_inv,
        columnwise_data=out.columnwise_data,
        columnwise_scale_inv=out.columnwise_scale_inv,
        fp8_dtype=fmt,
        stream=_stream_of(x),
    )
    return out


def dequantize(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    *,
    mode: ScalingMode = ScalingMode.TENSOR,
    fp8_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 data back to float: ``out = float(data) * scale_inv`` of its tensor or block.

    Args:
        data: FP8 (or uint8 carrying ``fp8_dtype`` bytes) tensor, contiguous, cpu or cuda. Any
            shape for ``ScalingMode.TENSOR``; 2-D for the block modes. Columnwise 1x128 /
            128x128 data (``[cols, rows]``) dequantizes to the transpose of the original.
        scale_inv: float32 ``[1]`` (TENSOR); float32 per block (BLOCK_*), shaped as the
            quantizer produced it; uint8 / ``float8_e8m0fnu`` E8M0 bytes (MXFP8_*).
        mode: the scaling the data was quantized with.
        fp8_dtype: the FP8 format; defaults to ``data``'s FP8 dtype, else e4m3fn.
        out_dtype: float32 (default), bfloat16 or float16; ignored when ``out`` is given.
        out: optional output of ``data``'s shape.

    Returns:
        ``out``, computed in float32 and rounded once to its dtype.
    """
    import torch

    _require_tensor("dequantize", "data", data)
    _require_tensor("dequantize", "scale_inv", scale_inv)
    if not isinstance(mode, ScalingMode):
        raise InvalidArgumentError(f"dequantize: mode must be a ScalingMode, got {mode!r}")
    fmt = _fp8_dtype("dequantize", fp8_dtype, data)
    if out is None:
        out = torch.empty(data.shape, dtype=out_dtype or torch.float32, device=data.device)
    block = mode.block_shape
    if block is None:
        native().kernels.dequantize(data, scale_inv, out, fp8_dtype=fmt, stream=_stream_of(data))
    else:
        native().kernels.dequantize_blocks(
            data,
            scale_inv,
            out,
            fp8_dtype=fmt,
            block_rows=block[0],
            block_cols=block[1],
            stream=_stream_of(data),
        )
    return out


def reduce_partials(
    partials: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
    amax: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum of k stacked partial buffers in float32, rounded once to the output format.

    Element j is ``((p[0][j] + p[1][j]) + p[2][j]) + ...`` in float32, in that order (the
    CUDA kernel matches it bit for bit): the reduction step of a reduce-scatter.

    Args:
        partials: contiguous ``[k, ...]`` float32, bfloat16 or float16 (k >= 1), cpu or cuda
            (on cuda k <= 64).
        out_dtype: the output format: float32, bfloat16, float16, float8_e4m3fn or
            float8_e5m2. Defaults to ``out``'s dtype (required when ``out`` is uint8 raw FP8
            bytes), else ``partials``' dtype.
        scale: float32 ``[1]``; required for FP8 output, ``out = fp8(sum * scale)``.
        scale_inv: optional float32 ``[1]`` output for ``1 / scale`` (FP8 output only).
        amax: optional float32 ``[1]`` output for ``max |sum|`` of the unscaled sum.
        out: optional output of shape ``partials.shape[1:]``.

    Returns:
        ``out``.
    """
    import torch

    _require_tensor("reduce_partials", "partials", partials)
    if out_dtype is None:
        if out is not None and out.dtype == torch.uint8:
            raise InvalidArgumentError(
                "reduce_partials: out is uint8 (raw FP8 bytes); pass out_dtype=torch.float8_e4m3fn "
                "or torch.float8_e5m2 to say which format"
            )
        out_dtype = out.dtype if out is not None else partials.dtype
    if out is None:
        out = torch.empty(partials.shape[1:], dtype=out_dtype, device=partials.device)
    native().kernels.reduce_partials(
        partials,
        out,
        out_format=out_dtype,
        scale=scale,
        scale_inv=scale_inv,
        amax=amax,
        stream=_stream_of(partials),
    )
    return out

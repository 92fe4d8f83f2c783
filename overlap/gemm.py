"""Row-major GEMM over cuBLASLt (CUDA tensors) with a float64 host reference (CPU tensors).

:func:`gemm` computes, for ``op(X) = X.T if trans else X``::

    v = alpha * op(a) @ op(b) + beta * out[rows] + bias       # rows = row_offset .. row_offset+m
    v = gelu_tanh(v)                                           # when gelu=True
    out[rows] = v              (float32 / bfloat16 / float16 outputs, rounded to nearest even)
    out[rows] = fp8(v * out_scale), out_amax = max |v|        (FP8 outputs)

with ``op(a)`` of shape ``[m, k]`` and ``op(b)`` of shape ``[k, n]``. A linear layer's forward
``y = x @ w.T`` is ``gemm(x, w, transb=True)``. GELU is the tanh approximation, which is what
cuBLASLt's epilogue computes (``torch.nn.functional.gelu(v, approximate="tanh")``).

Inputs are both bfloat16, both float16, both float32, or both FP8 (``float8_e4m3fn`` /
``float8_e5m2``, not e5m2 x e5m2). FP8 operands carry a float32 ``scale_inv`` (the data is
``float(q) * scale_inv``) with a :class:`~overlap.quantization.ScalingMode`:

- ``TENSOR`` (the default for FP8): one element;
- ``BLOCK_1X128``: ``[rows, ceil(cols / 128)]`` for data stored ``[rows, cols]``
  (activations and gradients, as :func:`~overlap.quantization.quantize_block_1x128` writes);
- ``BLOCK_128X128``: ``[ceil(rows / 128), ceil(cols / 128)]`` (weights).

Block scaling needs both operands block-scaled (not both 128x128), K-contiguous
(``transa=False, transb=True``), the split accumulator, and a bfloat16/float32 output; it runs
on Hopper only. MXFP8 operands are refused with
:class:`~overlap.errors.UnsupportedHardwareError`: dequantize them and run a BF16 GEMM. On
Hopper (sm_90) every FP8 GEMM needs K-contiguous operands (pass the columnwise data).

Every pointer must be 16-byte aligned and every row stride a multiple of 16 bytes; FP8 needs
K a multiple of 16. Violations raise :class:`~overlap.errors.InvalidArgumentError` before any
GPU work, naming the argument; calls that are valid but have no kernel raise
:class:`~overlap.errors.UnsupportedHardwareError`. The C++ header ``csrc/gemm/gemm.h`` has
the full rules. CUDA calls are enqueued on ``stream`` (default: the current stream) without
synchronising the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError
from overlap.quantization import ScalingMode

if TYPE_CHECKING:
    import torch

__all__ = ["clear_gemm_cache", "gemm", "gemm_cache_stats", "release_gemm_resources"]


def _is_fp8(dtype: torch.dtype) -> bool:
    import torch

    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _scaling_name(t: torch.Tensor, mode: ScalingMode | None, name: str) -> str:
    if mode is None:
        return ScalingMode.TENSOR.value if _is_fp8(t.dtype) else "none"
    if not isinstance(mode, ScalingMode):
        raise InvalidArgumentError(
            f"gemm: {name} must be an overlap.quantization.ScalingMode, got {mode!r}"
        )
    return mode.value


def _stream_handle(stream: object, a: torch.Tensor) -> int:
    import torch

    if not a.is_cuda:
        return 0
    if stream is None:
        return torch.cuda.current_stream(a.device).cuda_stream
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    if isinstance(stream, int):
        return stream
    raise InvalidArgumentError(
        f"gemm: stream must be a torch.cuda.Stream, a raw handle (int) or None, "
        f"got {type(stream).__name__}"
    )


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    transa: bool = False,
    transb: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    row_offset: int = 0,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    a_scaling: ScalingMode | None = None,
    b_scaling: ScalingMode | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    sm_count: int = 0,
    stream: torch.cuda.Stream | int | None = None,
) -> torch.Tensor:
    """``out[row_offset:row_offset+m] = epilogue(alpha op(a) @ op(b) + beta out + bias)``.

    Args:
        a: 2-D ``[m, k]`` (or ``[k, m]`` with ``transa``), unit column stride (row slices of
            larger buffers are fine); cpu or cuda.
        b: 2-D ``[k, n]`` (or ``[n, k]`` with ``transb``); same device and kind of dtype as a.
        transa, transb: use the transpose of the stored matrix.
        out: 2-D ``[rows, n]`` buffer with unit column stride; rows
            ``row_offset .. row_offset + m`` are written, the others are left untouched.
            Allocated as ``[m, n]`` when None.
        out_dtype: dtype of an allocated out: defaults to a's dtype (bfloat16 for FP8
            inputs). Must match ``out.dtype`` when both are given.
        row_offset: first row of out written.
        alpha: scale of the product.
        beta: ``!= 0`` accumulates into out (e.g. wgrad into a float32 main_grad with
            ``beta=1``); needs out; not for FP8 outputs.
        bias: ``[n]``: out's dtype for bf16/fp16/fp32 inputs; bfloat16 for FP8 inputs (float16
            when out is float16, either for FP8 outputs).
        gelu: apply tanh-approximated GELU after the bias.
        a_scale_inv, b_scale_inv: float32 scales of FP8 operands (layouts above).
        a_scaling, b_scaling: :class:`~overlap.quantization.ScalingMode` of FP8 operands;
            ``TENSOR`` by default.
        out_scale: float32 ``[1]``, required for FP8 outputs: stored values are
            ``fp8(v * out_scale)``.
        out_amax: float32 ``[1]``, FP8 outputs only: receives ``max |v|`` (before out_scale).
        fast_accum: FP8 per-tensor only: skip the periodic float32 promotion of the tensor-core
            accumulator (faster, less accurate). Default: on for per-tensor FP8, off otherwise
            (block scaling requires it off).
        sm_count: CUDA only: the number of SMs the GEMM plans for, leaving the rest to
            concurrent communication kernels (0 = all).
        stream: CUDA stream (``torch.cuda.Stream`` or raw handle); default: a's current
            stream.

    Returns:
        The ``m`` rows of out that were written (a view of out).
    """
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise InvalidArgumentError(f"gemm: {name} must be a 2-D torch.Tensor, got {t!r:.80}")
    m = a.shape[1] if transa else a.shape[0]
    n = b.shape[0] if transb else b.shape[1]
    if out is None:
        if beta != 0.0 or row_offset != 0:
            raise InvalidArgumentError(
                f"gemm: beta={beta} / row_offset={row_offset} refer to an existing output; "
                "pass out="
            )
        if out_dtype is None:
            out_dtype = torch.bfloat16 if _is_fp8(a.dtype) else a.dtype
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    elif out_dtype is not None and out_dtype != out.dtype:
        raise InvalidArgumentError(
            f"gemm: out_dtype={out_dtype} but out is {out.dtype}; pass one of them"
        )
    a_mode = _scaling_name(a, a_scaling, "a_scaling")
    b_mode = _scaling_name(b, b_scaling, "b_scaling")
    if fast_accum is None:
        fast_accum = a_mode == ScalingMode.TENSOR.value and b_mode == ScalingMode.TENSOR.value
    native().gemm.gemm(
        a,
        b,
        out,
        transa=transa,
        transb=transb,
        a_scale_inv=a_scale_inv,
        b_scale_inv=b_scale_inv,
        a_scaling=a_mode,
        b_scaling=b_mode,
        alpha=alpha,
        beta=beta,
        bias=bias,
        gelu=gelu,
        out_scale=out_scale,
        out_amax=out_amax,
        fast_accum=fast_accum,
        sm_count=sm_count,
        row_offset=row_offset,
        stream=_stream_handle(stream, a),
    )
    return out[row_offset : row_offset + m]


def gemm_cache_stats(device: int | torch.device = 0) -> dict[str, int]:
    """Counters of the cuBLASLt heuristics cache of a device: ``hits``, ``misses``,
    ``entries`` (all 0 before the device's first GEMM)."""
    index = device if isinstance(device, int) else (device.index or 0)
    return dict(native().gemm.cache_stats(index))


def clear_gemm_cache() -> None:
    """Forget every cached cuBLASLt algorithm (and reset the counters)."""
    native().gemm.clear_cache()


def release_gemm_resources() -> None:
    """Synchronise each device used for GEMMs and release its cuBLASLt handle, workspace
    pool and cache. Idempotent; the next GEMM recreates them."""
    native().gemm.release_resources()

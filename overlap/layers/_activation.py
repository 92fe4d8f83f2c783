"""The fused SwiGLU of :class:`~overlap.layers.LayerNormMLP` as ``torch.library`` custom ops.

NOTE [fused swiglu] (``csrc/kernels/activation.h``): ``silu(gate) * up`` on the two halves of
fc1's output ``h`` costs, in PyTorch, two elementwise kernels forward and two or three backward
on strided views (not vectorized), plus a ``cat`` of the two gradients. The core's kernels read
``h`` once and write the activation once, and in backward write ``dh`` whole. On CPU tensors
they run the core's host reference, the path the layers' tests take.

``overlap::swiglu`` and ``overlap::swiglu_backward`` have fake (meta) implementations and
``overlap::swiglu`` an autograd formula, so ``torch.compile(fullgraph=True)`` traces a
:class:`~overlap.layers.LayerNormMLP` through them (NOTE [layer custom ops] in ``_ops.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from overlap._native import native
from overlap.errors import InvalidArgumentError
from overlap.quantization.ops import _stream_of

__all__ = ["swiglu", "swiglu_backward"]


def _matrix(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` ``[..., k]`` as the 2-D ``[rows, k]`` the core takes: a view, never a copy."""
    if t.dim() == 0:
        raise InvalidArgumentError(f"{op}: {name} must have at least one dimension, got a scalar")
    if not t.is_contiguous():
        raise InvalidArgumentError(
            f"{op}: {name} must be contiguous, got {t.dtype} {list(t.shape)} with strides "
            f"{list(t.stride())}; call .contiguous()"
        )
    return t.view(math.prod(t.shape[:-1]), t.shape[-1])


@torch.library.custom_op("overlap::swiglu", mutates_args=())
def swiglu(h: torch.Tensor) -> torch.Tensor:
    """``silu(h[..., :F]) * h[..., F:]`` for ``h`` ``[..., 2F]``: the gate columns, then the up
    columns (LayerNormMLP's fc1 output).

    Args:
        h: contiguous ``[..., 2F]`` float32, float16 or bfloat16, on the CPU or a GPU.

    Returns:
        A new ``[..., F]`` tensor of ``h``'s dtype and device (computed in float32).

    Raises:
        InvalidArgumentError: ``h`` is not contiguous, has an odd last dimension or another
            dtype.
    """
    h2 = _matrix("swiglu", "h", h)
    rows, cols = h2.shape[0], h2.shape[1] // 2
    out = h.new_empty((*h.shape[:-1], cols))
    native().kernels.swiglu_forward(h2, out.view(rows, cols), stream=_stream_of(h))
    return out


@swiglu.register_fake
def _(h):
    return h.new_empty((*h.shape[:-1], h.shape[-1] // 2))


@torch.library.custom_op("overlap::swiglu_backward", mutates_args=())
def swiglu_backward(da: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The gradient ``dh`` ``[..., 2F]`` (``[d gate | d up]``) of :func:`swiglu` at ``h``.

    Args:
        da: the output gradient, contiguous ``[..., F]`` of ``h``'s dtype and device.
        h: :func:`swiglu`'s input ``[..., 2F]``.

    Returns:
        A new tensor shaped like ``h`` (computed in float32).

    Raises:
        InvalidArgumentError: a tensor is not contiguous, or the shapes, dtypes or devices do
            not match.
    """
    h2 = _matrix("swiglu_backward", "h", h)
    da2 = _matrix("swiglu_backward", "da", da)
    dh = torch.empty_like(h)
    native().kernels.swiglu_backward(da2, h2, dh.view(h2.shape), stream=_stream_of(h))
    return dh


@swiglu_backward.register_fake
def _(da, h):
    return torch.empty_like(h)


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    (h,) = inputs
    ctx.save_for_backward(h)


def _backward(ctx: Any, da: torch.Tensor) -> torch.Tensor:
    (h,) = ctx.saved_tensors
    # The gradient from fc2's backward is a fresh GEMM output; contiguous() keeps any other
    # caller (a strided gradient) on the kernel's contract without a copy in the usual case.
    return swiglu_backward(da.contiguous(), h)


swiglu.register_autograd(_backward, setup_context=_setup_context)

"""Thin torch wrappers over the core's quantization kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

__all__ = ["amax"]


def _stream_of(t: torch.Tensor) -> int:
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def amax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Largest absolute value of ``x``; NaN if ``x`` holds a NaN.

    Args:
        x: contiguous tensor of any shape; float32, float16 or bfloat16; cpu or cuda.
        out: optional float32 tensor of one element on ``x``'s device, written in place.

    Returns:
        A float32 tensor of shape ``[1]`` (``out`` when given). On cuda the kernel runs on the
        current stream without synchronising the host. The cross-rank reduction for sequence
        parallelism is the caller's (DESIGN.md invariant 3).
    """
    import torch

    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError(f"amax expects a torch.Tensor, got {type(x).__name__}")
    if out is None:
        out = torch.empty(1, dtype=torch.float32, device=x.device)
    native().kernels.amax(x, out, stream=_stream_of(x))
    return out

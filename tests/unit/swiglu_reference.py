"""float64 PyTorch references and tolerances for the fused SwiGLU's tests (test_activation.py
on the CPU, test_activation_gpu.py on CUDA)."""

from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Within one unit in the last place of the dtype (the float32 math is ~1e-7 relative), plus an
# absolute floor for results that cancel (dg is 0 where 1 + g * (1 - sigmoid(g)) is).
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.float16: {"rtol": 1e-3, "atol": 1e-5},
    torch.bfloat16: {"rtol": 8e-3, "atol": 1e-5},
}


def ids(v: object) -> str:
    """Test ids: "bfloat16", "7x13"."""
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def random_h(rows: int, cols: int, dtype: torch.dtype, *, seed: int = 0) -> torch.Tensor:
    """h [rows, 2 * cols]: gates spread over the sigmoid's whole range, ups of either sign."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 2 * cols, generator=gen) * 4).to(dtype)


def reference(
    h: torch.Tensor, da: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 PyTorch: ``a``, and with ``da`` the gradient ``dh`` (autograd through chunk)."""
    x = h.double().requires_grad_(da is not None)
    gate, up = x.chunk(2, dim=-1)
    a = torch.nn.functional.silu(gate) * up
    if da is None:
        return a.detach(), None
    a.backward(da.double())
    return a.detach(), x.grad


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype])

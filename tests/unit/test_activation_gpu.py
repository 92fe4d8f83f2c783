"""The fused SwiGLU's CUDA kernels against float64 PyTorch, the host reference and torch's
unfused formula, on the vector path (cols a multiple of the 16-byte vector, aligned pointers)
and the scalar path (odd cols, or data pointers one element into their storage).

The kernels and the host reference are not bit-exact against each other (NOTE [fused swiglu]
in csrc/kernels/activation.h: exp is not correctly rounded on either side), so each is held to
the float64 result within one unit in the last place of its dtype.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap._native import native  # noqa: E402
from overlap.errors import InvalidArgumentError  # noqa: E402
from overlap.layers._activation import swiglu, swiglu_backward  # noqa: E402
from tests.unit.swiglu_reference import (  # noqa: E402
    DTYPES,
    assert_close,
    ids,
    random_h,
    reference,
)

pytestmark = pytest.mark.gpu

# (rows, cols): odd cols and a lone row (scalar path), whole vectors of every dtype (8 | cols),
# and shapes big enough for every thread of the grid to take several grid-stride steps.
SHAPES = [(1, 1), (7, 13), (3, 8), (1, 4), (64, 1000), (257, 1024), (4096, 1536)]
OFFSETS = [0, 1]  # element offset of every tensor's data pointer (1: the scalar path)


def _gpu(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """A contiguous CUDA copy of t whose data pointer is `offset` elements into its storage."""
    base = torch.empty(t.numel() + offset, dtype=t.dtype, device="cuda")
    out = base[offset:].view(t.shape)
    out.copy_(t)
    return out


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype, offset: int) -> torch.Tensor:
    return _gpu(torch.full(shape, float("nan"), dtype=dtype), offset)


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_forward(dtype: torch.dtype, shape: tuple[int, int], offset: int) -> None:
    rows, cols = shape
    h = random_h(rows, cols, dtype)
    out = _poisoned((rows, cols), dtype, offset)
    native().kernels.swiglu_forward(
        _gpu(h, offset), out, stream=torch.cuda.current_stream().cuda_stream
    )
    want, _ = reference(h)
    assert_close(out.cpu(), want, dtype)
    assert_close(out.cpu(), swiglu(h).double(), dtype)  # the host reference
    gate, up = _gpu(h).chunk(2, dim=-1)
    torch.testing.assert_close(
        out.float(), (torch.nn.functional.silu(gate) * up).float(), rtol=1.6e-2, atol=1e-5
    )


@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_backward(dtype: torch.dtype, shape: tuple[int, int], offset: int) -> None:
    rows, cols = shape
    h = random_h(rows, cols, dtype)
    da = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)).to(dtype)
    dh = _poisoned((rows, 2 * cols), dtype, offset)
    native().kernels.swiglu_backward(
        _gpu(da, offset), _gpu(h, offset), dh, stream=torch.cuda.current_stream().cuda_stream
    )
    _, want = reference(h, da)
    assert_close(dh.cpu(), want, dtype)
    assert_close(dh.cpu(), swiglu_backward(da, h).double(), dtype)  # the host reference
    x = _gpu(h).requires_grad_()
    gate, up = x.chunk(2, dim=-1)
    (torch.nn.functional.silu(gate) * up).backward(_gpu(da))
    torch.testing.assert_close(dh.float(), x.grad.float(), rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_autograd_on_the_current_stream(dtype: torch.dtype) -> None:
    """Through the custom op and autograd, on a side stream: the kernels are enqueued on the
    current stream of the tensors' device."""
    h = random_h(300, 96, dtype)
    da = torch.randn(2, 150, 96).to(dtype)
    stream = torch.cuda.Stream()
    x = _gpu(h).view(2, 150, 192).requires_grad_()
    g = _gpu(da)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        a = swiglu(x)
        a.backward(g)
    stream.synchronize()
    want_a, want_dh = reference(h.view(2, 150, 192), da)
    assert_close(a.detach().cpu(), want_a, dtype)
    assert_close(x.grad.cpu(), want_dh, dtype)


def test_mixed_devices_are_refused() -> None:
    h = torch.randn(4, 16, device="cuda")
    with pytest.raises(InvalidArgumentError, match="one device"):
        native().kernels.swiglu_forward(h, torch.empty(4, 8))
    with pytest.raises(InvalidArgumentError, match="one device"):
        swiglu_backward(torch.randn(4, 8), h)

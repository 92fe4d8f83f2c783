"""The fused SwiGLU (``overlap::swiglu``, ``overlap::swiglu_backward``) on the CPU: the core's
host reference against float64 PyTorch, its errors, and the custom ops' registrations (fake
implementations, autograd, ``torch.compile``). The CUDA kernels: test_activation_gpu.py.
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

# (rows, cols) of the output; h is [rows, 2 * cols]. Odd cols (no whole 16-byte vector), a
# single row, several host chunks of 256 and a ragged last chunk.
SHAPES = [(1, 1), (1, 8), (3, 13), (7, 64), (5, 1000), (2, 300)]


# ---- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_forward_matches_float64(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    h = random_h(*shape, dtype)
    a = swiglu(h)
    assert a.shape == (shape[0], shape[1])
    assert_close(a, reference(h)[0], dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_backward_matches_float64(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    h = random_h(*shape, dtype).requires_grad_()
    da = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    swiglu(h).backward(da)
    _, dh = reference(h.detach(), da)
    assert_close(h.grad, dh, dtype)
    # The backward op on its own gives the same gradient, as a new tensor.
    direct = swiglu_backward(da, h.detach())
    assert torch.equal(direct, h.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_leading_dimensions(dtype: torch.dtype) -> None:
    """[s, b, 2F] -> [s, b, F], the layout of LayerNormMLP's 3-D inputs."""
    h = random_h(6, 24, dtype).view(2, 3, 48).requires_grad_()
    a = swiglu(h)
    assert a.shape == (2, 3, 24)
    da = torch.randn(2, 3, 24).to(dtype)
    a.backward(da)
    want_a, want_dh = reference(h.detach(), da)
    assert_close(a.detach(), want_a, dtype)
    assert_close(h.grad, want_dh, dtype)
    assert h.grad.shape == h.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=ids)
def test_at_least_as_accurate_as_the_unfused_formula(dtype: torch.dtype) -> None:
    """torch's ``silu(g) * up`` in 16 bits rounds twice (after silu, after the product); the
    fused kernel rounds once, so it is never further from float64 than torch is."""
    h = random_h(64, 256, dtype).requires_grad_()
    da = torch.randn(64, 256).to(dtype)
    want_a, want_dh = reference(h.detach(), da)
    a = swiglu(h)
    a.backward(da)
    ours_dh = h.grad
    h.grad = None
    gate, up = h.chunk(2, dim=-1)
    unfused = torch.nn.functional.silu(gate) * up
    unfused.backward(da)
    err = lambda t, want: float((t.double() - want).abs().max())  # noqa: E731
    assert err(a.detach(), want_a) <= err(unfused.detach(), want_a)
    assert err(ours_dh, want_dh) <= err(h.grad, want_dh)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_saturated_gates(dtype: torch.dtype) -> None:
    """Gates far out on either side (sigmoid 0 or 1, exp overflowing float32) stay finite."""
    big = 60.0 if dtype == torch.float16 else 100.0
    g = torch.tensor([[-big, -30.0, -10.0, -1.2785, 0.0, 1.0, 10.0, 30.0, big]])
    h = torch.cat([g, torch.full_like(g, 0.5)], dim=1).to(dtype).requires_grad_()
    a = swiglu(h)
    da = torch.ones_like(a)
    a.backward(da)
    want_a, want_dh = reference(h.detach(), da)
    assert torch.isfinite(a).all() and torch.isfinite(h.grad).all()
    assert_close(a.detach(), want_a, dtype)
    assert_close(h.grad, want_dh, dtype)


def test_nan_propagates() -> None:
    """A NaN gate spoils its output and both gradients; a NaN up its output and d gate (d up
    = da * silu(gate) does not read it)."""
    h = torch.tensor([[float("nan"), 1.0, 2.0, float("nan")]])
    a = swiglu(h)
    assert torch.isnan(a).tolist() == [[True, True]]
    dh = swiglu_backward(torch.ones(1, 2), h)
    assert torch.isnan(dh).tolist() == [[True, True, True, False]]


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)], ids=ids)
def test_empty(shape: tuple[int, int]) -> None:
    h = torch.empty(shape[0], 2 * shape[1])
    assert swiglu(h).shape == shape
    assert swiglu_backward(torch.empty(shape), h).shape == h.shape


def test_outputs_are_written_whole() -> None:
    """Every output element is written: an output poisoned with NaN comes back clean."""
    h = random_h(5, 37, torch.bfloat16)
    out = torch.full((5, 37), float("nan"), dtype=torch.bfloat16)
    native().kernels.swiglu_forward(h, out)
    assert torch.equal(out, swiglu(h))
    dh = torch.full_like(h, float("nan"))
    da = torch.randn(5, 37).bfloat16()
    native().kernels.swiglu_backward(da, h, dh)
    assert torch.equal(dh, swiglu_backward(da, h))


# ---- errors ------------------------------------------------------------------------------------


def test_non_contiguous_inputs_are_refused() -> None:
    h = torch.randn(8, 6)
    with pytest.raises(InvalidArgumentError, match="h must be contiguous"):
        swiglu(h.t())
    with pytest.raises(InvalidArgumentError, match="h must be contiguous"):
        swiglu(torch.randn(4, 16)[:, ::2])
    with pytest.raises(InvalidArgumentError, match="da must be contiguous"):
        swiglu_backward(torch.randn(3, 8).t(), h)
    # The core checks on its own too (for callers of the native module).
    with pytest.raises(InvalidArgumentError, match="h must be contiguous"):
        native().kernels.swiglu_forward(h.t(), torch.empty(6, 4))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn], ids=ids)
def test_unsupported_dtypes_are_refused(dtype: torch.dtype) -> None:
    h = torch.zeros(2, 8).to(dtype)
    with pytest.raises(InvalidArgumentError, match="h must be float32, float16 or bfloat16"):
        swiglu(h)
    with pytest.raises(InvalidArgumentError, match="h must be float32, float16 or bfloat16"):
        swiglu_backward(torch.zeros(2, 4).to(dtype), h)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="last dimension must be even"):
        swiglu(torch.randn(3, 7))
    with pytest.raises(InvalidArgumentError, match="at least one dimension"):
        swiglu(torch.tensor(1.0))
    with pytest.raises(InvalidArgumentError, match=r"da .* must have shape \[3, 4\]"):
        swiglu_backward(torch.randn(3, 5), torch.randn(3, 8))
    with pytest.raises(InvalidArgumentError, match=r"da .* must have shape \[3, 4\]"):
        swiglu_backward(torch.randn(4, 4), torch.randn(3, 8))


def test_mismatched_dtypes_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"da .* must have h's dtype bfloat16"):
        swiglu_backward(torch.randn(3, 4), torch.randn(3, 8).bfloat16())


def test_native_outputs_are_checked() -> None:
    k = native().kernels
    h = torch.randn(3, 8)
    with pytest.raises(InvalidArgumentError, match=r"out must have shape \[3, 4\]"):
        k.swiglu_forward(h, torch.empty(3, 8))
    with pytest.raises(InvalidArgumentError, match="out must have h's dtype float32"):
        k.swiglu_forward(h, torch.empty(3, 4, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match=r"dh must have shape \[3, 8\]"):
        k.swiglu_backward(torch.randn(3, 4), h, torch.empty(3, 4))
    # Outputs sharing memory with an input.
    with pytest.raises(InvalidArgumentError, match="out must not share memory with h"):
        k.swiglu_forward(h, h.view(-1)[:12].view(3, 4))
    with pytest.raises(InvalidArgumentError, match="dh must not share memory with h"):
        k.swiglu_backward(torch.randn(3, 4), h, h)
    da = torch.randn(6, 4)
    with pytest.raises(InvalidArgumentError, match="dh must not share memory with da"):
        k.swiglu_backward(da[:3], h, da.view(3, 8))


# ---- custom-op registration --------------------------------------------------------------------


def test_opcheck() -> None:
    """Schema, fake implementations and autograd registration as torch.library checks them."""
    h = random_h(4, 24, torch.float32).requires_grad_()
    torch.library.opcheck(swiglu, (h,))
    torch.library.opcheck(swiglu_backward, (torch.randn(4, 24), h.detach()))


def test_compiles_without_graph_breaks() -> None:
    """``torch.compile(fullgraph=True)`` traces forward and backward through the ops (fake
    implementations give the shapes; aot_eager runs the traced graphs on the real kernels)."""

    def step(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (swiglu(h) * w).sum()

    h = random_h(6, 40, torch.bfloat16).requires_grad_()
    w = torch.randn(6, 40).bfloat16()
    eager = step(h, w)
    eager.backward()
    eager_grad, h.grad = h.grad, None
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(h, w)
    compiled.backward()
    assert torch.equal(compiled, eager)
    assert torch.equal(h.grad, eager_grad)

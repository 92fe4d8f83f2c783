"""reduce_partials (the reduction step of a reduce-scatter) against torch references."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError  # noqa: E402
from overlap.quantization import reduce_partials  # noqa: E402
from tests.unit.fp8_reference import (  # noqa: E402
    FP8_DTYPES,
    bits,
    fp8_bits,
    ids,
    ordered_sum,
    partials,
)

IN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OUT_SHAPES = [(1,), (1000,), (7, 129)]


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=ids)
@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("shape", OUT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reduce_matches_ordered_float32_sum(
    dtype: torch.dtype, out_dtype: torch.dtype, k: int, shape: tuple[int, ...]
) -> None:
    p = partials(k, shape, dtype, seed=k * 100 + len(shape))
    out = torch.full(shape, float("nan"), dtype=out_dtype)
    amax = torch.full((1,), float("nan"))
    got = reduce_partials(p, out=out, amax=amax)
    assert got is out
    acc = ordered_sum(p)
    # Rounded once, to nearest even, from the float32 sum: bit-exact.
    assert torch.equal(got, acc.to(out_dtype))
    assert torch.equal(amax, acc.abs().max().reshape(1))
    # And close to the exact sum.
    exact = p.double().sum(0)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out_dtype]
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=exact.abs().max() * 1e-6)


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["fp8", "uint8"])
def test_reduce_to_fp8(fmt: torch.dtype, as_bytes: bool) -> None:
    p = partials(4, (3, 333), torch.bfloat16, seed=9)
    acc = ordered_sum(p)
    scale = torch.tensor([300.0 / acc.abs().max().item()]) * (
        128.0 if fmt == torch.float8_e5m2 else 1.0
    )
    out = torch.empty((3, 333), dtype=torch.uint8 if as_bytes else fmt)
    bits(out).fill_(0xFF)
    scale_inv = torch.full((1,), float("nan"))
    amax = torch.full((1,), float("nan"))
    got = reduce_partials(p, out_dtype=fmt, scale=scale, scale_inv=scale_inv, amax=amax, out=out)
    assert got is out
    assert torch.equal(bits(got), fp8_bits(acc * scale, fmt))
    assert torch.equal(scale_inv, 1.0 / scale)
    assert torch.equal(amax, acc.abs().max().reshape(1))  # of the unscaled sum


def test_reduce_keeps_negative_zero_and_propagates_nan() -> None:
    p = torch.tensor([[-0.0, 1.0, 2.0], [-0.0, float("nan"), 3.0]])
    amax = torch.zeros(1)
    got = reduce_partials(p, amax=amax)
    assert got[0].item() == 0.0 and torch.signbit(got[0])
    assert torch.isnan(got[1]) and got[2].item() == 5.0
    assert torch.isnan(amax).all()


def test_reduce_defaults_to_partials_dtype() -> None:
    p = torch.randn(3, 10, dtype=torch.bfloat16)
    got = reduce_partials(p)
    assert got.dtype == torch.bfloat16 and got.shape == (10,)
    assert torch.equal(got, ordered_sum(p).bfloat16())


P = torch.randn(2, 16)

BAD_CALLS = {
    "uint8-out-without-format": (
        lambda: reduce_partials(P, out=torch.empty(16, dtype=torch.uint8)),
        "out is uint8 .* pass out_dtype",
    ),
    "fp8-without-scale": (
        lambda: reduce_partials(P, out_dtype=torch.float8_e4m3fn),
        r"needs a float32\[1\] scale",
    ),
    "scale-with-bf16-out": (
        lambda: reduce_partials(P, out_dtype=torch.bfloat16, scale=torch.ones(1)),
        "scale and scale_inv apply to FP8 outputs only",
    ),
    "out-shape": (
        lambda: reduce_partials(P, out=torch.empty(2, 16)),
        r"must have shape \[16\], got float32\[2, 16\]",
    ),
    "out-format-mismatch": (
        lambda: reduce_partials(P, out_dtype=torch.float16, out=torch.empty(16)),
        "out must hold float16, got float32",
    ),
    "out-float64": (
        lambda: reduce_partials(P, out_dtype=torch.float64),
        "out_format must be float32, bfloat16, float16 or an FP8 format, got float64",
    ),
    "scalar-partials": (lambda: reduce_partials(torch.tensor(1.0)), r"\[k, \.\.\.\] with k >= 1"),
    "zero-partials": (lambda: reduce_partials(torch.empty(0, 4)), r"with k >= 1"),
    "partials-int": (
        lambda: reduce_partials(torch.ones(2, 4, dtype=torch.int32)),
        "partials must be float32, float16 or bfloat16",
    ),
    "partials-noncontig": (lambda: reduce_partials(P.t()), "partials must be contiguous"),
    "amax-size": (
        lambda: reduce_partials(P, amax=torch.empty(2)),
        "amax must be a contiguous float32",
    ),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_reduce_rejects_bad_arguments(name: str) -> None:
    call, match = BAD_CALLS[name]
    with pytest.raises(InvalidArgumentError, match=match):
        call()


# ---- reduce_tensors: the same reduction over separate tensors (reduce-scatter peers) --------


def _reduce_tensors(inputs, out, **kwargs) -> None:
    from overlap._native import native

    native().kernels.reduce_tensors(inputs, out, **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("out_format", [torch.float32, torch.bfloat16, torch.float8_e5m2], ids=ids)
def test_reduce_tensors_matches_reduce_partials(k: int, out_format: torch.dtype) -> None:
    p = partials(k, (5, 77), torch.bfloat16, seed=k)
    fp8 = out_format in FP8_DTYPES
    scale = torch.tensor([64.0]) if fp8 else None
    out = torch.empty((5, 77), dtype=torch.uint8 if fp8 else out_format)
    amax = torch.full((1,), float("nan"))
    _reduce_tensors(
        [p[i].clone() for i in range(k)], out, out_format=out_format, scale=scale, amax=amax
    )
    want = reduce_partials(p, out_dtype=out_format, scale=scale)
    assert torch.equal(bits(out) if fp8 else out, bits(want) if fp8 else want)
    assert torch.equal(amax, ordered_sum(p).abs().max().reshape(1))


def test_reduce_tensors_in_place_into_an_input() -> None:
    p = partials(3, (1000,), torch.float32, seed=1)
    inputs = [p[i].clone() for i in range(3)]
    _reduce_tensors(inputs, inputs[2], out_format=torch.float32)
    assert torch.equal(inputs[2], ordered_sum(p))


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ([], "at least one input"),
        ([torch.ones(4), torch.ones(5)], r"dtype and shape of inputs\[0\].*inputs\[1\] is"),
        ([torch.ones(4), torch.ones(4, dtype=torch.float16)], r"inputs\[1\] is float16\[4\]"),
        ([torch.ones(4, dtype=torch.int32)], "inputs.0. must be float32, float16 or bfloat16"),
        ([torch.ones(8)[::2]], "must be contiguous"),
    ],
    ids=["empty", "shape", "dtype", "int", "strided"],
)
def test_reduce_tensors_rejects(inputs, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        _reduce_tensors(inputs, torch.empty(4), out_format=torch.float32)

"""FP8 encoding of the core (float -> e4m3fn / e5m2 bits), bit-exact against torch.

The encoder is reached through cast_to_fp8 with scale 1 (x * 1 is exact, NaN sign included),
so every bit pattern it produces is compared with torch's cast of the clamped value.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.quantization import cast_to_fp8  # noqa: E402
from tests.unit.fp8_reference import FP8_DTYPES, FP8_MAX, bits, fp8_bits, ids  # noqa: E402


def _encode(x: torch.Tensor, fmt: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    out = torch.full(x.shape, 0xFF, dtype=torch.uint8)  # poisoned
    cast_to_fp8(x, torch.tensor([scale]), fp8_dtype=fmt, out=out)
    return out


def _special_values(fmt: torch.dtype) -> torch.Tensor:
    """Every finite FP8 value, every tie between neighbours and the floats either side of it,
    plus signed zeros, the saturation region, infinities, NaNs and float32 subnormals."""
    codes = torch.arange(256, dtype=torch.uint8).view(fmt).float()
    finite = codes[torch.isfinite(codes)].unique()  # sorted, -max .. max
    ties = ((finite[1:].double() + finite[:-1].double()) / 2).float()  # exact in float32
    up = torch.nextafter(ties, torch.full_like(ties, float("inf")))
    down = torch.nextafter(ties, torch.full_like(ties, -float("inf")))
    m = FP8_MAX[fmt]
    smallest = finite[finite > 0].min().item()
    inf, nan = float("inf"), float("nan")
    extras = torch.tensor(
        [
            *(0.0, -0.0, m, -m, m * 1.03, m * (1 + 1 / 14), m * 1.1, 480.0, 65536.0, 1e30, -1e30),
            *(3.4e38, inf, -inf, nan, -nan),
            *(1e-40, -1e-45, smallest / 2, -smallest / 2, smallest * 1.5, smallest * 0.49),
        ]
    )
    return torch.cat([finite, ties, up, down, extras])


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
def test_special_values_bit_exact(fmt: torch.dtype) -> None:
    x = _special_values(fmt)
    got = _encode(x, fmt)
    want = fp8_bits(x, fmt)
    bad = (got != want).nonzero().flatten()[:8]
    assert bad.numel() == 0, [(x[i].item(), got[i].item(), want[i].item()) for i in bad]


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
def test_saturation_and_nan(fmt: torch.dtype) -> None:
    x = torch.tensor([1e9, -1e9, float("inf"), -float("inf"), float("nan"), -float("nan")])
    got = _encode(x, fmt)
    max_bits = fp8_bits(torch.tensor([FP8_MAX[fmt]]), fmt).item()
    assert got.tolist() == [max_bits, max_bits | 0x80, max_bits, max_bits | 0x80, 0x7F, 0xFF]


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("seed", range(3))
def test_random_magnitudes_bit_exact(fmt: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 100_003
    x = torch.randn(n, generator=g) * torch.pow(2.0, torch.randint(-30, 30, (n,), generator=g))
    assert torch.equal(_encode(x, fmt), fp8_bits(x, fmt))


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=ids)
def test_half_inputs_with_random_scale(fmt: torch.dtype, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(4099, generator=g) * 40).to(dtype)
    scale = float(torch.rand(1, generator=g).item() * 20 + 0.1) * FP8_MAX[fmt] / 448
    want = fp8_bits(x.float() * torch.tensor([scale]), fmt)
    assert torch.equal(_encode(x, fmt, scale), want)
    assert (want == fp8_bits(torch.tensor([FP8_MAX[fmt]]), fmt)).any()  # saturation happened


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
def test_fp8_dtype_output_equals_uint8_output(fmt: torch.dtype) -> None:
    x = torch.randn(333) * 100
    out = torch.empty(333, dtype=fmt)
    bits(out).fill_(0xFF)
    cast_to_fp8(x, torch.tensor([1.5]), out=out)  # format taken from out's dtype
    assert torch.equal(bits(out), _encode(x, fmt, 1.5))

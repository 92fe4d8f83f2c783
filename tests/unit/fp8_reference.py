"""Pure-torch references for the FP8 quantization kernels: the oracle of the host tests.

They are written independently of the C++ code, from the formats' definitions, with torch's
own float8 casts doing the rounding (after a clamp, since torch's cast does not saturate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
EMAX_ELEM = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}
FLT_MAX = torch.finfo(torch.float32).max
FLT_MIN = torch.finfo(torch.float32).tiny


def ids(v: object) -> str:
    return str(v).replace("torch.", "")


def fp8_bits(v: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """Saturating RNE cast of float32 ``v`` to ``fmt``, as uint8 bits."""
    m = FP8_MAX[fmt]
    return v.float().clamp(-m, m).to(fmt).view(torch.uint8)


def bits(t: torch.Tensor) -> torch.Tensor:
    """FP8 or uint8 tensor as uint8 bits."""
    return t.view(torch.uint8)


def decode(t: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    return t.view(torch.uint8).view(fmt).float()


def scale_from_amax(
    amax: torch.Tensor,
    fmt: torch.dtype,
    margin: int = 0,
    power_of_2: bool = False,
    eps: float = 0.0,
) -> torch.Tensor:
    """NOTE [scale convention] of csrc/kernels/scale.h, elementwise, in float32."""
    a = amax.float()
    special = ~torch.isfinite(a)
    a = torch.where(a < eps, torch.full_like(a, eps), a)
    special |= a == 0
    safe = torch.where(special, torch.ones_like(a), a)
    # A true division: torch evaluates `scalar / tensor` as `reciprocal(tensor) * scalar`,
    # which rounds twice.
    s = torch.full_like(safe, FP8_MAX[fmt]).div(safe) / (2.0**margin)
    s = s.clamp(min=FLT_MIN, max=FLT_MAX)
    if power_of_2:
        _, e = torch.frexp(s)
        s = torch.pow(2.0, (e - 1).double()).float()
    return torch.where(special, torch.ones_like(s), s)


def block_amax(v: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """Per-block max |v| (NaN propagates) over blocks br x bc; partial edge blocks allowed."""
    r, c = v.shape
    pr, pc = -(-r // br) * br, -(-c // bc) * bc
    padded = F.pad(v.float().abs(), (0, pc - c, 0, pr - r))  # zeros never raise an amax
    return padded.reshape(pr // br, br, pc // bc, bc).amax(dim=(1, 3))


def expand(per_block: torch.Tensor, br: int, bc: int, shape: torch.Size) -> torch.Tensor:
    full = per_block.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return full[: shape[0], : shape[1]]


def quantize_blocks(
    v: torch.Tensor,
    br: int,
    bc: int,
    fmt: torch.dtype,
    *,
    power_of_2: bool = False,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float-scaled block quantization of the 2-D ``v``: (uint8 bits, float32 scale_inv)."""
    scale = scale_from_amax(block_amax(v, br, bc), fmt, power_of_2=power_of_2, eps=eps)
    q = fp8_bits(v.float() * expand(scale, br, bc, v.shape), fmt)
    return q, 1.0 / scale


def mx_scale_bytes(amax: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """OCP MX shared exponent as E8M0 bytes (int64): floor(log2(amax)) - emax, clamped."""
    _, e = torch.frexp(amax)  # amax = m * 2^e with m in [0.5, 1): floor(log2) = e - 1
    shared = (e.long() - 1 - EMAX_ELEM[fmt]).clamp(-127, 127)
    shared = torch.where(amax == 0, torch.full_like(shared, -127), shared)
    shared = torch.where(torch.isinf(amax), torch.full_like(shared, 127), shared)
    byte = shared + 127
    return torch.where(torch.isnan(amax), torch.full_like(byte, 255), byte)


def e8m0_value(byte: torch.Tensor) -> torch.Tensor:
    v = torch.pow(2.0, byte.double() - 127).float()  # exact: powers of two in float64
    return torch.where(byte == 255, torch.full_like(v, float("nan")), v)


def quantize_mx(
    v: torch.Tensor, br: int, bc: int, fmt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 of the 2-D ``v`` with br x bc blocks: (uint8 bits, uint8 E8M0 bytes)."""
    byte = mx_scale_bytes(block_amax(v, br, bc), fmt)
    multiplier = 1.0 / e8m0_value(byte)
    q = fp8_bits(v.float() * expand(multiplier, br, bc, v.shape), fmt)
    return q, byte.to(torch.uint8)


def random_input(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values whose magnitude varies by block and row (so blocks get distinct scales)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if len(shape) == 2:
        row_mag = torch.pow(2.0, torch.randint(-8, 9, (shape[0], 1), generator=g).float())
        col_mag = torch.pow(2.0, torch.randint(-4, 5, (1, shape[1]), generator=g).float())
        x = x * row_mag * col_mag
    return x.to(dtype)


def partials(k: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """k stacked random partial sums whose magnitudes differ by partial, so that the float32
    order of summation matters."""
    g = torch.Generator().manual_seed(seed)
    mags = torch.pow(2.0, torch.randint(-6, 7, (k,) + (1,) * len(shape), generator=g).float())
    return (torch.randn((k, *shape), generator=g) * mags).to(dtype)


def ordered_sum(p: torch.Tensor) -> torch.Tensor:
    """((p0 + p1) + p2) + ... in float32: NOTE [reduction order] of csrc/kernels/reduce.h."""
    acc = p[0].float().clone()
    for i in range(1, p.shape[0]):
        acc = acc + p[i].float()
    return acc

"""Host references of the FP8 quantization kernels against pure-torch references.

Per-tensor scale and casts, 1x128 / 128x128 block scaling, MXFP8 and dequantization: bytes
and scales bit-exact, outputs poisoned before every call, odd shapes, fresh random inputs.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.quantization import (  # noqa: E402
    BlockScaledFP8,
    ScalingMode,
    cast_to_fp8,
    cast_transpose,
    compute_scale,
    dequantize,
    quantize_block_1x128,
    quantize_block_128x128,
    quantize_mxfp8,
)
from tests.unit.fp8_reference import (  # noqa: E402
    FP8_DTYPES,
    FP8_MAX,
    bits,
    decode,
    e8m0_value,
    expand,
    fp8_bits,
    ids,
    quantize_blocks,
    quantize_mx,
    random_input,
    scale_from_amax,
)

IN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 1), (7, 129), (130, 257), (128, 256), (3, 1000)]


def _shape_id(s: tuple[int, int]) -> str:
    return f"{s[0]}x{s[1]}"


def _poisoned_fp8(shape: tuple[int, ...], fmt: torch.dtype, as_bytes: bool) -> torch.Tensor:
    t = torch.empty(shape, dtype=torch.uint8 if as_bytes else fmt)
    bits(t).fill_(0xFF)
    return t


def _nan(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, float("nan"))


# ---- compute_scale ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize("margin", [0, 3])
def test_compute_scale_matches_reference(fmt: torch.dtype, power_of_2: bool, margin: int) -> None:
    g = torch.Generator().manual_seed(margin)
    amax = torch.rand(1000, generator=g) * torch.pow(
        2.0, torch.randint(-40, 40, (1000,), generator=g)
    )
    special = [0.0, 1e-45, 1e-39, 3e38, float("inf"), float("nan"), 1e-3]
    amax = torch.cat([amax, torch.tensor(special)])
    out = (_nan(amax.shape), _nan(amax.shape))
    scale, scale_inv = compute_scale(
        amax, fp8_dtype=fmt, margin=margin, power_of_2=power_of_2, epsilon=0.0, out=out
    )
    want = scale_from_amax(amax, fmt, margin=margin, power_of_2=power_of_2)
    assert scale is out[0] and scale_inv is out[1]
    assert torch.equal(scale, want)
    assert torch.equal(scale_inv, 1.0 / want)
    assert torch.isfinite(scale).all() and torch.isfinite(scale_inv).all()
    assert scale[-7].item() == 1.0 and scale[-3].item() == 1.0 and scale[-2].item() == 1.0
    if power_of_2:
        mantissa, _ = torch.frexp(scale)
        assert (mantissa == 0.5).all()


def test_compute_scale_epsilon_and_default_format() -> None:
    amax = torch.tensor([0.0, 1e-9, 2.0, 448.0])
    scale, scale_inv = compute_scale(amax, epsilon=1e-3)
    assert scale.tolist() == pytest.approx([448e3, 448e3, 224.0, 1.0], rel=1e-6)
    assert torch.equal(scale, scale_from_amax(amax, torch.float8_e4m3fn, eps=1e-3))
    assert torch.equal(scale_inv, 1.0 / scale)


# ---- per-tensor casts ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["fp8", "uint8"])
def test_cast_to_fp8_bit_exact(
    fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int], as_bytes: bool
) -> None:
    x = random_input(shape, dtype, seed=hash((shape, ids(dtype))) % 1000)
    amax = x.float().abs().max().reshape(1)
    scale, _ = compute_scale(amax * 0.5, fp8_dtype=fmt)  # half the headroom: some saturate
    out = _poisoned_fp8(shape, fmt, as_bytes)
    scale_inv, amax_out = _nan((1,)), _nan((1,))
    got, got_inv = cast_to_fp8(x, scale, fp8_dtype=fmt, out=out, scale_inv=scale_inv, amax=amax_out)
    assert got is out and got_inv is scale_inv
    assert torch.equal(bits(out), fp8_bits(x.float() * scale, fmt))
    assert torch.equal(scale_inv, 1.0 / scale)
    assert torch.equal(amax_out, amax)


def test_cast_to_fp8_nd_and_nan_amax() -> None:
    x = torch.randn(2, 3, 5) * 10
    x[1, 2, 3] = float("nan")
    amax = _nan((1,))
    amax.fill_(-1.0)
    q, _ = cast_to_fp8(x, torch.tensor([2.0]), amax=amax)
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    assert torch.equal(bits(q), fp8_bits(x * 2.0, torch.float8_e4m3fn))
    assert torch.isnan(amax).all()


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_cast_transpose_bit_exact(
    fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    x = random_input(shape, dtype, seed=shape[0] * 7 + shape[1])
    scale = torch.tensor([FP8_MAX[fmt] / x.float().abs().max().item() * 4])  # saturates
    out = _poisoned_fp8(shape, fmt, as_bytes=False)
    out_t = _poisoned_fp8(shape[::-1], fmt, as_bytes=True)
    amax = _nan((1,))
    got, got_t, scale_inv = cast_transpose(x, scale, fp8_dtype=fmt, out=out, out_t=out_t, amax=amax)
    want = fp8_bits(x.float() * scale, fmt)
    assert got is out and got_t is out_t
    assert torch.equal(bits(out), want)
    assert torch.equal(out_t, want.t().contiguous())
    assert torch.equal(scale_inv, 1.0 / scale)
    assert torch.equal(amax, x.float().abs().max().reshape(1))


def test_cast_transpose_columnwise_only() -> None:
    x = torch.randn(33, 65, dtype=torch.bfloat16)
    scale = torch.tensor([3.0])
    out, out_t, _ = cast_transpose(x, scale, rowwise=False, fp8_dtype=torch.float8_e5m2)
    assert out is None and out_t.shape == (65, 33) and out_t.dtype == torch.float8_e5m2
    assert torch.equal(bits(out_t), fp8_bits(x.float() * scale, torch.float8_e5m2).t())


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=ids)
def test_per_tensor_dequantize(fmt: torch.dtype, out_dtype: torch.dtype) -> None:
    x = random_input((37, 300), torch.float32, seed=3)
    scale, _ = compute_scale(x.abs().max().reshape(1), fp8_dtype=fmt)
    q, scale_inv = cast_to_fp8(x, scale, fp8_dtype=fmt)
    out = torch.full(x.shape, float("nan"), dtype=out_dtype)
    got = dequantize(q, scale_inv, mode=ScalingMode.TENSOR, out=out)
    assert got is out
    assert torch.equal(got, (decode(q, fmt) * scale_inv).to(out_dtype))
    # Round trip: half a unit in the last place (2^-4 or 2^-3 relative) plus the subnormal step.
    rel = 2.0**-4 if fmt == torch.float8_e4m3fn else 2.0**-3
    step = x.abs().max() * 2.0**-17  # half the subnormal step, amax * 2^-9 / 448, rounded up
    assert ((got.float() - x).abs() <= x.abs() * (rel + 2.0**-8) * 1.01 + step).all()


# ---- block scaling (1x128, 128x128) ----------------------------------------------------------


BLOCK_SHAPES = [(1, 1), (7, 129), (130, 257), (128, 256), (256, 128), (3, 1000)]


def _poisoned_blocks(
    shape: tuple[int, int], fmt: torch.dtype, br: int, as_bytes: bool
) -> BlockScaledFP8:
    rows, cols = shape
    return BlockScaledFP8(
        _poisoned_fp8((rows, cols), fmt, as_bytes),
        _nan((-(-rows // br), -(-cols // 128))),
        _poisoned_fp8((cols, rows), fmt, as_bytes),
        _nan((-(-cols // br), -(-rows // 128))),
    )


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", BLOCK_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
def test_block_1x128_bit_exact(
    fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int], power_of_2: bool
) -> None:
    x = random_input(shape, dtype, seed=shape[0] + 3 * shape[1])
    out = _poisoned_blocks(shape, fmt, 1, as_bytes=dtype == torch.float16)
    got = quantize_block_1x128(x, fp8_dtype=fmt, power_of_2=power_of_2, out=out)
    assert got is out
    q, s_inv = quantize_blocks(x, 1, 128, fmt, power_of_2=power_of_2)
    assert torch.equal(bits(got.rowwise_data), q)
    assert torch.equal(got.rowwise_scale_inv, s_inv)
    q_t, s_inv_t = quantize_blocks(x.t(), 1, 128, fmt, power_of_2=power_of_2)
    assert torch.equal(bits(got.columnwise_data), q_t)
    assert torch.equal(got.columnwise_scale_inv, s_inv_t)
    if shape[1] > 128:  # the test must see distinct block scales to mean anything
        assert got.rowwise_scale_inv.unique().numel() > 1


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", BLOCK_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
def test_block_128x128_bit_exact(
    fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int], power_of_2: bool
) -> None:
    x = random_input(shape, dtype, seed=5 * shape[0] + shape[1])
    out = _poisoned_blocks(shape, fmt, 128, as_bytes=dtype == torch.bfloat16)
    got = quantize_block_128x128(x, fp8_dtype=fmt, power_of_2=power_of_2, out=out)
    q, s_inv = quantize_blocks(x, 128, 128, fmt, power_of_2=power_of_2)
    assert torch.equal(bits(got.rowwise_data), q)
    assert torch.equal(got.rowwise_scale_inv, s_inv)
    q_t, _ = quantize_blocks(x.t(), 128, 128, fmt, power_of_2=power_of_2)
    assert torch.equal(bits(got.columnwise_data), q_t)
    # The same tiles: the columnwise scales are the rowwise ones transposed, and so is the data.
    assert torch.equal(got.columnwise_scale_inv, s_inv.t())
    assert torch.equal(bits(got.columnwise_data), q.t())


def test_block_allocates_requested_directions_only() -> None:
    x = torch.randn(5, 300)
    got = quantize_block_1x128(x, rowwise=False, columnwise=True, fp8_dtype=torch.float8_e5m2)
    assert got.rowwise_data is None and got.rowwise_scale_inv is None
    assert got.columnwise_data.shape == (300, 5) and got.columnwise_data.dtype == torch.float8_e5m2
    assert got.columnwise_scale_inv.shape == (300, 1)
    got = quantize_block_128x128(x)
    assert got.columnwise_data is None and got.rowwise_scale_inv.shape == (1, 3)


def test_block_special_blocks_and_epsilon() -> None:
    x = torch.randn(4, 512)
    x[0, :128] = 0.0  # amax 0 -> scale 1 (without epsilon)
    x[1, 130] = float("nan")  # NaN block -> scale 1, NaN kept
    x[2, 300] = float("inf")  # inf block -> scale 1, inf saturates
    x[3, 384:] = 1e-30  # tiny amax: epsilon caps the scale
    assert quantize_block_1x128(x).rowwise_scale_inv[0, 0].item() == 1.0
    got = quantize_block_1x128(x, epsilon=1e-6)
    s_inv = got.rowwise_scale_inv
    assert s_inv[1, 1].item() == 1.0 and s_inv[2, 2].item() == 1.0
    assert s_inv[0, 0].item() == s_inv[3, 3].item() == pytest.approx(1e-6 / 448, rel=1e-6)
    q, want_s_inv = quantize_blocks(x, 1, 128, torch.float8_e4m3fn, eps=1e-6)
    assert torch.equal(s_inv, want_s_inv)
    nan_mask = torch.isnan(x)
    assert torch.equal(bits(got.rowwise_data)[~nan_mask], q[~nan_mask])
    assert (bits(got.rowwise_data)[nan_mask] & 0x7F == 0x7F).all()
    assert bits(got.rowwise_data)[2, 300].item() == 0x7E  # inf -> 448


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=ids)
@pytest.mark.parametrize("shape", [(7, 129), (130, 257)], ids=_shape_id)
def test_block_dequantize(fmt: torch.dtype, out_dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = random_input(shape, torch.float32, seed=11)
    for quantize, mode, br in [
        (quantize_block_1x128, ScalingMode.BLOCK_1X128, 1),
        (quantize_block_128x128, ScalingMode.BLOCK_128X128, 128),
    ]:
        qt = quantize(x, fp8_dtype=fmt, columnwise=True)
        out = torch.full(shape, float("nan"), dtype=out_dtype)
        got = dequantize(qt.rowwise_data, qt.rowwise_scale_inv, mode=mode, out=out)
        assert got is out
        want = decode(qt.rowwise_data, fmt) * expand(qt.rowwise_scale_inv, br, 128, shape)
        assert torch.equal(got, want.to(out_dtype))
        # Columnwise data dequantizes to the transpose.
        got_t = dequantize(
            qt.columnwise_data, qt.columnwise_scale_inv, mode=mode, out_dtype=out_dtype
        )
        assert got_t.shape == shape[::-1]
        _assert_round_trip(got, x, qt.rowwise_scale_inv, br, fmt)
        _assert_round_trip(got_t, x.t(), qt.columnwise_scale_inv, br, fmt)


def _assert_round_trip(
    got: torch.Tensor, x: torch.Tensor, scale_inv: torch.Tensor, br: int, fmt: torch.dtype
) -> None:
    """Within half an FP8 ulp of each element (2^-4 relative for e4m3, 2^-3 for e5m2), plus
    half the subnormal step of its block (block_amax * 2^-9 / 448 for e4m3; 2^-16 / 57344 for
    e5m2) and the output's own rounding."""
    rel = 2.0**-4 if fmt == torch.float8_e4m3fn else 2.0**-3
    sub = 2.0**-10 / 448 if fmt == torch.float8_e4m3fn else 2.0**-17 / 57344
    block_amax = expand(scale_inv, br, 128, x.shape) * FP8_MAX[fmt]
    tol = x.abs() * (rel + 2.0**-8) * 1.01 + block_amax * sub * 1.01
    assert ((got.float() - x).abs() <= tol).all()


# ---- MXFP8 -----------------------------------------------------------------------------------


MX_SHAPES = [(32, 32), (64, 96), (96, 64), (32, 1024), (160, 32)]


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", MX_SHAPES, ids=_shape_id)
def test_mxfp8_bit_exact(fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = random_input(shape, dtype, seed=shape[0] * 3 + shape[1])
    rows, cols = shape
    out = BlockScaledFP8(
        _poisoned_fp8(shape, fmt, as_bytes=False),
        torch.full((rows, cols // 32), 0xAA, dtype=torch.uint8),
        _poisoned_fp8(shape, fmt, as_bytes=True),
        torch.full((rows // 32, cols), 0xAA, dtype=torch.uint8),
    )
    got = quantize_mxfp8(x, fp8_dtype=fmt, out=out)
    assert got is out
    q, s = quantize_mx(x, 1, 32, fmt)
    assert torch.equal(bits(got.rowwise_data), q)
    assert torch.equal(got.rowwise_scale_inv, s)
    q_c, s_c = quantize_mx(x, 32, 1, fmt)
    assert torch.equal(bits(got.columnwise_data), q_c)
    assert torch.equal(got.columnwise_scale_inv, s_c)
    assert got.rowwise_scale_inv.unique().numel() > 1


def test_mxfp8_exponent_bytes_by_hand() -> None:
    # Block amaxes 1.0 (2^0), 500 (2^8.97), 2^-130 (subnormal), 0, 3e38 for e4m3 (emax 8).
    x = torch.zeros(5, 32)
    x[:, 5] = torch.tensor([1.0, -500.0, 2.0**-130, 0.0, 3e38])
    x[:, 6] = x[:, 5] / 3
    got = quantize_mxfp8(x)
    assert got.rowwise_scale_inv.flatten().tolist() == [127 - 8, 127, 0, 0, 127 + 127 - 8]
    # 500 with scale 2^0 saturates to -448; 1.0 * 2^8 = 256 is exact.
    assert decode(got.rowwise_data, torch.float8_e4m3fn)[:2, 5].tolist() == [256.0, -448.0]
    got5 = quantize_mxfp8(x, fp8_dtype=torch.float8_e5m2)
    assert got5.rowwise_scale_inv.flatten().tolist()[:2] == [127 - 15, 127 - 15 + 8]


def test_mxfp8_nan_and_inf_blocks() -> None:
    x = torch.randn(32, 64)
    x[3, 40] = float("nan")  # rowwise block (3, 1); columnwise block (0, 40)
    x[7, 2] = -float("inf")  # rowwise block (7, 0); columnwise block (0, 2)
    got = quantize_mxfp8(x, columnwise=True, fp8_dtype=torch.float8_e4m3fn)
    assert got.rowwise_scale_inv[3, 1].item() == 0xFF
    assert got.rowwise_scale_inv[7, 0].item() == 254
    assert got.columnwise_scale_inv[0, 40].item() == 0xFF
    assert (bits(got.rowwise_data)[3, 32:] & 0x7F == 0x7F).all()  # the whole block is NaN
    assert bits(got.rowwise_data)[7, 2].item() == 0xFE  # -inf saturates to -448
    q, s = quantize_mx(x, 1, 32, torch.float8_e4m3fn)
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[3, 32:] = False
    assert torch.equal(bits(got.rowwise_data)[keep], q[keep])
    assert torch.equal(got.rowwise_scale_inv, s)


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=ids)
def test_mxfp8_dequantize(fmt: torch.dtype, out_dtype: torch.dtype) -> None:
    x = random_input((64, 96), torch.float32, seed=21)
    qt = quantize_mxfp8(x, fp8_dtype=fmt, columnwise=True)
    for data, scales, mode, br, bc in [
        (qt.rowwise_data, qt.rowwise_scale_inv, ScalingMode.MXFP8_ROWWISE, 1, 32),
        (qt.columnwise_data, qt.columnwise_scale_inv, ScalingMode.MXFP8_COLUMNWISE, 32, 1),
    ]:
        out = torch.full(x.shape, float("nan"), dtype=out_dtype)
        got = dequantize(data, scales.view(torch.float8_e8m0fnu), mode=mode, out=out)
        want = decode(data, fmt) * expand(e8m0_value(scales.long()), br, bc, x.shape)
        assert torch.equal(got, want.to(out_dtype))
        # Saturation of the block maximum can cost up to 1/8 in e4m3 (448 vs [256, 512)).
        rel = 2.0**-3  # e5m2: half an ulp; e4m3: saturation
        step = expand(e8m0_value(scales.long()), br, bc, x.shape) * 2.0**-9  # subnormal step
        assert ((got.float() - x).abs() <= x.abs() * (rel + 2.0**-8) + step).all()


# ---- argument validation ---------------------------------------------------------------------


def _e4(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.float8_e4m3fn)


def _f32(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.float32)


def _u8(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8)


X = torch.randn(8, 256)
S = torch.ones(1)

BAD_CALLS = {
    # compute_scale
    "scale-margin-negative": (lambda: compute_scale(S, margin=-1), r"margin must be .*got -1"),
    "scale-margin-large": (lambda: compute_scale(S, margin=200), r"margin .* got 200"),
    "scale-epsilon-negative": (lambda: compute_scale(S, epsilon=-1.0), "epsilon must be finite"),
    "scale-amax-fp16": (lambda: compute_scale(S.half()), r"amax must be a contiguous float32"),
    "scale-out-size": (
        lambda: compute_scale(torch.ones(2), out=(_f32((2,)), _f32((3,)))),
        r"scale_inv must be a contiguous float32 tensor of 2 elements, got float32\[3\]",
    ),
    "scale-format": (
        lambda: compute_scale(S, fp8_dtype=torch.bfloat16),
        "fp8_dtype must be float8_e4m3fn or float8_e5m2, got bfloat16",
    ),
    # cast_to_fp8
    "cast-x-float64": (
        lambda: cast_to_fp8(X.double(), S),
        "x must be float32, float16 or bfloat16",
    ),
    "cast-x-noncontig": (
        lambda: cast_to_fp8(X.t(), S),
        r"x must be contiguous.*strides \[1, 256\]",
    ),
    "cast-scale-shape": (
        lambda: cast_to_fp8(X, torch.ones(2)),
        "scale must be a contiguous float32 tensor of 1 element",
    ),
    "cast-scale-dtype": (lambda: cast_to_fp8(X, S.half()), r"scale must be .* got float16\[1\]"),
    "cast-out-shape": (
        lambda: cast_to_fp8(X, S, out=_e4((8, 255))),
        r"out must have shape \[8, 256\]",
    ),
    "cast-out-dtype": (
        lambda: cast_to_fp8(X, S, out=_f32((8, 256))),
        r"out must be uint8 or float8_e4m3fn",
    ),
    "cast-out-format-mismatch": (
        lambda: cast_to_fp8(X, S, fp8_dtype=torch.float8_e5m2, out=_e4((8, 256))),
        r"out must be uint8 or float8_e5m2 \(the requested fp8_dtype\), got float8_e4m3fn",
    ),
    "cast-amax-size": (
        lambda: cast_to_fp8(X, S, amax=_f32((2,))),
        "amax must be a contiguous float32",
    ),
    "cast-not-tensor": (lambda: cast_to_fp8([1.0], S), r"x to be a torch\.Tensor"),
    # cast_transpose
    "ct-3d": (lambda: cast_transpose(torch.randn(2, 3, 4), S), r"2-D \[rows, cols\]"),
    "ct-out-t-shape": (
        lambda: cast_transpose(X, S, out_t=_e4((8, 256))),
        r"out_t \(the transpose of x\) must have shape \[256, 8\]",
    ),
    "ct-out-without-rowwise": (
        lambda: cast_transpose(X, S, rowwise=False, out=_e4((8, 256))),
        "rowwise=False",
    ),
    # block scaling
    "block-scale-shape": (
        lambda: quantize_block_1x128(
            X, out=BlockScaledFP8(_e4((8, 256)), _f32((8, 3)), None, None)
        ),
        r"rowwise_scale_inv must have shape \[8, 2\], got float32\[8, 3\]",
    ),
    "block-scale-dtype": (
        lambda: quantize_block_128x128(
            X, out=BlockScaledFP8(_e4((8, 256)), _u8((1, 2)), None, None)
        ),
        "rowwise_scale_inv must be float32",
    ),
    "block-columnwise-not-transposed": (
        lambda: quantize_block_1x128(
            X, out=BlockScaledFP8(None, None, _e4((8, 256)), _f32((256, 1)))
        ),
        r"columnwise_data \(x transposed\) must have shape \[256, 8\]",
    ),
    "block-unpaired": (
        lambda: quantize_block_1x128(X, out=BlockScaledFP8(_e4((8, 256)), None, None, None)),
        "must be given together",
    ),
    "block-nothing": (
        lambda: quantize_block_1x128(X, rowwise=False, columnwise=False),
        "nothing to do",
    ),
    "block-epsilon-nan": (
        lambda: quantize_block_1x128(X, epsilon=float("nan")),
        "epsilon must be finite",
    ),
    "block-1d": (lambda: quantize_block_128x128(torch.randn(300)), r"2-D \[rows, cols\]"),
    "block-noncontig": (lambda: quantize_block_1x128(X.t()), "x must be contiguous"),
    # MXFP8
    "mx-ragged-cols": (
        lambda: quantize_mxfp8(torch.randn(32, 40)),
        r"cols must be a multiple of 32; got x float32\[32, 40\]",
    ),
    "mx-ragged-rows": (
        lambda: quantize_mxfp8(torch.randn(40, 32), rowwise=False, columnwise=True),
        r"rows must be a multiple of 32; got x float32\[40, 32\]",
    ),
    "mx-scale-float": (
        lambda: quantize_mxfp8(X, out=BlockScaledFP8(_e4((8, 256)), _f32((8, 8)), None, None)),
        r"must be uint8 \(or torch.float8_e8m0fnu\) E8M0 exponent bytes",
    ),
    "mx-columnwise-transposed": (
        lambda: quantize_mxfp8(
            torch.randn(32, 64), out=BlockScaledFP8(None, None, _e4((64, 32)), _u8((1, 64)))
        ),
        r"columnwise_data \(x's layout, not transposed\) must have shape \[32, 64\]",
    ),
    # dequantize
    "deq-scale-dtype": (
        lambda: dequantize(_e4((8, 256)), S.half()),
        "scale_inv must be a contiguous float32 tensor of 1 element",
    ),
    "deq-out-dtype": (
        lambda: dequantize(_e4((8, 256)), S, out_dtype=torch.float64),
        "out must be float32, bfloat16 or float16, got float64",
    ),
    "deq-block-scale-shape": (
        lambda: dequantize(_e4((8, 256)), _f32((8, 3)), mode=ScalingMode.BLOCK_1X128),
        r"scale_inv must have shape \[8, 2\]",
    ),
    "deq-mx-ragged": (
        lambda: dequantize(_e4((8, 40)), _u8((8, 2)), mode=ScalingMode.MXFP8_ROWWISE),
        r"whole number of 1x32 blocks, got float8_e4m3fn\[8, 40\]",
    ),
    "deq-scale-bf16": (
        lambda: dequantize(_e4((8, 256)), _f32((8, 2)).bfloat16(), mode=ScalingMode.BLOCK_1X128),
        "scale_inv must be float32 .* or uint8 E8M0",
    ),
    "deq-data-float": (lambda: dequantize(X, S), r"data must be uint8 or float8_e4m3fn"),
    "deq-mode": (lambda: dequantize(_e4((8, 256)), S, mode="tensor"), "mode must be a ScalingMode"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_rejects_bad_arguments(name: str) -> None:
    from overlap.errors import InvalidArgumentError

    call, match = BAD_CALLS[name]
    with pytest.raises(InvalidArgumentError, match=match):
        call()


# ---- device dispatch -------------------------------------------------------------------------


class _FakeCudaTensor:
    """Quacks like a CUDA tensor to the binding (which reads only these attributes); the
    core must refuse it before touching its memory."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t
        self.dtype = t.dtype
        self.shape = t.shape
        self.device = torch.device("cuda", 0)

    def data_ptr(self) -> int:
        return self._t.data_ptr()

    def stride(self) -> tuple[int, ...]:
        return self._t.stride()


def _device_calls(k, wrap):
    """One call per core entry point; every tensor argument goes through ``wrap`` in argument
    order (tensors are made inside the lambdas, so the first wrapped is the first argument)."""
    e4 = torch.float8_e4m3fn

    def x() -> object:
        return wrap(torch.randn(64, 64))

    def f32(*shape: int) -> object:
        return wrap(_f32(shape))

    def e4m3(*shape: int) -> object:
        return wrap(_e4(shape))

    def u8(*shape: int) -> object:
        return wrap(_u8(shape))

    return {
        "compute_scale": lambda: k.compute_scale(f32(1), f32(1), f32(1), fp8_dtype=e4),
        "cast_to_fp8": lambda: k.cast_to_fp8(x(), f32(1), e4m3(64, 64), f32(1), fp8_dtype=e4),
        "cast_transpose": lambda: k.cast_transpose(
            x(), f32(1), None, e4m3(64, 64), f32(1), fp8_dtype=e4
        ),
        "quantize_block_1x128": lambda: k.quantize_block_1x128(
            x(), rowwise_data=e4m3(64, 64), rowwise_scale_inv=f32(64, 1), fp8_dtype=e4
        ),
        "quantize_block_128x128": lambda: k.quantize_block_128x128(
            x(), columnwise_data=e4m3(64, 64), columnwise_scale_inv=f32(1, 1), fp8_dtype=e4
        ),
        "quantize_mxfp8": lambda: k.quantize_mxfp8(
            x(), rowwise_data=e4m3(64, 64), rowwise_scale_inv=u8(64, 2), fp8_dtype=e4
        ),
        "dequantize": lambda: k.dequantize(e4m3(64, 64), f32(1), f32(64, 64), fp8_dtype=e4),
        "dequantize_blocks": lambda: k.dequantize_blocks(
            e4m3(64, 64), u8(64, 2), f32(64, 64), fp8_dtype=e4, block_rows=1, block_cols=32
        ),
        "reduce_partials": lambda: k.reduce_partials(
            wrap(torch.randn(2, 64)), f32(64), out_format=torch.float32
        ),
    }


@pytest.mark.parametrize("op", list(_device_calls(None, lambda t: t)))
def test_mixed_devices_are_rejected_before_any_work(op: str) -> None:
    from overlap._native import native
    from overlap.errors import InvalidArgumentError

    # One CUDA tensor among host tensors is a device mismatch, named as such, found before
    # any memory is touched (the fake tensor's memory is host memory).
    fake_first = iter([True])

    def wrap_first(t: torch.Tensor) -> object:
        return _FakeCudaTensor(t) if next(fake_first, False) else t

    with pytest.raises(InvalidArgumentError, match="all tensors must be on one device"):
        _device_calls(native().kernels, wrap_first)[op]()


@pytest.mark.parametrize("op", list(_device_calls(None, lambda t: t)))
def test_cuda_tensors_without_a_usable_cuda(op: str) -> None:
    """Without CUDA support in the build the core says so; with it but without a GPU, the
    CUDA runtime's error surfaces (the fake tensors' host memory is never launched on)."""
    import overlap
    from overlap._native import native
    from overlap.errors import CudaError, UnsupportedHardwareError

    if overlap.cuda_available():
        pytest.skip("a GPU is present: fake CUDA tensors would be launched on")
    if overlap.build_info()["cuda_compiled"]:
        expected, match = CudaError, "cuda"
    else:
        expected, match = UnsupportedHardwareError, "no CUDA support"
    with pytest.raises(expected, match=match):
        _device_calls(native().kernels, _FakeCudaTensor)[op]()


def test_cuda_scales_must_not_alias() -> None:
    """NOTE [scalar aliasing]: refused on CUDA before any GPU work (host aliasing is fine)."""
    from overlap._native import native
    from overlap.errors import InvalidArgumentError

    k = native().kernels
    e4 = torch.float8_e4m3fn
    x, out = _FakeCudaTensor(torch.randn(64)), _FakeCudaTensor(_e4((64,)))
    s, s_inv = _FakeCudaTensor(torch.ones(1)), _FakeCudaTensor(torch.ones(1))
    with pytest.raises(InvalidArgumentError, match="scale and scale_inv must not share memory"):
        k.cast_to_fp8(x, s, out, s, fp8_dtype=e4)
    with pytest.raises(InvalidArgumentError, match="scale and amax must not share memory"):
        k.cast_to_fp8(x, s, out, s_inv, fp8_dtype=e4, amax=s)
    with pytest.raises(InvalidArgumentError, match="scale and scale_inv must not share memory"):
        k.reduce_partials(
            _FakeCudaTensor(torch.randn(2, 64)), out, out_format=e4, scale=s, scale_inv=s
        )
    # On the host the scale is read first, so aliasing it is allowed.
    host_s = torch.tensor([2.0])
    q, _ = cast_to_fp8(torch.randn(64), host_s, scale_inv=host_s)
    assert host_s.item() == 0.5 and q.dtype == e4

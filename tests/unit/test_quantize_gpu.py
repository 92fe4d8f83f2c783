"""CUDA quantization and reduction kernels, bit-exact against the host references.

Every kernel runs on CUDA tensors and is compared byte for byte with the host reference run
on CPU copies of the same inputs, and with a pure-torch reference (torch's float8 casts of
the same scaled values, on the GPU where the reference is elementwise). Inputs are fresh
random values (never zeros), outputs are poisoned before each call, shapes are ragged where
the format allows, and data pointers are unaligned (slice offsets) to reach the scalar paths.

NaN: the CUDA kernels encode a NaN as the hardware's canonical NaN (FP8 0x7F, whatever the
sign), the host reference keeps the sign (0xFF for -NaN); NaN positions are compared as
``byte & 0x7F == 0x7F`` (see NOTE [bit-exact kernels] in csrc/kernels/device_utils.cuh).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError  # noqa: E402
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
    reduce_partials,
)
from tests.unit.fp8_reference import (  # noqa: E402
    FP8_DTYPES,
    FP8_MAX,
    bits,
    fp8_bits,
    ids,
    ordered_sum,
    partials,
    quantize_blocks,
    quantize_mx,
    random_input,
    scale_from_amax,
)

pytestmark = pytest.mark.gpu

IN_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Ragged, tiny, tile-sized and multi-tile shapes (tiles are 128 x 128).
SHAPES = [(1, 1), (7, 129), (130, 257), (128, 256), (256, 128), (3, 1000), (1000, 3), (384, 640)]
OFFSETS = [0, 1]  # element offset of every tensor's data pointer (1: the unaligned paths)


def _shape_id(s: tuple[int, ...]) -> str:
    return "x".join(map(str, s))


def _gpu(t: torch.Tensor, offset: int = 0, device: str = "cuda") -> torch.Tensor:
    """A contiguous copy of t on the GPU whose data pointer is `offset` elements into its
    storage (offset 1 misaligns every vector access)."""
    base = torch.empty(t.numel() + offset, dtype=t.dtype, device=device)
    out = base[offset:].view(t.shape)
    out.copy_(t)
    return out


def _poisoned(shape, dtype, offset: int = 0, device: str = "cuda") -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        t.fill_(float("nan"))
    else:
        bits(t).fill_(0xAB)
    return _gpu(t, offset, device)


def _fp8_out(shape, fmt, offset: int, as_bytes: bool) -> torch.Tensor:
    return _poisoned(shape, torch.uint8 if as_bytes else fmt, offset)


def _assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """FP8 bytes equal, NaN bytes compared as NaN (either sign)."""
    g, w = bits(got).cpu(), bits(want).cpu()
    nan_g, nan_w = (g & 0x7F) == 0x7F, (w & 0x7F) == 0x7F
    assert torch.equal(nan_g, nan_w), "NaN positions differ"
    mismatch = (g != w) & ~nan_w
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} of {g.numel()} bytes differ; first at "
        f"{mismatch.nonzero()[0].tolist()}: got {g[mismatch][0]:#x}, want {w[mismatch][0]:#x}"
    )


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Float tensors equal bit for bit (NaN where NaN)."""
    g, w = got.cpu(), want.cpu()
    assert g.dtype == w.dtype and g.shape == w.shape
    nan_g, nan_w = torch.isnan(g.float()), torch.isnan(w.float())
    assert torch.equal(nan_g, nan_w), "NaN positions differ"
    assert torch.equal(g[~nan_w], w[~nan_w])


def _assert_outputs_equal(got: BlockScaledFP8, host: BlockScaledFP8) -> None:
    """Data as FP8 bytes (NaN either sign), scales exactly (float32 or E8M0 bytes)."""
    for i, (g, h) in enumerate(zip(got, host, strict=True)):
        assert (g is None) == (h is None), f"output {i}"
        if g is None:
            continue
        if i % 2 == 0:
            _assert_bits_equal(g, h)
        elif g.dtype == torch.float32:
            _assert_same(g, h)
        else:
            assert torch.equal(g.cpu(), h), f"scale output {i} differs"


# ---- compute_scale ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("power_of_2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize(("margin", "eps"), [(0, 0.0), (3, 0.0), (0, 1e-4), (127, 0.0)])
def test_compute_scale_cuda(fmt: torch.dtype, power_of_2: bool, margin: int, eps: float) -> None:
    g = torch.Generator().manual_seed(margin + 7)
    amax = torch.rand(4099, generator=g) * torch.pow(
        2.0, torch.randint(-60, 60, (4099,), generator=g)
    )
    special = [0.0, 1e-45, 1e-39, 1.17e-38, 3e38, float("inf"), float("nan"), 1e-3, 448.0]
    amax = torch.cat([amax, torch.tensor(special)])
    kwargs = dict(fp8_dtype=fmt, margin=margin, power_of_2=power_of_2, epsilon=eps)
    out = (_poisoned(amax.shape, torch.float32, 1), _poisoned(amax.shape, torch.float32))
    scale, scale_inv = compute_scale(_gpu(amax, 1), out=out, **kwargs)
    assert scale is out[0] and scale.is_cuda
    host_scale, host_inv = compute_scale(amax, **kwargs)
    _assert_same(scale, host_scale)
    _assert_same(scale_inv, host_inv)
    _assert_same(scale, scale_from_amax(amax, fmt, margin=margin, power_of_2=power_of_2, eps=eps))


# ---- per-tensor casts ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("n", [1, 7, 4097, (1 << 20) + 3])
@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"off{o}")
def test_cast_to_fp8_cuda(fmt: torch.dtype, dtype: torch.dtype, n: int, offset: int) -> None:
    x = random_input((n,), dtype, seed=n + offset)
    x[n // 2] = -float("nan") if n > 2 else x[n // 2]
    finite = x[~torch.isnan(x.float())]
    scale = torch.tensor([FP8_MAX[fmt] / finite.float().abs().max().item() * 2])  # saturates
    xg = _gpu(x, offset)
    out = _fp8_out((n,), fmt, offset, as_bytes=offset == 1)
    scale_inv, amax = _poisoned((1,), torch.float32), _poisoned((1,), torch.float32)
    got, got_inv = cast_to_fp8(
        xg, scale.cuda(), fp8_dtype=fmt, out=out, scale_inv=scale_inv, amax=amax
    )
    assert got is out and got_inv is scale_inv
    host, host_inv = cast_to_fp8(x, scale, fp8_dtype=fmt, amax=(host_amax := torch.empty(1)))
    _assert_bits_equal(out, host)
    _assert_bits_equal(out, fp8_bits(xg.float() * scale.cuda(), fmt))  # torch on the GPU
    _assert_same(scale_inv, host_inv)
    _assert_same(amax, host_amax)


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"off{o}")
def test_cast_transpose_cuda(
    fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int], offset: int
) -> None:
    x = random_input(shape, dtype, seed=shape[0] * 3 + shape[1] + offset)
    scale = torch.tensor([FP8_MAX[fmt] / x.float().abs().max().item() * 4])
    xg = _gpu(x, offset)
    out = _fp8_out(shape, fmt, offset, as_bytes=False)
    out_t = _fp8_out(shape[::-1], fmt, offset, as_bytes=True)
    amax = _poisoned((1,), torch.float32)
    got, got_t, scale_inv = cast_transpose(
        xg, scale.cuda(), fp8_dtype=fmt, out=out, out_t=out_t, amax=amax
    )
    assert got is out and got_t is out_t
    want = fp8_bits(xg.float() * scale.cuda(), fmt)
    _assert_bits_equal(out, want)
    _assert_bits_equal(out_t, want.t().contiguous())
    host, host_t, host_inv = cast_transpose(
        x, scale, fp8_dtype=fmt, amax=(h_amax := torch.empty(1))
    )
    _assert_bits_equal(out, host)
    _assert_bits_equal(out_t, host_t)
    _assert_same(scale_inv, host_inv)
    _assert_same(amax, h_amax)


@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise-only", "columnwise-only"])
def test_cast_transpose_cuda_one_direction(rowwise: bool) -> None:
    from overlap._native import native

    x = random_input((200, 300), torch.bfloat16, seed=5)
    xg, scale = _gpu(x), torch.tensor([3.0], device="cuda")
    want = fp8_bits(xg.float() * scale, torch.float8_e4m3fn)
    if rowwise:  # the wrapper always makes out_t; the core takes either alone
        out = _fp8_out((200, 300), torch.float8_e4m3fn, 0, as_bytes=False)
        scale_inv = _poisoned((1,), torch.float32)
        stream = torch.cuda.current_stream().cuda_stream
        native().kernels.cast_transpose(
            xg, scale, out, None, scale_inv, fp8_dtype=torch.float8_e4m3fn, stream=stream
        )
        _assert_bits_equal(out, want)
        _assert_same(scale_inv, 1.0 / scale)
    else:
        got, got_t, _ = cast_transpose(xg, scale, rowwise=False)
        assert got is None
        _assert_bits_equal(got_t, want.t().contiguous())


def test_cast_nan_and_inf_cuda() -> None:
    x = torch.randn(4, 300, device="cuda")
    x[1, 7], x[2, 200], x[3, 5] = float("nan"), float("inf"), -float("nan")
    amax = _poisoned((1,), torch.float32)
    q, q_t, _ = cast_transpose(x, torch.tensor([2.0], device="cuda"), amax=amax)
    assert torch.isnan(amax).all()
    assert bits(q)[1, 7].item() & 0x7F == 0x7F and bits(q)[2, 200].item() == 0x7E  # inf -> 448
    _assert_bits_equal(q_t, bits(q).t().contiguous())


# ---- block scaling ---------------------------------------------------------------------------


def _poisoned_blocks(shape, fmt, br: int, offset: int) -> BlockScaledFP8:
    rows, cols = shape
    return BlockScaledFP8(
        _fp8_out((rows, cols), fmt, offset, as_bytes=False),
        _poisoned((-(-rows // br), -(-cols // 128)), torch.float32, offset),
        _fp8_out((cols, rows), fmt, offset, as_bytes=True),
        _poisoned((-(-cols // br), -(-rows // 128)), torch.float32, offset),
    )


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("two_d", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize(
    "options",
    [(False, 0.0, 0), (True, 0.0, 0), (False, 1e-3, 1), (True, 1e-3, 1)],
    ids=["exact", "pow2", "eps-off1", "pow2-eps-off1"],
)
def test_block_scaling_cuda(
    fmt: torch.dtype,
    dtype: torch.dtype,
    shape: tuple[int, int],
    two_d: bool,
    options: tuple[bool, float, int],
) -> None:
    power_of_2, eps, offset = options  # (power-of-two scales, epsilon, pointer offset)
    x = random_input(shape, dtype, seed=shape[0] + 5 * shape[1] + offset)
    if x.numel() > 64:
        x.view(-1)[17] = 1e-6  # a block that epsilon caps (with x's other small values)
    quantize = quantize_block_128x128 if two_d else quantize_block_1x128
    br = 128 if two_d else 1
    kwargs = dict(fp8_dtype=fmt, power_of_2=power_of_2, epsilon=eps)
    out = _poisoned_blocks(shape, fmt, br, offset)
    got = quantize(_gpu(x, offset), out=out, **kwargs)
    assert got is out
    host = quantize(x, rowwise=True, columnwise=True, **kwargs)
    _assert_outputs_equal(got, host)
    q, s_inv = quantize_blocks(x, br, 128, fmt, power_of_2=power_of_2, eps=eps)
    _assert_bits_equal(got.rowwise_data, q)
    _assert_same(got.rowwise_scale_inv, s_inv)
    q_t, s_inv_t = quantize_blocks(x.t(), br, 128, fmt, power_of_2=power_of_2, eps=eps)
    _assert_bits_equal(got.columnwise_data, q_t)
    _assert_same(got.columnwise_scale_inv, s_inv_t)


@pytest.mark.parametrize("two_d", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_block_scaling_cuda_one_direction(two_d: bool, direction: str) -> None:
    x = random_input((300, 200), torch.bfloat16, seed=3)
    quantize = quantize_block_128x128 if two_d else quantize_block_1x128
    rowwise = direction == "rowwise"
    got = quantize(x.cuda(), rowwise=rowwise, columnwise=not rowwise)
    host = quantize(x, rowwise=rowwise, columnwise=not rowwise)
    _assert_outputs_equal(got, host)


def test_block_scaling_cuda_special_blocks() -> None:
    x = torch.randn(4, 512)
    x[0, :128] = 0.0
    x[1, 130] = float("nan")
    x[2, 300] = float("inf")
    x[3, 384:] = 1e-30
    for eps in (0.0, 1e-6):
        got = quantize_block_1x128(x.cuda(), columnwise=True, epsilon=eps)
        host = quantize_block_1x128(x, columnwise=True, epsilon=eps)
        _assert_same(got.rowwise_scale_inv, host.rowwise_scale_inv)
        _assert_same(got.columnwise_scale_inv, host.columnwise_scale_inv)
        _assert_bits_equal(got.rowwise_data, host.rowwise_data)
        _assert_bits_equal(got.columnwise_data, host.columnwise_data)


# ---- MXFP8 -----------------------------------------------------------------------------------


MX_SHAPES = [(32, 32), (64, 96), (96, 64), (32, 1024), (160, 32), (416, 288)]


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("shape", MX_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"off{o}")
def test_mxfp8_cuda(fmt: torch.dtype, dtype: torch.dtype, shape: tuple[int, int], offset) -> None:
    x = random_input(shape, dtype, seed=shape[0] * 3 + shape[1] + offset)
    x.view(-1)[5] = 2.0**-130 if dtype == torch.float32 else x.view(-1)[5]  # a subnormal
    rows, cols = shape
    out = BlockScaledFP8(
        _fp8_out(shape, fmt, offset, as_bytes=False),
        _poisoned((rows, cols // 32), torch.uint8, offset),
        _fp8_out(shape, fmt, offset, as_bytes=True),
        _poisoned((rows // 32, cols), torch.uint8, offset),
    )
    got = quantize_mxfp8(_gpu(x, offset), fp8_dtype=fmt, out=out)
    host = quantize_mxfp8(x, fp8_dtype=fmt, rowwise=True, columnwise=True)
    _assert_outputs_equal(got, host)
    q, s = quantize_mx(x, 1, 32, fmt)
    _assert_bits_equal(got.rowwise_data, q)
    assert torch.equal(got.rowwise_scale_inv.cpu(), s)
    q_c, s_c = quantize_mx(x, 32, 1, fmt)
    _assert_bits_equal(got.columnwise_data, q_c)
    assert torch.equal(got.columnwise_scale_inv.cpu(), s_c)


def test_mxfp8_cuda_ragged_directions_and_specials() -> None:
    # Rows not a multiple of 32 are fine rowwise; cols not a multiple of 32 fine columnwise.
    x = random_input((45, 64), torch.bfloat16, seed=1)
    x[3, 40], x[7, 2] = float("nan"), -float("inf")
    _assert_outputs_equal(quantize_mxfp8(x.cuda()), quantize_mxfp8(x))
    x = random_input((64, 45), torch.float32, seed=2)
    got = quantize_mxfp8(x.cuda(), rowwise=False, columnwise=True)
    _assert_outputs_equal(got, quantize_mxfp8(x, rowwise=False, columnwise=True))
    with pytest.raises(InvalidArgumentError, match="cols must be a multiple of 32"):
        quantize_mxfp8(torch.randn(32, 40, device="cuda"))
    with pytest.raises(InvalidArgumentError, match="rows must be a multiple of 32"):
        quantize_mxfp8(torch.randn(40, 32, device="cuda"), rowwise=False, columnwise=True)


# ---- dequantize ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FP8_DTYPES, ids=ids)
@pytest.mark.parametrize("out_dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("offset", OFFSETS, ids=lambda o: f"off{o}")
def test_dequantize_cuda(fmt: torch.dtype, out_dtype: torch.dtype, offset: int) -> None:
    x = random_input((130, 264), torch.float32, seed=4)
    cases = [(ScalingMode.TENSOR, cast_to_fp8(x, torch.tensor([7.0]), fp8_dtype=fmt))]
    for mode, quantize in [
        (ScalingMode.BLOCK_1X128, quantize_block_1x128),
        (ScalingMode.BLOCK_128X128, quantize_block_128x128),
    ]:
        qt = quantize(x, fp8_dtype=fmt, columnwise=True)
        cases += [(mode, qt[:2]), (mode, qt[2:])]
    mx = quantize_mxfp8(x[:128, :256].contiguous(), fp8_dtype=fmt, columnwise=True)
    cases += [(ScalingMode.MXFP8_ROWWISE, mx[:2]), (ScalingMode.MXFP8_COLUMNWISE, mx[2:])]
    for mode, (data, scale_inv) in cases:
        out = _poisoned(data.shape, out_dtype, offset)
        got = dequantize(
            _gpu(data, offset), _gpu(scale_inv, offset), mode=mode, fp8_dtype=fmt, out=out
        )
        assert got is out
        want = dequantize(data, scale_inv, mode=mode, fp8_dtype=fmt, out_dtype=out_dtype)
        _assert_same(got, want)


# ---- reduction -------------------------------------------------------------------------------


OUT_FORMATS = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]


def _reduce_scale(acc: torch.Tensor, fmt: torch.dtype) -> torch.Tensor | None:
    """A CPU float32[1] scale that saturates some of the sum (None for non-FP8 outputs)."""
    if fmt not in FP8_DTYPES:
        return None
    return torch.tensor([FP8_MAX[fmt] / acc.abs().max().item() * 2])


def _cuda(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.cuda() if t is not None else None


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=ids)
@pytest.mark.parametrize("out_format", OUT_FORMATS, ids=ids)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("n", "offset"), [(1, 0), (4099, 0), (4099, 1), (1 << 18, 0)])
def test_reduce_partials_cuda(
    dtype: torch.dtype, out_format: torch.dtype, k: int, n: int, offset: int
) -> None:
    p = partials(k, (n,), dtype, seed=k * 31 + n)
    acc = ordered_sum(p)
    scale = _reduce_scale(acc, out_format)
    fp8 = scale is not None
    out = _poisoned((n,), out_format, offset)
    scale_inv = _poisoned((1,), torch.float32) if fp8 else None
    amax = _poisoned((1,), torch.float32)
    got = reduce_partials(
        _gpu(p, offset),
        out_dtype=out_format,
        scale=_cuda(scale),
        scale_inv=scale_inv,
        amax=amax,
        out=out,
    )
    assert got is out
    h_inv, h_amax = torch.empty(1) if fp8 else None, torch.empty(1)
    host = reduce_partials(p, out_dtype=out_format, scale=scale, scale_inv=h_inv, amax=h_amax)
    _assert_same(amax, h_amax)
    _assert_same(amax, acc.abs().max().reshape(1))
    if fp8:
        _assert_bits_equal(out, host)
        _assert_bits_equal(out, fp8_bits(acc.cuda() * scale.cuda(), out_format))
        _assert_same(scale_inv, h_inv)
    else:
        _assert_same(out, host)
        _assert_same(out, acc.to(out_format))


def test_reduce_partials_cuda_nan_and_negative_zero() -> None:
    p = torch.tensor([[-0.0, 1.0, 2.0] * 11, [-0.0, float("nan"), 3.0] * 11], device="cuda")
    amax = _poisoned((1,), torch.float32)
    got = reduce_partials(p, amax=amax)
    assert got[0].item() == 0.0 and torch.signbit(got[0]).item()
    assert torch.isnan(got[1]).item() and got[2].item() == 5.0
    assert torch.isnan(amax).all()


def _reduce_tensors(inputs, out, **kwargs) -> None:
    from overlap._native import native

    stream = torch.cuda.current_stream(out.device).cuda_stream if out.is_cuda else 0
    native().kernels.reduce_tensors(inputs, out, stream=stream, **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8, 64])
@pytest.mark.parametrize(
    "out_format", [torch.bfloat16, torch.float32, torch.float8_e4m3fn], ids=ids
)
@pytest.mark.parametrize("max_blocks", [0, 1, 5])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_reduce_pointers_cuda(k: int, out_format: torch.dtype, max_blocks: int, aligned: bool):
    n = 8 * 1000 + 3
    p = partials(k, (n,), torch.bfloat16, seed=k + max_blocks)
    # Separate allocations, as a reduce-scatter's peer buffers are; one of them misaligned.
    inputs = [_gpu(p[i], 0 if aligned or i != k // 2 else 1) for i in range(k)]
    acc = ordered_sum(p)
    scale = _reduce_scale(acc, out_format)
    out = _poisoned((n,), out_format)
    amax = _poisoned((1,), torch.float32)
    scale_inv = _poisoned((1,), torch.float32) if scale is not None else None
    _reduce_tensors(
        inputs,
        out,
        out_format=out_format,
        scale=_cuda(scale),
        scale_inv=scale_inv,
        amax=amax,
        max_blocks=max_blocks,
    )
    host = torch.empty((n,), dtype=out_format)
    h_amax = torch.empty(1)
    _reduce_tensors(
        [t.cpu() for t in inputs],
        host,
        out_format=out_format,
        scale=scale,
        amax=h_amax,
    )
    _assert_same(amax, h_amax)
    if scale is None:
        _assert_same(out, host)
    else:
        _assert_bits_equal(out, host)
        _assert_same(scale_inv, 1.0 / scale)


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_reduce_pointers_cuda_out_aliases_an_input(aligned: bool) -> None:
    n = 4096 + 5
    p = partials(3, (n,), torch.float32, seed=3)
    inputs = [_gpu(p[i], 0 if aligned else 1) for i in range(3)]
    _reduce_tensors(inputs, inputs[1], out_format=torch.float32)  # in place into partial 1
    _assert_same(inputs[1], ordered_sum(p))


def test_reduce_pointers_cuda_rejects() -> None:
    x = [torch.randn(16, device="cuda") for _ in range(65)]
    out = torch.empty(16, device="cuda")
    with pytest.raises(InvalidArgumentError, match="at most 64"):
        _reduce_tensors(x, out, out_format=torch.float32)
    with pytest.raises(InvalidArgumentError, match="one device"):
        _reduce_tensors([x[0], x[1].cpu()], out, out_format=torch.float32)
    with pytest.raises(InvalidArgumentError, match="dtype and shape of inputs"):
        _reduce_tensors([x[0], x[1][:8]], out, out_format=torch.float32)
    s = torch.ones(1, device="cuda")
    with pytest.raises(InvalidArgumentError, match="must not share memory"):
        _reduce_tensors(x[:2], out.to(torch.uint8), out_format=torch.float8_e4m3fn, scale=s, amax=s)


# ---- devices and streams ---------------------------------------------------------------------


def test_mixed_devices_rejected_with_real_tensors() -> None:
    x = torch.randn(64, 128, device="cuda")
    with pytest.raises(InvalidArgumentError, match="all tensors must be on one device"):
        cast_to_fp8(x, torch.ones(1))
    with pytest.raises(InvalidArgumentError, match="all tensors must be on one device"):
        reduce_partials(x.view(2, 32, 128), out=torch.empty(32, 128))


def test_kernels_run_on_the_current_stream() -> None:
    x = random_input((1024, 1024), torch.bfloat16, seed=9).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = quantize_block_1x128(x, columnwise=True)
        s = reduce_partials(x.view(4, 256, 1024))
    side.synchronize()
    host = quantize_block_1x128(x.cpu(), columnwise=True)
    _assert_bits_equal(got.rowwise_data, host.rowwise_data)
    _assert_bits_equal(got.columnwise_data, host.columnwise_data)
    _assert_same(s, reduce_partials(x.cpu().view(4, 256, 1024)))


@pytest.mark.gpu(2)
def test_kernels_on_a_non_current_device() -> None:
    x = random_input((300, 260), torch.bfloat16, seed=11)
    xg = x.to("cuda:1")
    with torch.cuda.device(0):
        q, q_t, s_inv = cast_transpose(xg, torch.tensor([5.0], device="cuda:1"))
        blocks = quantize_block_128x128(xg, columnwise=True)
        mx = quantize_mxfp8(xg[:288, :256].contiguous(), columnwise=True)
        red = reduce_partials(xg.view(2, 150, 260), out_dtype=torch.float32)
        deq = dequantize(q, s_inv)
    torch.cuda.synchronize(1)
    assert q.device == xg.device and red.device == xg.device
    hq, hq_t, _ = cast_transpose(x, torch.tensor([5.0]))
    _assert_bits_equal(q, hq)
    _assert_bits_equal(q_t, hq_t)
    hb = quantize_block_128x128(x, columnwise=True)
    _assert_bits_equal(blocks.columnwise_data, hb.columnwise_data)
    _assert_same(blocks.rowwise_scale_inv, hb.rowwise_scale_inv)
    hmx = quantize_mxfp8(x[:288, :256].contiguous(), columnwise=True)
    _assert_bits_equal(mx.columnwise_scale_inv, hmx.columnwise_scale_inv)
    _assert_same(red, reduce_partials(x.view(2, 150, 260), out_dtype=torch.float32))
    _assert_same(deq, dequantize(hq, torch.tensor([0.2])))

"""The host reference GEMM (CPU tensors) against a pure-torch float64 reference, and every
argument check of overlap.gemm (the host path runs the same validation as the GPU path)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError, UnsupportedHardwareError  # noqa: E402
from overlap.gemm import gemm, gemm_cache_stats  # noqa: E402
from overlap.quantization import ScalingMode  # noqa: E402
from tests.unit.gemm_reference import (  # noqa: E402
    block_fp8,
    per_tensor_fp8,
    randn,
    reference,
    run_fp8,
    scales,
    to_fp8,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
M, N, K = 24, 48, 64

# The host rounds float64 once to the output dtype; torch's float64 matmul sums in another
# order, so the two may differ by one unit in the last place of the output dtype.
ULP = {torch.float32: 2e-7, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def stored(x: torch.Tensor, trans: bool) -> torch.Tensor:
    """The stored form of an operand whose op() is x."""
    return x.T.contiguous() if trans else x


def close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(y.double(), ref.to(dtype).double(), rtol=ULP[dtype], atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("wide_out", [False, True], ids=["out=in", "out=fp32"])
def test_float_inputs_every_layout(dtype, transa, transb, wide_out) -> None:
    a = stored(randn(M, K, dtype=dtype, seed=1), transa)
    b = stored(randn(K, N, dtype=dtype, seed=2), transb)
    out_dtype = torch.float32 if wide_out else dtype
    y = gemm(a, b, transa=transa, transb=transb, out_dtype=out_dtype)
    assert y.shape == (M, N) and y.dtype == out_dtype
    close(y, reference(a, b, transa=transa, transb=transb), out_dtype)


def test_alpha_beta_accumulate_into_fp32() -> None:
    """wgrad into main_grad: float32 out += alpha * a^T b (bf16 inputs)."""
    a = randn(K, M, dtype=torch.bfloat16, seed=3)
    b = randn(K, N, dtype=torch.bfloat16, seed=4)
    main_grad = randn(M, N, seed=5)
    old = main_grad.clone()
    gemm(a, b, transa=True, out=main_grad, alpha=0.5, beta=1.0)
    close(main_grad, reference(a, b, transa=True, alpha=0.5, beta=1.0, old=old), torch.float32)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bias_and_gelu(gelu, with_bias) -> None:
    a = randn(M, K, dtype=torch.bfloat16, seed=6)
    b = randn(N, K, dtype=torch.bfloat16, seed=7)
    bias = randn(N, dtype=torch.bfloat16, seed=8) if with_bias else None
    y = gemm(a, b, transb=True, bias=bias, gelu=gelu)
    close(y, reference(a, b, transb=True, bias=bias, gelu=gelu), torch.bfloat16)


def test_gelu_is_the_tanh_approximation() -> None:
    v = torch.linspace(-4, 4, 64, dtype=torch.float64)
    ref = torch.nn.functional.gelu(v, approximate="tanh")
    # op(a) @ op(b) with a = v as a column and b = [[1]]: out = gelu(v).
    a = torch.zeros(64, 16, dtype=torch.float32)
    a[:, 0] = v.float()
    b = torch.zeros(16, 4, dtype=torch.float32)
    b[0, :] = 1.0
    y = gemm(a, b, gelu=True)
    torch.testing.assert_close(y[:, 0].double(), ref, rtol=1e-6, atol=1e-7)


def test_row_offset_into_poisoned_buffer_with_wide_rows() -> None:
    """A chunk written into rows [8, 8+M) of a larger NaN-poisoned buffer whose rows are
    wider than n (a column slice): nothing else changes, NaN is never read (beta = 0)."""
    big = torch.full((8 + M + 5, N + 24), float("nan"), dtype=torch.bfloat16)
    out = big[:, :N]
    a = randn(M, K, dtype=torch.bfloat16, seed=9)
    b = randn(N, K, dtype=torch.bfloat16, seed=10)
    y = gemm(a, b, transb=True, out=out, row_offset=8)
    assert y.data_ptr() == out[8].data_ptr() and y.shape == (M, N)
    close(big[8 : 8 + M, :N], reference(a, b, transb=True), torch.bfloat16)
    assert big[:8].isnan().all() and big[8 + M :].isnan().all() and big[:, N:].isnan().all()


def test_returns_out_itself_when_every_row_is_written() -> None:
    """No view is made when the GEMM fills all of out (NOTE [gemm host path]); the result is
    the same as with a fresh output, and row_offset 0 of a taller out is still a view."""
    a = randn(M, K, dtype=torch.bfloat16, seed=3)
    b = randn(N, K, dtype=torch.bfloat16, seed=4)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    assert gemm(a, b, transb=True, out=out) is out
    assert torch.equal(out, gemm(a, b, transb=True))
    taller = torch.full((M + 3, N), float("nan"), dtype=torch.bfloat16)
    y = gemm(a, b, transb=True, out=taller)
    assert y is not taller and y.shape == (M, N) and y.data_ptr() == taller.data_ptr()
    assert torch.equal(y, out) and taller[M:].isnan().all()


@pytest.mark.parametrize(
    "fa, fb",
    [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)],
    ids=["e4m3xe4m3", "e4m3xe5m2", "e5m2xe4m3"],
)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fp8_per_tensor(fa, fb, out_dtype) -> None:
    qa = per_tensor_fp8(randn(M, K, seed=11), fa)
    qb = per_tensor_fp8(randn(N, K, seed=12), fb)
    y = torch.empty(M, N, dtype=out_dtype)
    close(y, run_fp8(qa, qb, y), out_dtype)


def test_fp8_non_tn_layout_runs_on_host() -> None:
    """The TN rule is sm_90's; the host reference computes any layout."""
    qa = per_tensor_fp8(randn(K, 32, seed=13), E4M3)  # stored [k, m], 32-byte rows
    qb = per_tensor_fp8(randn(K, N, seed=14), E4M3)  # stored [k, n]
    y = gemm(qa.data, qb.data, transa=True, **scales(qa, qb))
    ref = reference(qa.data, qb.data, transa=True, **scales(qa, qb))
    close(y, ref, torch.bfloat16)


@pytest.mark.parametrize("out_fmt", [E4M3, E5M2], ids=str)
def test_fp8_output_scale_and_amax(out_fmt) -> None:
    qa = per_tensor_fp8(randn(M, K, seed=15), E4M3)
    qb = per_tensor_fp8(randn(N, K, seed=16), E5M2)
    bias = randn(N, dtype=torch.bfloat16, seed=17)
    amax = torch.full((1,), float("nan"))
    y = torch.empty(M, N, dtype=out_fmt)
    v = run_fp8(qa, qb, y, bias=bias, out_scale=torch.tensor([3.0]), out_amax=amax)
    torch.testing.assert_close(amax, v.abs().max().float().reshape(1), rtol=1e-6, atol=0)
    # One unit in the last place of the FP8 format at most (rounding ties of v * scale).
    torch.testing.assert_close(
        y.double(), to_fp8(v, 3.0, out_fmt).double(), rtol=0.13, atol=2.0**-6
    )
    exact = (y.view(torch.uint8) == to_fp8(v, 3.0, out_fmt).view(torch.uint8)).double().mean()
    assert exact > 0.95


@pytest.mark.parametrize(
    "a_mode, b_mode",
    [
        (ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_128X128),
        (ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_1X128),
        (ScalingMode.BLOCK_128X128, ScalingMode.BLOCK_1X128),
    ],
    ids=["1x128*128x128", "1x128*1x128", "128x128*1x128"],
)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_block_scaled_fp8_with_partial_blocks(a_mode, b_mode, out_dtype) -> None:
    """k = 320 and n = 136 leave partial 128-blocks; scales come from overlap's quantizers."""
    m, n, k = 36, 136, 320
    qa = block_fp8(randn(m, k, seed=18) * torch.linspace(0.01, 10, k), E4M3, a_mode)
    qb = block_fp8(randn(n, k, seed=19), E4M3, b_mode)
    bias = randn(n, dtype=torch.bfloat16, seed=20)
    y = torch.empty(m, n, dtype=out_dtype)
    close(y, run_fp8(qa, qb, y, bias=bias), out_dtype)


def test_cache_stats_are_zero_without_gpu_gemms() -> None:
    stats = gemm_cache_stats(0)
    assert set(stats) == {"hits", "misses", "entries", "tuned"}


# ---- argument validation --------------------------------------------------------------------


def fp8_pair(fa=E4M3, fb=E4M3, m=M, n=N, k=K):
    return per_tensor_fp8(randn(m, k, seed=21), fa), per_tensor_fp8(randn(n, k, seed=22), fb)


def test_rejects_mismatched_inner_dimensions() -> None:
    a, b = randn(M, K), randn(N, K)
    with pytest.raises(InvalidArgumentError, match="inner dimensions differ"):
        gemm(a, b)


def test_rejects_mixed_dtypes() -> None:
    with pytest.raises(InvalidArgumentError, match="both be FP8 or both have the same dtype"):
        gemm(randn(M, K, dtype=torch.bfloat16), randn(K, N, dtype=torch.float16))
    qa, _ = fp8_pair()
    with pytest.raises(InvalidArgumentError, match="both be FP8"):
        gemm(qa.data, randn(N, K, dtype=torch.bfloat16), transb=True, a_scale_inv=qa.scale_inv)


def test_rejects_uint8_and_unsupported_dtypes() -> None:
    a = torch.zeros(M, K, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match="view raw FP8 bytes as their FP8 dtype"):
        gemm(a, a, transb=True)
    d = randn(M, K).double()
    with pytest.raises(InvalidArgumentError, match="must be float32, float16, bfloat16"):
        gemm(d, d, transb=True)


def test_rejects_e5m2_times_e5m2() -> None:
    qa, qb = fp8_pair(E5M2, E5M2)
    with pytest.raises(UnsupportedHardwareError, match="e5m2 x float8_e5m2 has no cuBLASLt kernel"):
        gemm(qa.data, qb.data, transb=True, **scales(qa, qb))


def test_rejects_missing_or_extra_scales() -> None:
    qa, qb = fp8_pair()
    with pytest.raises(InvalidArgumentError, match=r"FP8 operand B .* has no scale_inv"):
        gemm(qa.data, qb.data, transb=True, a_scale_inv=qa.scale_inv)
    a = randn(M, K, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="takes no scale_inv"):
        gemm(a, a, transb=True, a_scale_inv=torch.ones(1), a_scaling=ScalingMode.TENSOR)
    with pytest.raises(InvalidArgumentError, match="a_scale_inv must be a contiguous float32"):
        gemm(qa.data, qb.data, transb=True, a_scale_inv=torch.ones(2), b_scale_inv=qb.scale_inv)


def test_rejects_block_scale_of_wrong_shape() -> None:
    qa = block_fp8(randn(M, 256, seed=23), E4M3, ScalingMode.BLOCK_1X128)
    qb = block_fp8(randn(N, 256, seed=24), E4M3, ScalingMode.BLOCK_128X128)
    with pytest.raises(InvalidArgumentError, match=r"b_scale_inv must have shape \[1, 2\]"):
        gemm(
            qa.data,
            qb.data,
            transb=True,
            a_scale_inv=qa.scale_inv,
            b_scale_inv=qa.scale_inv,
            a_scaling=ScalingMode.BLOCK_1X128,
            b_scaling=ScalingMode.BLOCK_128X128,
        )


def test_rejects_mxfp8_with_the_fallback_named() -> None:
    qa, qb = fp8_pair()
    with pytest.raises(UnsupportedHardwareError, match="dequantize it and run a BF16 GEMM"):
        gemm(
            qa.data,
            qb.data,
            transb=True,
            a_scale_inv=torch.zeros(M, K // 32, dtype=torch.uint8),
            b_scale_inv=qb.scale_inv,
            a_scaling=ScalingMode.MXFP8_ROWWISE,
        )


def block_call(**kw):
    m, n, k = kw.pop("m", 32), kw.pop("n", 64), kw.pop("k", 256)
    a_mode = kw.pop("a_mode", ScalingMode.BLOCK_1X128)
    b_mode = kw.pop("b_mode", ScalingMode.BLOCK_128X128)
    qa = block_fp8(randn(m, k, seed=25), E4M3, a_mode)
    qb = block_fp8(randn(n, k, seed=26), E4M3, b_mode)
    args = dict(
        transb=True,
        **scales(qa, qb),
    )
    args.update(kw)
    return gemm(qa.data, qb.data, **args)


def test_block_scaling_rules() -> None:
    with pytest.raises(UnsupportedHardwareError, match="128x128 x 128x128"):
        block_call(a_mode=ScalingMode.BLOCK_128X128)
    with pytest.raises(UnsupportedHardwareError, match="always use the split accumulator"):
        block_call(fast_accum=True)
    with pytest.raises(UnsupportedHardwareError, match="no GELU epilogue"):
        block_call(gelu=True)
    with pytest.raises(UnsupportedHardwareError, match="write bfloat16 or float32"):
        block_call(out_dtype=torch.float16)
    with pytest.raises(InvalidArgumentError, match="m a multiple of 4"):
        block_call(m=30)
    with pytest.raises(InvalidArgumentError, match="n a multiple of 8"):
        block_call(n=60)
    qa = block_fp8(randn(32, 256, seed=27), E4M3, ScalingMode.BLOCK_1X128)
    qb, _ = fp8_pair(k=256)
    with pytest.raises(UnsupportedHardwareError, match="cannot be mixed"):
        gemm(
            qa.data,
            qb.data,
            transb=True,
            **scales(qa, qb),
        )


def test_block_scaled_operands_must_be_k_contiguous() -> None:
    qa = block_fp8(randn(256, 32, seed=28), E4M3, ScalingMode.BLOCK_1X128)  # stored [k, m]
    qb = block_fp8(randn(64, 256, seed=29), E4M3, ScalingMode.BLOCK_128X128)
    with pytest.raises(UnsupportedHardwareError, match="must be K-contiguous"):
        gemm(
            qa.data,
            qb.data,
            transa=True,
            transb=True,
            **scales(qa, qb),
        )


def test_rejects_fp8_k_not_multiple_of_16() -> None:
    qa, qb = fp8_pair(k=40)
    # Rows padded to 48 bytes so that only K itself is wrong.
    wa = torch.zeros(M, 48, dtype=torch.uint8)
    wb = torch.zeros(N, 48, dtype=torch.uint8)
    wa[:, :40] = qa.data.view(torch.uint8)
    wb[:, :40] = qb.data.view(torch.uint8)
    qa.data, qb.data = wa.view(E4M3)[:, :40], wb.view(E4M3)[:, :40]
    with pytest.raises(InvalidArgumentError, match="K a multiple of 16, got K = 40"):
        gemm(qa.data, qb.data, transb=True, **scales(qa, qb))


def test_fp8_output_rules() -> None:
    qa, qb = fp8_pair()
    common = dict(transb=True, **scales(qa, qb))
    with pytest.raises(InvalidArgumentError, match="needs its quantization scale"):
        gemm(qa.data, qb.data, out_dtype=E4M3, **common)
    with pytest.raises(InvalidArgumentError, match=r"cannot write float8_e5m2"):
        gemm(qa.data, qb.data, out_dtype=E5M2, out_scale=torch.ones(1), **common)
    out = torch.empty(M, N, dtype=E4M3)
    with pytest.raises(InvalidArgumentError, match="an FP8 output cannot accumulate"):
        gemm(qa.data, qb.data, out=out, beta=1.0, out_scale=torch.ones(1), **common)
    with pytest.raises(InvalidArgumentError, match="belong to FP8 outputs"):
        gemm(qa.data, qb.data, out_amax=torch.zeros(1), **common)


def test_rejects_bias_of_wrong_dtype_or_length() -> None:
    a = randn(M, K, dtype=torch.bfloat16)
    b = randn(N, K, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="bias of a bfloat16 GEMM writing bfloat16 must"):
        gemm(a, b, transb=True, bias=randn(N))
    with pytest.raises(InvalidArgumentError, match="bias must be a contiguous tensor of n = 48"):
        gemm(a, b, transb=True, bias=randn(N + 1, dtype=torch.bfloat16))
    qa, qb = fp8_pair()
    with pytest.raises(InvalidArgumentError, match="writing float32 must be bfloat16"):
        gemm(
            qa.data,
            qb.data,
            transb=True,
            **scales(qa, qb),
            out_dtype=torch.float32,
            bias=randn(N),
        )


def test_rejects_misalignment() -> None:
    base = randn(M + 1, K, dtype=torch.bfloat16)
    b = randn(N, K, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match=r"data pointer .* is not 16-byte aligned"):
        gemm(base.view(-1)[1 : 1 + M * K].view(M, K), b, transb=True)
    odd = randn(M, K + 4, dtype=torch.bfloat16)[:, :K]  # rows 136 bytes apart
    with pytest.raises(InvalidArgumentError, match="not a multiple of 16 bytes"):
        gemm(odd, b, transb=True)
    flat = torch.empty(1 + (M + 1) * N, dtype=torch.bfloat16)
    out = flat[1:].view(M + 1, N)  # 2 bytes off
    with pytest.raises(InvalidArgumentError, match=r"first written row \(row_offset 1\)"):
        gemm(randn(M, K, dtype=torch.bfloat16), b, transb=True, out=out, row_offset=1)


def test_rejects_bad_output_region() -> None:
    a = randn(M, K, dtype=torch.bfloat16)
    b = randn(N, K, dtype=torch.bfloat16)
    out = torch.empty(M + 8, N, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match=r"output rows \[16, 40\) do not fit"):
        gemm(a, b, transb=True, out=out, row_offset=16)
    with pytest.raises(InvalidArgumentError, match=r"has 32 columns; .* n = 48"):
        gemm(a, b, transb=True, out=torch.empty(M, 32, dtype=torch.bfloat16))
    with pytest.raises(InvalidArgumentError, match="bfloat16 inputs write bfloat16 or float32"):
        gemm(a, b, transb=True, out_dtype=torch.float16)
    with pytest.raises(InvalidArgumentError, match="refer to an existing output"):
        gemm(a, b, transb=True, beta=1.0)
    with pytest.raises(InvalidArgumentError, match="unit column stride"):
        gemm(a, b.T, out=torch.empty(N, M, dtype=torch.bfloat16).T)


def test_rejects_options() -> None:
    a = randn(M, K, dtype=torch.bfloat16)
    b = randn(N, K, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="fast_accum applies to FP8 GEMMs only"):
        gemm(a, b, transb=True, fast_accum=True)
    with pytest.raises(InvalidArgumentError, match="sm_count must be >= 0"):
        gemm(a, b, transb=True, sm_count=-1)
    with pytest.raises(InvalidArgumentError, match="alpha and beta must be finite"):
        gemm(a, b, transb=True, alpha=float("inf"))
    with pytest.raises(InvalidArgumentError, match="a_scaling must be an overlap"):
        gemm(a, b, transb=True, a_scaling="tensor")


def test_rejects_bad_stream_argument() -> None:
    from overlap.gemm import _stream_handle

    class CudaLike:
        is_cuda = True

    with pytest.raises(InvalidArgumentError, match="stream must be a torch"):
        _stream_handle("not a stream", CudaLike())  # type: ignore[arg-type]

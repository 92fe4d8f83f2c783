"""The cuBLASLt GEMM (CUDA tensors) against the float64 reference, with per-dtype tolerances.

Inputs are random with magnitudes that vary along K and along rows, so that a wrong operand
order, a wrong scale pointer or a wrong block-scale layout gives errors far above the
tolerances; outputs are poisoned with NaN before every run.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError, UnsupportedHardwareError  # noqa: E402
from overlap.gemm import (  # noqa: E402
    clear_gemm_cache,
    gemm,
    gemm_cache_stats,
    release_gemm_resources,
)
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

pytestmark = pytest.mark.gpu(1)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
M, N, K = 256, 384, 512
# Relative to max |reference|: output rounding plus float32 accumulation in tiles.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
FP8_TOL = {True: 5e-3, False: 1e-3}  # fast_accum -> tolerance for float32 outputs


def cc() -> tuple[int, int]:
    return torch.cuda.get_device_capability()


def on_gpu(t):
    return None if t is None else t.cuda()


def varied(rows: int, cols: int, *, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Random values whose magnitude changes along both dimensions (spans ~3 decades)."""
    x = randn(rows, cols, seed=seed)
    x = x * torch.logspace(-1, 1, cols) * torch.logspace(0.5, -0.5, rows)[:, None]
    return x.to(dtype)


def check(y: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert not y.isnan().any(), "the GEMM left NaN (poison) in its output"
    scale = float(ref.abs().max())
    torch.testing.assert_close(y.double().cpu(), ref, rtol=tol, atol=tol * scale)


def poisoned(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(rows, cols, dtype=dtype, device="cuda")
    if dtype in (E4M3, E5M2):
        out.view(torch.uint8).fill_(0x7F)  # NaN in both formats
    else:
        out.fill_(float("nan"))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("wide_out", [False, True], ids=["out=in", "out=fp32"])
def test_float_inputs_every_layout(dtype, transa, transb, wide_out) -> None:
    a = varied(M, K, seed=1, dtype=dtype)
    b = varied(K, N, seed=2, dtype=dtype)
    a = a.T.contiguous() if transa else a
    b = b.T.contiguous() if transb else b
    out_dtype = torch.float32 if wide_out else dtype
    out = poisoned(M, N, out_dtype)
    gemm(a.cuda(), b.cuda(), transa=transa, transb=transb, out=out)
    check(out, reference(a, b, transa=transa, transb=transb), TOL[out_dtype])


@pytest.mark.parametrize("fa, fb", [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fast_accum", [True, False], ids=["fast", "split"])
def test_fp8_per_tensor(fa, fb, out_dtype, fast_accum) -> None:
    qa = per_tensor_fp8(varied(M, K, seed=3), fa)
    qb = per_tensor_fp8(varied(N, K, seed=4), fb)
    out = poisoned(M, N, out_dtype)
    ref = run_fp8(qa, qb, out, fast_accum=fast_accum)
    tol = FP8_TOL[fast_accum] if out_dtype == torch.float32 else TOL[out_dtype]
    check(out, ref, tol)


def test_fp8_matches_torch_scaled_mm() -> None:
    qa = per_tensor_fp8(varied(M, K, seed=5), E4M3)
    qb = per_tensor_fp8(varied(N, K, seed=6), E4M3)
    a, b = qa.data.cuda(), qb.data.cuda()
    sa, sb = qa.scale_inv.cuda(), qb.scale_inv.cuda()
    ours = gemm(a, b, transb=True, a_scale_inv=sa, b_scale_inv=sb, out_dtype=torch.float32)
    theirs = torch._scaled_mm(
        a, b.T, scale_a=sa, scale_b=sb, out_dtype=torch.float32, use_fast_accum=True
    )
    torch.testing.assert_close(ours, theirs, rtol=2e-3, atol=2e-3 * float(theirs.abs().max()))


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="the TN rule is sm_90's",
)
def test_fp8_non_tn_is_refused_on_hopper() -> None:
    qa = per_tensor_fp8(varied(K, M, seed=7), E4M3)  # stored [k, m]
    qb = per_tensor_fp8(varied(N, K, seed=8), E4M3)
    with pytest.raises(UnsupportedHardwareError, match="need both operands K-contiguous"):
        gemm(
            qa.data.cuda(),
            qb.data.cuda(),
            transa=True,
            transb=True,
            **scales(qa, qb, "cuda"),
        )


BLOCK_PAIRS = [
    (ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_128X128),
    (ScalingMode.BLOCK_1X128, ScalingMode.BLOCK_1X128),
    (ScalingMode.BLOCK_128X128, ScalingMode.BLOCK_1X128),
]


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="cuBLASLt block scaling is Hopper-only",
)
@pytest.mark.parametrize(
    "a_mode, b_mode", BLOCK_PAIRS, ids=["1x128*128x128", "1x128*1x128", "128x128*1x128"]
)
@pytest.mark.parametrize("k", [320, 1024], ids=["k=320(padded)", "k=1024"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fb", [E4M3, E5M2], ids=str)
def test_block_scaled_fp8(a_mode, b_mode, k, out_dtype, fb) -> None:
    """m = 196 and n = 136 leave partial 128-row tiles; k = 320 has 3 K-blocks, which the
    128x128 scales pad to 4 (NOTE [cublaslt block scale layout])."""
    m, n = 196, 136
    qa = block_fp8(varied(m, k, seed=9), E4M3, a_mode)
    qb = block_fp8(varied(n, k, seed=10), fb, b_mode)
    bias = randn(n, seed=11, dtype=torch.bfloat16)
    out = poisoned(m, n, out_dtype)
    ref = run_fp8(qa, qb, out, bias=bias)
    check(out, ref, 1e-3 if out_dtype == torch.float32 else TOL[out_dtype])


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="cuBLASLt block scaling is Hopper-only",
)
def test_block_scaled_wgrad_accumulates_into_fp32() -> None:
    m, n, k = 128, 256, 512
    qa = block_fp8(varied(m, k, seed=12), E4M3, ScalingMode.BLOCK_1X128)
    qb = block_fp8(varied(n, k, seed=13), E4M3, ScalingMode.BLOCK_1X128)
    main_grad = randn(m, n, seed=14).cuda()
    check(main_grad, run_fp8(qa, qb, main_grad, beta=1.0), 1e-3)


@pytest.mark.parametrize("out_fmt", [E4M3, E5M2], ids=str)
def test_fp8_output_scale_and_amax(out_fmt) -> None:
    qa = per_tensor_fp8(varied(M, K, seed=15), E4M3)
    qb = per_tensor_fp8(varied(N, K, seed=16), E5M2)
    bias = randn(N, seed=17, dtype=torch.bfloat16)
    v = reference(qa.data, qb.data, transb=True, **scales(qa, qb), bias=bias)
    scale_value = 200.0 / float(v.abs().max())
    scale = torch.tensor([scale_value], device="cuda")
    amax = torch.full((1,), float("nan"), device="cuda")
    out = poisoned(M, N, out_fmt)
    run_fp8(qa, qb, out, bias=bias, out_scale=scale, out_amax=amax)
    torch.testing.assert_close(amax.cpu().double(), v.abs().max().reshape(1), rtol=5e-3, atol=0)
    got = out.cpu().double()
    want = to_fp8(v, scale_value, out_fmt).double()
    assert not got.isnan().any()
    # FP8 rounding of slightly different float32 sums: within one FP8 step (12.5% / 25%).
    step = 0.13 if out_fmt == E4M3 else 0.26
    torch.testing.assert_close(got, want, rtol=step, atol=step * 200 / 16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bias_and_gelu(dtype, gelu, with_bias) -> None:
    a = varied(M, K, seed=18, dtype=dtype)
    b = varied(N, K, seed=19, dtype=dtype)
    bias = randn(N, seed=20, dtype=dtype) * 4 if with_bias else None
    out = poisoned(M, N, dtype)
    gemm(a.cuda(), b.cuda(), transb=True, bias=on_gpu(bias), gelu=gelu, out=out)
    check(out, reference(a, b, transb=True, bias=bias, gelu=gelu), TOL[dtype])


@pytest.mark.parametrize("gelu", [False, True])
def test_fp8_bias_and_gelu(gelu) -> None:
    qa = per_tensor_fp8(varied(M, K, seed=21), E4M3)
    qb = per_tensor_fp8(varied(N, K, seed=22), E4M3)
    bias = randn(N, seed=23, dtype=torch.bfloat16) * 4
    out = poisoned(M, N, torch.bfloat16)
    check(out, run_fp8(qa, qb, out, bias=bias, gelu=gelu), TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_wgrad_beta_into_fp32_main_grad(dtype) -> None:
    """dW += dY^T X: inputs stored [tokens, out] and [tokens, in], accumulated into float32."""
    dy = varied(M, N, seed=24, dtype=dtype)
    x = varied(M, K, seed=25, dtype=dtype)
    main_grad = randn(N, K, seed=26).cuda()
    old = main_grad.cpu()
    gemm(dy.cuda(), x.cuda(), transa=True, out=main_grad, beta=1.0)
    check(main_grad, reference(dy, x, transa=True, beta=1.0, old=old), 1e-4)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_row_offset_slice_of_poisoned_output_leaves_the_rest(out_dtype) -> None:
    """Chunk c of a TP ring writes rows [c*m, (c+1)*m) of a wider, NaN-poisoned buffer."""
    chunks, m = 4, 64
    big = poisoned(chunks * m + 8, N + 64, out_dtype)
    out = big[:, :N]
    b = varied(N, K, seed=27, dtype=torch.bfloat16)
    for c in (2, 0):
        a = varied(m, K, seed=28 + c, dtype=torch.bfloat16)
        y = gemm(a.cuda(), b.cuda(), transb=True, out=out, row_offset=c * m)
        assert y.data_ptr() == out[c * m].data_ptr()
        check(out[c * m : (c + 1) * m], reference(a, b, transb=True), TOL[out_dtype])
    torch.cuda.synchronize()
    untouched = torch.ones(big.shape, dtype=torch.bool)
    untouched[0:m, :N] = False
    untouched[2 * m : 3 * m, :N] = False
    assert big.cpu()[untouched].isnan().all(), "rows or columns outside the chunks were written"


@pytest.mark.parametrize("sm_count", [8, 66])
def test_sm_count_target_runs_and_is_correct(sm_count) -> None:
    a = varied(M, K, seed=32, dtype=torch.bfloat16)
    b = varied(N, K, seed=33, dtype=torch.bfloat16)
    out = poisoned(M, N, torch.bfloat16)
    gemm(a.cuda(), b.cuda(), transb=True, out=out, sm_count=sm_count)
    check(out, reference(a, b, transb=True), TOL[torch.bfloat16])
    too_many = torch.cuda.get_device_properties(0).multi_processor_count + 1
    with pytest.raises(InvalidArgumentError, match="exceeds the device's"):
        gemm(a.cuda(), b.cuda(), transb=True, sm_count=too_many)


def counts(device: int) -> tuple[int, int, int]:
    s = gemm_cache_stats(device)
    return s["hits"], s["misses"], s["entries"]


def test_heuristics_cache_hits_for_repeated_problems() -> None:
    clear_gemm_cache()
    a = varied(M, K, seed=34, dtype=torch.bfloat16).cuda()
    b = varied(N, K, seed=35, dtype=torch.bfloat16).cuda()
    device = torch.cuda.current_device()
    gemm(a, b, transb=True)
    assert counts(device) == (0, 1, 1)
    for _ in range(3):
        gemm(a, b, transb=True)
    assert counts(device) == (3, 1, 1)
    gemm(a[: M // 2], b, transb=True)  # another shape: another entry
    assert gemm_cache_stats(device)["entries"] == 2
    gemm(a, b, transb=True, sm_count=16)  # the SM target changes the plan: another entry
    assert gemm_cache_stats(device)["entries"] == 3


def test_runs_on_the_given_stream() -> None:
    a = varied(M, K, seed=36, dtype=torch.bfloat16).cuda()
    b = varied(N, K, seed=37, dtype=torch.bfloat16).cuda()
    side = torch.cuda.Stream()
    out = poisoned(M, N, torch.bfloat16)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemm(a, b, transb=True, out=out)  # default: the current (side) stream
    gemm(a, b, transb=True, out=out, stream=side)  # explicit
    side.synchronize()
    check(out, reference(a.cpu(), b.cpu(), transb=True), TOL[torch.bfloat16])


def test_concurrent_streams_get_their_own_workspace() -> None:
    """Split-K GEMMs on two streams at once (NOTE [gemm workspace]): small m and n, long k."""
    a = varied(64, 8192, seed=38, dtype=torch.bfloat16).cuda()
    b = varied(64, 8192, seed=39, dtype=torch.bfloat16).cuda()
    ref = reference(a.cpu(), b.cpu(), transb=True)
    streams = [torch.cuda.Stream() for _ in range(4)]
    outs = [poisoned(64, 64, torch.float32) for _ in streams]
    for _ in range(10):
        for s, o in zip(streams, outs, strict=True):
            s.wait_stream(torch.cuda.current_stream())
            gemm(a, b, transb=True, out=o, stream=s)
    torch.cuda.synchronize()
    for o in outs:
        check(o, ref, 1e-5)


def test_rejects_tensors_on_different_devices() -> None:
    a = varied(M, K, seed=40, dtype=torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="all tensors must be on one device"):
        gemm(a.cuda(), a, transb=True)


def test_release_and_recreate_resources() -> None:
    a = varied(M, K, seed=41, dtype=torch.bfloat16).cuda()
    b = varied(N, K, seed=42, dtype=torch.bfloat16).cuda()
    ref = reference(a.cpu(), b.cpu(), transb=True)
    for _ in range(20):
        y = gemm(a, b, transb=True)
        release_gemm_resources()
        check(y, ref, TOL[torch.bfloat16])
    release_gemm_resources()  # idempotent
    assert gemm_cache_stats(torch.cuda.current_device())["entries"] == 0


def test_gpu_matches_host_reference_for_block_scaling() -> None:
    """The same call on CPU tensors (host reference) and CUDA tensors (cuBLASLt)."""
    if cc()[0] != 9:
        pytest.skip("cuBLASLt block scaling is Hopper-only")
    m, n, k = 128, 256, 384
    qa = block_fp8(varied(m, k, seed=43), E4M3, ScalingMode.BLOCK_1X128)
    qb = block_fp8(varied(n, k, seed=44), E4M3, ScalingMode.BLOCK_128X128)
    kw = {"transb": True}  # the block scaling modes come with scales(qa, qb)
    host = gemm(qa.data, qb.data, **scales(qa, qb), **kw)
    dev = gemm(
        qa.data.cuda(),
        qb.data.cuda(),
        **scales(qa, qb, "cuda"),
        **kw,
    )
    check(dev, host.double(), TOL[torch.bfloat16])


@pytest.mark.gpu(2)
def test_rejects_a_stream_of_another_device() -> None:
    a = varied(M, K, seed=45, dtype=torch.bfloat16).cuda(0)
    b = varied(N, K, seed=46, dtype=torch.bfloat16).cuda(0)
    other = torch.cuda.Stream(device=1)
    with pytest.raises(InvalidArgumentError, match="the stream belongs to cuda:1"):
        gemm(a, b, transb=True, stream=other)

"""The quantizer round trips on CUDA tensors: the same cases as the CPU tests, and the CUDA
results must equal the host references bit for bit (data and scales)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.quantization import (  # noqa: E402
    CachedWeight,
    CurrentScalingQuantizer,
    DelayedScalingQuantizer,
    QuantizedTensor,
)
from tests.unit.quantizer_cases import (  # noqa: E402
    QUANTIZERS,
    assert_within_fp8_error,
    cases,
    quantize_primed,
    random_nd,
    shape_id,
)

pytestmark = pytest.mark.gpu(1)


def _same_bytes(a: QuantizedTensor, b: QuantizedTensor) -> None:
    assert a.meta == b.meta
    for ta, tb in zip(a.tensors(), b.tensors(), strict=True):
        assert (ta is None) == (tb is None)
        if ta is not None:
            assert ta.dtype == tb.dtype and ta.shape == tb.shape
            assert torch.equal(ta.cpu().view(torch.uint8), tb.cpu().view(torch.uint8))


@pytest.mark.parametrize(
    ("name", "shape"), cases(), ids=lambda v: v if isinstance(v, str) else shape_id(v)
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_round_trip_matches_host(
    name: str, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    x = random_nd(shape, dtype, seed=sum(shape))
    on_gpu = quantize_primed(QUANTIZERS[name][0](), x.cuda())
    on_host = quantize_primed(QUANTIZERS[name][0](), x)
    assert on_gpu.device.type == "cuda"
    on_gpu._validate()  # NOTE [quantizer outputs]: built unvalidated, valid by construction
    _same_bytes(on_gpu, on_host)
    for col in (False, True):
        assert_within_fp8_error(on_gpu, x, columnwise=col)
        assert torch.equal(
            on_gpu.dequantize(columnwise=col).cpu(), on_host.dequantize(columnwise=col)
        )
    _same_bytes(on_host.to("cuda"), on_gpu)


def test_cuda_delayed_scaling_state_follows_the_input() -> None:
    q = DelayedScalingQuantizer()
    x = random_nd((64, 96), torch.float32, seed=1).cuda()
    q.quantize(x)
    assert q.scale.is_cuda and q.amax_history.is_cuda
    assert q.amax_history[0].item() == x.abs().max().item()


def test_cuda_cached_weight_train_eval() -> None:
    w1 = random_nd((160, 96), torch.bfloat16, seed=1).cuda()
    w2 = -w1 * 3
    cache = CachedWeight()
    q = CurrentScalingQuantizer()
    cache.get(w1, q, columnwise=True)
    t = cache.get(w2, q, columnwise=False)
    assert t.has_columnwise
    assert_within_fp8_error(t, w2, columnwise=True)

"""amax: host reference on CPU, CUDA kernel on GPU, both bit-exact against torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError  # noqa: E402
from overlap.quantization import amax  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 129, 4097, 1 << 20 | 3]


def _ids(v: object) -> str:
    return str(v).replace("torch.", "")


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"n{n}")
def test_amax_host_matches_torch(dtype: torch.dtype, n: int) -> None:
    x = (torch.randn(n) * 3).to(dtype)
    want = x.float().abs().max().item() if n else 0.0
    assert amax(x).item() == want


def test_amax_host_nan_propagates_and_out_is_written_in_place() -> None:
    x = torch.randn(1000)
    x[517] = float("nan")
    out = torch.full((1,), -1.0)
    assert amax(x, out) is out
    assert torch.isnan(out).all()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: (torch.randn(8, 8).t(), None), "must be contiguous"),
        (lambda: (torch.randn(8).double(), None), "must be float32, float16 or bfloat16"),
        (lambda: (torch.randn(8), torch.zeros(2)), "one element"),
        (lambda: (torch.randn(8), torch.zeros(1, dtype=torch.float16)), "float32 tensor"),
        (lambda: (torch.arange(8), None), r"dtype torch\.int64 is not supported"),
    ],
    ids=["non-contiguous", "float64", "out-size", "out-dtype", "int64"],
)
def test_amax_rejects_bad_arguments(make, match: str) -> None:
    x, out = make()
    with pytest.raises(InvalidArgumentError, match=match):
        amax(x, out)


def test_amax_rejects_non_tensors() -> None:
    with pytest.raises(InvalidArgumentError, match=r"expects a torch\.Tensor"):
        amax([1.0, 2.0])  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"n{n}")
@pytest.mark.parametrize("offset", [0, 1, 3], ids=lambda o: f"off{o}")
def test_amax_cuda_bit_exact(dtype: torch.dtype, n: int, offset: int) -> None:
    base = (torch.randn(n + offset, device="cuda") * 5).to(dtype)
    x = base[offset:]  # unaligned starts exercise the scalar head
    out = torch.full((1,), -1.0, device="cuda")  # poisoned
    amax(x, out)
    want = x.float().abs().max().item() if n else 0.0
    assert out.item() == want
    assert out.item() == amax(x.cpu()).item()  # the host reference agrees


@pytest.mark.gpu
def test_amax_cuda_nan_and_device_checks() -> None:
    x = torch.randn(1 << 16, device="cuda", dtype=torch.bfloat16)
    x[12345] = float("nan")
    assert torch.isnan(amax(x)).all()
    with pytest.raises(InvalidArgumentError, match="must be on the device of the input"):
        amax(x, torch.zeros(1))


@pytest.mark.gpu(2)
def test_amax_cuda_on_a_non_current_device() -> None:
    x = torch.randn(10_001, device="cuda:1")
    with torch.cuda.device(0):
        got = amax(x)
    assert got.device == x.device and got.item() == x.abs().max().item()

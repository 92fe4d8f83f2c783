"""transpose_fp8 (NOTE [fp8 transpose] in csrc/kernels/transpose.h): the FP8 byte transpose
that feeds weight gradients of gathered FP8 operands. The host reference on CPU (CI), the CUDA
kernels on GPUs (skipped without one): both against torch's own transpose, byte for byte, on
shapes that take the vector path (multiples of 16, aligned) and the byte path (ragged sizes,
unaligned pointers), and the typed errors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError  # noqa: E402
from overlap.quantization import transpose_fp8  # noqa: E402

# Vector-path shapes (multiples of 16), ragged ones, and one of a layer's gathered operands.
SHAPES = [(1, 1), (16, 16), (64, 64), (48, 80), (7, 129), (130, 257), (1000, 3), (3, 1000),
          (256, 1024), (1040, 336)]  # fmt: skip
DTYPES = [torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2]


def _random_bytes(shape: tuple[int, int], dtype: torch.dtype, device: str, offset: int = 0):
    """Random bytes as ``dtype``, the data pointer ``offset`` bytes into its storage."""
    n = shape[0] * shape[1]
    g = torch.Generator().manual_seed(shape[0] * 7919 + shape[1])
    flat = torch.randint(0, 256, (n + offset,), generator=g, dtype=torch.uint8).to(device)
    return flat[offset:].view(shape).view(dtype)


def _check(shape: tuple[int, int], dtype: torch.dtype, device: str, offset: int = 0) -> None:
    x = _random_bytes(shape, dtype, device, offset)
    out = transpose_fp8(x)
    assert out.dtype == dtype and out.shape == (shape[1], shape[0]) and out.is_contiguous()
    want = x.view(torch.uint8).t().contiguous()
    assert torch.equal(out.view(torch.uint8).cpu(), want.cpu())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_transpose_is_torchs(shape: tuple[int, int], dtype: torch.dtype) -> None:
    _check(shape, dtype, "cpu")


def test_output_given_is_filled_and_returned() -> None:
    x = _random_bytes((32, 48), torch.float8_e4m3fn, "cpu")
    out = torch.empty((48, 32), dtype=torch.float8_e4m3fn)
    assert transpose_fp8(x, out) is out
    assert torch.equal(out.view(torch.uint8), x.view(torch.uint8).t())


def test_empty_input() -> None:
    x = torch.empty((0, 5), dtype=torch.uint8)
    assert transpose_fp8(x).shape == (5, 0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: (torch.zeros(4, 4), None), "uint8, float8_e4m3fn or float8_e5m2"),
        (lambda: (torch.zeros(2, 3, 4, dtype=torch.uint8), None), "2-D"),
        (lambda: (torch.zeros(8, 4, dtype=torch.uint8).t(), None), "contiguous"),
        (lambda: (torch.zeros(4, 6, dtype=torch.uint8), torch.zeros(4, 6, dtype=torch.uint8)),
         r"shape \[6, 4\]"),
        (lambda: (torch.zeros(4, 6, dtype=torch.uint8), torch.zeros(6, 4,
                                                                     dtype=torch.float8_e5m2)),
         "x's dtype"),
        (lambda: ("bytes", None), "torch.Tensor"),
    ],
    ids=["float32", "3-D", "strided", "out-shape", "out-dtype", "not-a-tensor"],
)  # fmt: skip
def test_bad_arguments_are_typed(make, match: str) -> None:
    x, out = make()
    with pytest.raises(InvalidArgumentError, match=match):
        transpose_fp8(x, out)


def test_out_sharing_x_is_refused() -> None:
    buf = torch.zeros(2 * 64, dtype=torch.uint8)
    x = buf[:64].view(8, 8)
    with pytest.raises(InvalidArgumentError, match="share memory"):
        transpose_fp8(x, buf[32:96].view(8, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_cuda_transpose_is_torchs(shape: tuple[int, int], offset: int) -> None:
    _check(shape, torch.float8_e4m3fn, "cuda", offset)


@pytest.mark.gpu
def test_cuda_transpose_runs_on_the_current_stream() -> None:
    x = _random_bytes((4096, 2048), torch.uint8, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = transpose_fp8(x)
    side.synchronize()
    assert torch.equal(out, x.t().contiguous())

"""QuantizedTensor: row-range views, usage updates, saving through autograd, moving, cloning,
byte counts and construction checks (CPU, host references)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from overlap.errors import InvalidArgumentError, StateError  # noqa: E402
from overlap.quantization import (  # noqa: E402
    BlockScalingConfig,
    BlockScalingQuantizer,
    CurrentScalingQuantizer,
    DirectionFormat,
    HighPrecisionQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    QuantizedTensor,
    ScalingMode,
    cast_transpose,
)
from tests.unit.fp8_reference import bits  # noqa: E402
from tests.unit.quantizer_cases import (  # noqa: E402
    QUANTIZERS,
    assert_within_fp8_error,
    quantize_primed,
    random_nd,
)

# ---- row-range views -------------------------------------------------------------------------

# (quantizer, shape, [valid (start, stop)], [misaligned (start, stop), message])
VIEW_CASES: dict[str, tuple[Any, tuple[int, ...], list[tuple[int, int]], list[Any]]] = {
    "current": (CurrentScalingQuantizer, (300, 72), [(0, 1), (17, 300), (5, 6)], []),
    "block1x128": (
        BlockScalingQuantizer,
        (300, 200),
        [(0, 128), (128, 300), (256, 300)],
        [((1, 128), "multiples of 128"), ((0, 100), "cuts a scale block of the columnwise")],
    ),
    "block1x128-rowwise-only": (
        lambda: BlockScalingQuantizer(columnwise=False),
        (300, 200),
        [(3, 7), (299, 300)],
        [],
    ),
    "block128x128": (
        lambda: BlockScalingQuantizer(BlockScalingConfig(block=ScalingMode.BLOCK_128X128)),
        (300, 200),
        [(0, 256), (128, 300)],
        [((64, 128), "rowwise BLOCK_128X128/E4M3 data: its row bounds must be multiples of 128")],
    ),
    "mxfp8": (
        MXFP8Quantizer,
        (96, 64),
        [(0, 32), (32, 96)],
        [
            (
                (1, 33),
                "columnwise MXFP8_COLUMNWISE/E4M3 data: its row bounds must be multiples of 32",
            )
        ],
    ),
    "mxfp8-rowwise-only": (lambda: MXFP8Quantizer(columnwise=False), (96, 64), [(5, 9)], []),
    "3d-current": (CurrentScalingQuantizer, (6, 50, 40), [(1, 4)], []),
    "3d-block1x128": (
        BlockScalingQuantizer,
        (6, 64, 130),
        [(2, 4), (4, 6)],
        [((1, 2), r"spans matrix rows \[64, 128\)")],
    ),
    "high-precision": (HighPrecisionQuantizer, (30, 20), [(3, 11)], []),
    "hybrid": (
        lambda: HybridQuantizer(CurrentScalingQuantizer(), MXFP8Quantizer()),
        (64, 64),
        [(0, 32), (32, 64)],
        [((8, 40), "multiples of 32")],
    ),
}


@pytest.mark.parametrize("name", list(VIEW_CASES))
def test_row_views(name: str) -> None:
    make, shape, good, bad = VIEW_CASES[name]
    x = random_nd(shape, torch.float32, seed=len(name))
    t = make().quantize(x)
    for start, stop in good:
        v = t.rows(start, stop)
        assert v.shape == (stop - start, *shape[1:]) and v.formats == t.formats
        for col in (False, True):
            if not (v.has_columnwise if col else v.has_rowwise):
                continue
            # A view reads exactly the rows of the full tensor ...
            full = t.dequantize(columnwise=col)[start:stop]
            assert torch.equal(v.dequantize(columnwise=col), full)
            assert_within_fp8_error(v, x[start:stop], columnwise=col)
            # ... and shares its memory (no copy).
            data = v.columnwise_data if col else v.rowwise_data
            parent = t.columnwise_data if col else t.rowwise_data
            assert data.untyped_storage().data_ptr() == parent.untyped_storage().data_ptr()
            s, ps = (
                (v.columnwise_scale_inv, t.columnwise_scale_inv)
                if col
                else (v.rowwise_scale_inv, t.rowwise_scale_inv)
            )
            fmt = v.format(col)
            if fmt.mode is ScalingMode.TENSOR:
                assert s is ps  # per-tensor formats share the scale_inv
            elif s is not None:
                assert s.untyped_storage().data_ptr() == ps.untyped_storage().data_ptr()
    for (start, stop), match in bad:
        with pytest.raises(InvalidArgumentError, match=match):
            t.rows(start, stop)


def test_row_view_bounds() -> None:
    t = CurrentScalingQuantizer().quantize(torch.randn(8, 16))
    for start, stop in [(-1, 2), (3, 3), (5, 9)]:
        with pytest.raises(InvalidArgumentError, match=r"need 0 <= start < stop <= 8"):
            t.rows(start, stop)
    with pytest.raises(InvalidArgumentError, match="at least 2 dims"):
        CurrentScalingQuantizer().quantize(torch.randn(16)).rows(0, 1)


def test_view_of_transposed_columnwise_is_strided() -> None:
    t = CurrentScalingQuantizer().quantize(torch.randn(64, 16))
    v = t.rows(16, 32)
    assert v.columnwise_data.shape == (16, 16) and not v.columnwise_data.is_contiguous()
    assert v.rowwise_data.is_contiguous()


# ---- usage updates ---------------------------------------------------------------------------


def test_per_tensor_columnwise_from_rowwise_by_transpose() -> None:
    x = random_nd((70, 130), torch.bfloat16, seed=1)
    t = CurrentScalingQuantizer(columnwise=False).quantize(x)
    t.update_usage(columnwise=True)
    scale = 1.0 / t.rowwise_scale_inv
    _, want_t, _ = cast_transpose(x, scale, rowwise=False)
    assert torch.equal(bits(t.columnwise_data), bits(want_t))
    assert t.columnwise_scale_inv is t.rowwise_scale_inv
    t.update_usage(rowwise=False)  # not cached: may drop
    assert not t.has_rowwise
    t.update_usage(rowwise=True)  # and back, from the columnwise data
    assert torch.equal(t.dequantize(columnwise=False), t.dequantize(columnwise=True))


def test_block_128x128_derives_exactly_and_1x128_refuses() -> None:
    x = random_nd((300, 200), torch.float32, seed=2)
    q = BlockScalingQuantizer(BlockScalingConfig(block="block_128x128"))
    both = q.quantize(x)
    t = q.quantize(x, columnwise=False)
    t.update_usage(columnwise=True)
    assert torch.equal(bits(t.columnwise_data), bits(both.columnwise_data))
    assert torch.equal(t.columnwise_scale_inv, both.columnwise_scale_inv)
    for make in (
        BlockScalingQuantizer,
        MXFP8Quantizer,
        lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
    ):
        r = make().quantize(x[:256, :192], columnwise=False)
        with pytest.raises(InvalidArgumentError, match="need the high-precision source"):
            r.update_usage(columnwise=True)
        assert not r.has_columnwise and not r.can_derive(columnwise=True)


def test_high_precision_directions_share_one_tensor() -> None:
    x = torch.randn(9, 7)
    t = HighPrecisionQuantizer().quantize(x)
    assert t.rowwise_data is t.columnwise_data
    assert t.rowwise_data.data_ptr() != x.data_ptr()  # a copy, never an alias of the input
    assert t.nbytes == x.numel() * 4  # counted once
    t.update_usage(columnwise=False)
    assert t.nbytes == x.numel() * 4


def test_cannot_drop_every_direction() -> None:
    t = CurrentScalingQuantizer().quantize(torch.randn(4, 4))
    with pytest.raises(InvalidArgumentError, match="would drop both rowwise and columnwise"):
        t.update_usage(rowwise=False, columnwise=False)


def test_cached_tensor_refuses_to_drop() -> None:
    from overlap.quantization import CachedWeight

    t = CachedWeight().get(torch.randn(8, 8), CurrentScalingQuantizer(), columnwise=True)
    assert t.cached
    with pytest.raises(StateError, match="usages of cached weights are only ever added"):
        t.update_usage(columnwise=False)
    assert t.has_columnwise
    assert not t.rows(0, 4).cached and not t.clone().cached


# ---- saving, moving, copying -----------------------------------------------------------------


class _QuantizedMatmul(torch.autograd.Function):
    """y = x Wᵀ with x quantized in forward and saved quantized for the wgrad."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, q: Any) -> torch.Tensor:
        qx = q.quantize(x)
        ctx.save_for_backward(*qx.tensors(), w)
        ctx.qx_meta = qx.meta
        return qx.dequantize() @ w.t()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        *saved, w = ctx.saved_tensors
        qx = QuantizedTensor.from_tensors(saved, ctx.qx_meta)
        return dy @ w, dy.t() @ qx.dequantize(columnwise=True), None


@pytest.mark.parametrize(
    "name", ["current-e4m3", "block1x128-e4m3", "mxfp8-e4m3", "high-precision"]
)
def test_save_for_backward_round_trip(name: str) -> None:
    q = QUANTIZERS[name][0]()
    x = random_nd((64, 96), torch.float32, seed=3)
    w = torch.randn(32, 96, requires_grad=True)
    _QuantizedMatmul.apply(x, w, q).sum().backward()
    qx = q.quantize(x)
    want = torch.ones(64, 32).t() @ qx.dequantize(columnwise=True)
    assert torch.equal(w.grad, want)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_tensors_meta_clone_to(name: str) -> None:
    q = QUANTIZERS[name][0]
    x = random_nd((64, 96), torch.bfloat16, seed=4)
    t = quantize_primed(q(), x)
    back = QuantizedTensor.from_tensors(t.tensors(), t.meta)
    assert back.meta == t.meta and torch.equal(back.dequantize(), t.dequantize())
    assert hash(t.meta) == hash(back.meta)
    assert t.to("cpu") is t
    c = t.clone()
    assert torch.equal(c.dequantize(), t.dequantize()) and c.nbytes == t.nbytes
    for a, b in zip(c.tensors(), t.tensors(), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.data_ptr() != b.data_ptr()
    # nbytes: data bytes plus scale bytes, each distinct tensor once.
    distinct = {id(p): p for p in t.tensors() if p is not None}
    assert t.nbytes == sum(p.numel() * p.element_size() for p in distinct.values())
    # Pickling keeps what the directions share.
    p = pickle.loads(pickle.dumps(t))
    assert (p.rowwise_data is p.columnwise_data) == (t.rowwise_data is t.columnwise_data)
    assert (p.rowwise_scale_inv is p.columnwise_scale_inv) == (
        t.rowwise_scale_inv is t.columnwise_scale_inv
    )
    assert "QuantizedTensor(shape=[64, 96]" in repr(t)


def test_from_tensors_checks_count() -> None:
    t = CurrentScalingQuantizer().quantize(torch.randn(4, 4))
    with pytest.raises(InvalidArgumentError, match="expects the 4 tensors"):
        QuantizedTensor.from_tensors(t.tensors()[:3], t.meta)


# ---- construction checks ---------------------------------------------------------------------

E4 = DirectionFormat(ScalingMode.TENSOR, "e4m3")
B1 = DirectionFormat(ScalingMode.BLOCK_1X128, "e4m3")
MXR = DirectionFormat(ScalingMode.MXFP8_ROWWISE, "e4m3")
HP = DirectionFormat()


def _make(**kw: Any) -> QuantizedTensor:
    base: dict[str, Any] = {
        "shape": (8, 256),
        "dtype": torch.float32,
        "rowwise_format": E4,
        "columnwise_format": E4,
    }
    base.update(kw)
    return QuantizedTensor(**base)


def _e4(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float8_e4m3fn)


BAD_TENSORS = {
    "none": (_make, "needs rowwise or columnwise data"),
    "dtype": (
        lambda: _make(
            dtype=torch.float64, rowwise_data=_e4(8, 256), rowwise_scale_inv=torch.ones(1)
        ),
        "dtype .* must be float32, bfloat16 or float16, got torch.float64",
    ),
    "data-shape": (
        lambda: _make(columnwise_data=_e4(8, 256), columnwise_scale_inv=torch.ones(1)),
        r"columnwise data must have shape \[256, 8\] .* got \[8, 256\]",
    ),
    "data-dtype": (
        lambda: _make(rowwise_data=torch.zeros(8, 256), rowwise_scale_inv=torch.ones(1)),
        "data must be torch.float8_e4m3fn or uint8",
    ),
    "scale-missing": (
        lambda: _make(rowwise_data=_e4(8, 256)),
        "scale_inv must be torch.float32 for format TENSOR/E4M3, got None",
    ),
    "block-scale-shape": (
        lambda: _make(
            rowwise_format=B1, rowwise_data=_e4(8, 256), rowwise_scale_inv=torch.ones(8, 3)
        ),
        r"scale_inv must have shape \[8, 2\]",
    ),
    "mx-scale-dtype": (
        lambda: _make(
            rowwise_format=MXR, rowwise_data=_e4(8, 256), rowwise_scale_inv=torch.ones(8, 8)
        ),
        "scale_inv must be torch.uint8",
    ),
    "mx-direction": (
        lambda: _make(
            columnwise_format=MXR, rowwise_data=_e4(8, 256), rowwise_scale_inv=torch.ones(1)
        ),
        "MXFP8_ROWWISE cannot be the columnwise format",
    ),
    "hp-scale": (
        lambda: _make(
            rowwise_format=HP, rowwise_data=torch.zeros(8, 256), rowwise_scale_inv=torch.ones(1)
        ),
        "high-precision data has no scale_inv",
    ),
    "scale-without-data": (
        lambda: _make(
            rowwise_data=_e4(8, 256),
            rowwise_scale_inv=torch.ones(1),
            columnwise_scale_inv=torch.ones(1),
        ),
        "columnwise: scale_inv given without data",
    ),
}


@pytest.mark.parametrize("name", list(BAD_TENSORS))
def test_construction_checks(name: str) -> None:
    make, match = BAD_TENSORS[name]
    with pytest.raises(InvalidArgumentError, match=match):
        make()


def test_uint8_data_is_accepted_and_read_with_its_format() -> None:
    x = torch.randn(8, 256)
    t = CurrentScalingQuantizer().quantize(x, columnwise=False)
    raw = _make(
        rowwise_data=t.rowwise_data.view(torch.uint8), rowwise_scale_inv=t.rowwise_scale_inv
    )
    assert torch.equal(raw.dequantize(), t.dequantize())

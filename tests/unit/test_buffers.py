"""Buffer managers in one process: layouts per format, validation with typed errors, staging
and reading back through a 1-rank group on the host transport, transient views, saving.

The multi-rank behaviour (gathers, shared scales, two consumers of one buffer, pipeline
ordering) is in tests/distributed/test_buffers.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from overlap.buffers import (  # noqa: E402
    ALIGNMENT,
    AliasPolicy,
    GatherBuffer,
    PartKind,
    aliases_buffer,
    detach_from_buffer,
    gather_activation,
    gather_for_wgrad,
    gather_layout,
    gathered_directions,
    required_nbytes,
    saveable,
)
from overlap.comm import Communicator  # noqa: E402
from overlap.comm.bootstrap import Bootstrap  # noqa: E402
from overlap.errors import InvalidArgumentError, StateError  # noqa: E402
from overlap.quantization import (  # noqa: E402
    BlockScalingConfig,
    BlockScalingQuantizer,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    DirectionFormat,
    HighPrecisionQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    QuantizedTensor,
    ScalingMode,
)
from tests.unit.quantizer_cases import (  # noqa: E402
    QUANTIZERS,
    assert_within_fp8_error,
    random_nd,
)

E4M3 = torch.float8_e4m3fn
TENSOR = DirectionFormat(ScalingMode.TENSOR, "e4m3")
B1 = DirectionFormat(ScalingMode.BLOCK_1X128, "e4m3")
B2 = DirectionFormat(ScalingMode.BLOCK_128X128, "e4m3")
MXR = DirectionFormat(ScalingMode.MXFP8_ROWWISE, "e4m3")
MXC = DirectionFormat(ScalingMode.MXFP8_COLUMNWISE, "e4m3")
HP = DirectionFormat()


class Solo(Bootstrap):
    """A group of one rank: every collective is local."""

    rank, size = 0, 1

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [bytes(data)]

    def split(self, color: int, key: int) -> Bootstrap:
        return self


@pytest.fixture
def comm() -> Iterator[Communicator]:
    c = Communicator(Solo(), "host")
    yield c
    c.destroy()


def poison(mgr: GatherBuffer) -> None:
    mgr.buffer.view(torch.uint8, (mgr.nbytes,)).fill_(0xFF)  # NaN in every float format


# ---- layout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_layout_regions_are_aligned_and_disjoint(tp: int) -> None:
    for formats, shape in [
        ((B1, B1), (256, 3, 200)),
        ((MXR, MXC), (64, 96)),
        ((TENSOR, B2), (128, 257)),
        ((HP, MXC), (32, 5)),
    ]:
        layout = gather_layout(
            shape, tp, formats=formats, dtype=torch.bfloat16, directions=(True, True)
        )
        end = 0
        for p in layout.parts:
            assert p.offset % ALIGNMENT == 0 and p.offset >= end, (formats, p)
            data_bytes = math.prod(p.slot_shape) * p.dtype.itemsize
            # A per-tensor scale takes the runtime's scale slot (NOTE [one scale slot]).
            per_tensor = p.kind.is_scale and formats[p.kind.columnwise] == TENSOR
            assert p.slot_nbytes == (16 if per_tensor else data_bytes), (formats, p)
            assert p.padded == per_tensor
            end = p.end
        assert layout.nbytes == end
        assert layout.gathered_shape == (tp * shape[0], *shape[1:])


def test_layout_parts_per_format() -> None:
    # 1x128 blocks, odd K: rowwise scales [m, ceil(K/128)], columnwise data [K, m].
    lay = gather_layout(
        (256, 200), 2, formats=(B1, B1), dtype=torch.float32, directions=(True, True)
    )
    kinds = [p.kind for p in lay.parts]
    assert kinds == [
        PartKind.ROWWISE_DATA,
        PartKind.ROWWISE_SCALE_INV,
        PartKind.COLUMNWISE_DATA,
        PartKind.COLUMNWISE_SCALE_INV,
    ]
    shapes = {p.kind: (p.slot_shape, p.dtype) for p in lay.parts}
    assert shapes[PartKind.ROWWISE_DATA] == ((256, 200), E4M3)
    assert shapes[PartKind.ROWWISE_SCALE_INV] == ((256, 2), torch.float32)
    assert shapes[PartKind.COLUMNWISE_DATA] == ((200, 256), E4M3)
    assert shapes[PartKind.COLUMNWISE_SCALE_INV] == ((200, 2), torch.float32)
    # Per-tensor: one float32 per rank; MXFP8: uint8 E8M0 scales, data not transposed.
    lay = gather_layout((7, 129), 4, formats=(TENSOR, TENSOR), dtype=torch.float32)
    assert [(p.kind, p.slot_shape) for p in lay.parts] == [
        (PartKind.ROWWISE_DATA, (7, 129)),
        (PartKind.ROWWISE_SCALE_INV, (1,)),
    ]
    assert lay.parts[1].offset == -(-4 * 7 * 129 // ALIGNMENT) * ALIGNMENT
    lay = gather_layout(
        (64, 96), 2, formats=(MXR, MXC), dtype=torch.float32, directions=(False, True)
    )
    assert [(p.kind, p.slot_shape, p.dtype) for p in lay.parts] == [
        (PartKind.COLUMNWISE_DATA, (64, 96), E4M3),
        (PartKind.COLUMNWISE_SCALE_INV, (2, 96), torch.uint8),
    ]
    # High precision: one tensor in its storage dtype; a plain tensor keeps its shape.
    lay = gather_layout((3, 5, 7), 2, formats=(HP, HP), dtype=torch.bfloat16)
    assert [(p.slot_shape, p.dtype) for p in lay.parts] == [((15, 7), torch.bfloat16)]
    lay = gather_layout((3, 5, 7), 2, formats=None, dtype=torch.int64)
    assert [(p.kind, p.slot_shape, p.dtype) for p in lay.parts] == [
        (PartKind.DATA, (3, 5, 7), torch.int64)
    ]


def test_directions_that_travel() -> None:
    # Per-tensor and high precision: columnwise is made after the gather from rowwise data.
    assert gathered_directions((TENSOR, TENSOR), False, True) == (True, False)
    assert gathered_directions((TENSOR, TENSOR), True, True) == (True, False)
    assert gathered_directions((HP, HP), True, True) == (True, False)
    # Blocks, MX and hybrids gather each needed direction with its own scales.
    assert gathered_directions((B1, B1), True, True) == (True, True)
    assert gathered_directions((B2, B2), False, True) == (False, True)
    assert gathered_directions((MXR, MXC), True, False) == (True, False)
    assert gathered_directions((TENSOR, B1), False, True) == (False, True)
    assert gathered_directions((B1, TENSOR), True, True) == (True, True)
    with pytest.raises(InvalidArgumentError, match="rowwise or columnwise"):
        gathered_directions((B1, B1), False, False)


@pytest.mark.parametrize(
    ("formats", "directions", "shape", "match"),
    [
        ((B2, B2), (True, False), (100, 256), "multiple of 128"),
        ((B1, B1), (False, True), (64, 256), "multiple of 128"),
        ((MXR, MXC), (False, True), (48, 64), "multiple of 32"),
        ((MXR, MXC), (True, False), (32, 48), "multiple of 32"),
        ((B1, B1), (True, False), (0, 128), "no empty dim"),
    ],
)
def test_layout_refuses_shards_that_cut_scale_blocks(
    formats: tuple, directions: tuple, shape: tuple, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        gather_layout(shape, 2, formats=formats, dtype=torch.float32, directions=directions)


def test_odd_shapes_where_the_format_allows() -> None:
    # Rowwise 1x128 blocks lie inside a row: any row count gathers; so do per-tensor scales.
    gather_layout((7, 129), 4, formats=(B1, B1), dtype=torch.float32)
    gather_layout(
        (3, 5, 131), 4, formats=(TENSOR, TENSOR), dtype=torch.float32, directions=(True, False)
    )
    # A single rank never cuts a block.
    gather_layout((100, 129), 1, formats=(B2, B2), dtype=torch.float32, directions=(True, True))


def test_required_nbytes_is_the_largest_layout() -> None:
    specs = [CurrentScalingQuantizer(), BlockScalingQuantizer(), torch.float32]
    n = required_nbytes((256, 512), 2, specs, dtype=torch.bfloat16)
    assert n == gather_layout((256, 512), 2, formats=None, dtype=torch.float32).nbytes
    n = required_nbytes((256, 512), 2, specs[:2], dtype=torch.bfloat16)
    assert (
        n
        == gather_layout(
            (256, 512), 2, formats=(B1, B1), dtype=torch.bfloat16, directions=(True, True)
        ).nbytes
    )


# ---- staging and reading on one rank -----------------------------------------------------------


def _cases() -> list[tuple[str, tuple[int, ...]]]:
    return [(n, (64, 96) if mx else (3, 130, 257)) for n, (_, mx) in QUANTIZERS.items()]


@pytest.mark.parametrize(("name", "shape"), _cases(), ids=[c[0] for c in _cases()])
def test_round_trip_every_format(comm: Communicator, name: str, shape: tuple) -> None:
    make = QUANTIZERS[name][0]
    mgr = GatherBuffer.create(comm, shape, [make()], dtype=torch.float32)
    for row, col in [(True, False), (False, True), (True, True)]:
        q = make()
        x = random_nd(shape, torch.float32, seed=hash((name, row, col)) % 1000)
        poison(mgr)
        local = mgr.copy_into_buffer(x, q, rowwise=row, columnwise=col, amax_group=None)
        assert not aliases_buffer(local)
        mgr.gather()
        view = mgr.get_buffer(q)
        t = view.value
        assert isinstance(t, QuantizedTensor) and t.shape == shape
        assert (t.has_rowwise, t.has_columnwise) == (row, col)
        assert aliases_buffer(t)
        for c in (False, True):
            if (row, col)[c]:
                assert_within_fp8_error(t, x, c)
                # The scale_inv is the one that travelled with the data, not a quantizer's.
                if t.format(c).quantized and local.tensors()[2 * c + 1] is not None:
                    assert torch.equal(
                        t.tensors()[2 * c + 1].reshape(-1).float(),
                        local.tensors()[2 * c + 1].reshape(-1).float(),
                    )
        local_view = mgr.get_buffer(q, local_chunk=True).value
        assert torch.equal(local_view.dequantize(), t.dequantize())
    mgr.destroy()


def test_scale_inv_comes_from_the_buffer_not_the_quantizer(comm: Communicator) -> None:
    q = DelayedScalingQuantizer(DelayedScalingConfig(history_len=1))
    mgr = GatherBuffer.create(comm, (8, 64), [q], dtype=torch.float32)
    x = random_nd((8, 64), torch.float32, 3)
    q.quantize(x * 64)  # prime: the scale of the next call is set by this amax
    local = mgr.copy_into_buffer(x, q)
    mgr.gather()
    view = mgr.get_buffer(q)
    before = view.value.rowwise_scale_inv.clone()
    q.quantize(x * 1024)  # the quantizer moves on (another microbatch)
    assert not torch.equal(1 / q.scale, before)
    assert torch.equal(view.value.rowwise_scale_inv, before)
    assert torch.equal(before, local.rowwise_scale_inv.reshape(before.shape))
    mgr.destroy()


def test_plain_tensor_gather_and_local_chunk_false(comm: Communicator) -> None:
    mgr = GatherBuffer.create(comm, (6, 10), [torch.int32], dtype=torch.float32)
    x = torch.randint(-9, 9, (6, 10), dtype=torch.int32)
    assert mgr.copy_into_buffer(x) is x
    mgr.gather()
    v = mgr.get_buffer(torch.int32)
    assert torch.equal(v.value, x) and aliases_buffer(v.value)
    # local_chunk=False: the whole tensor, no gather needed.
    y = torch.randint(-9, 9, (6, 10), dtype=torch.int32)
    mgr.copy_into_buffer(y, local_chunk=False)
    assert torch.equal(mgr.get_buffer().value, y)
    mgr.destroy()


def test_columnwise_of_per_tensor_is_the_transpose_after_the_gather(comm: Communicator) -> None:
    q = CurrentScalingQuantizer()
    mgr = GatherBuffer.create(comm, (2, 40, 72), [q], dtype=torch.bfloat16)
    x = random_nd((2, 40, 72), torch.bfloat16, 5)
    local = mgr.copy_into_buffer(x, q, rowwise=True, columnwise=True)
    assert local.has_rowwise and not local.has_columnwise  # only rowwise is cast and sent
    mgr.gather()
    t = mgr.get_buffer(q).value
    assert torch.equal(t.columnwise_data.view(torch.uint8), t.rowwise_data.view(torch.uint8).t())
    assert t.columnwise_scale_inv is t.rowwise_scale_inv
    assert not aliases_buffer(t.columnwise_data) and aliases_buffer(t.rowwise_scale_inv)
    mgr.destroy()


# ---- transient views and saving ----------------------------------------------------------------


def test_views_go_stale_at_the_next_op(comm: Communicator) -> None:
    q = BlockScalingQuantizer()
    mgr = GatherBuffer.create(comm, (4, 256), [q], dtype=torch.float32)
    x = random_nd((4, 256), torch.float32, 7)
    mgr.copy_into_buffer(x, q)
    local_view = mgr.get_buffer(local_chunk=True)
    with pytest.raises(StateError, match="call gather"):
        mgr.get_buffer()
    mgr.gather()
    with pytest.raises(StateError, match="stale view"):
        local_view.value  # noqa: B018 - the access is the check
    view = mgr.get_buffer()
    kept = view.clone()
    assert not view.stale and not aliases_buffer(kept)
    mgr.copy_into_buffer(x * 2, q)  # the next op, a local write
    assert view.stale
    for use in (lambda: view.value, lambda: view.shard(0), view.dequantize, lambda: saveable(view)):
        with pytest.raises(StateError, match="stale view"):
            use()
    assert torch.equal(kept.dequantize(), q.quantize(x).dequantize())
    # A second manager over the same buffer shares its generation.
    other = GatherBuffer(mgr.buffer)
    mgr.gather()
    view = mgr.get_buffer()
    other.copy_into_buffer(x, q)
    with pytest.raises(StateError, match="stale view"):
        view.value  # noqa: B018
    mgr.copy_into_buffer(x, q)
    other.copy_into_buffer(x * 4, q)
    with pytest.raises(StateError, match="overwritten"):
        mgr.gather()
    other.gather()
    mgr.destroy()
    assert view.stale
    with pytest.raises(StateError, match="destroyed"):
        mgr.copy_into_buffer(x, q)


def test_gather_refuses_a_shard_overwritten_by_another_manager(comm: Communicator) -> None:
    q = CurrentScalingQuantizer()
    a = GatherBuffer.create(comm, (4, 64), [q], dtype=torch.float32)
    b = GatherBuffer(a.buffer)
    x = random_nd((4, 64), torch.float32, 9)
    a.copy_into_buffer(x, q)
    b.copy_into_buffer(torch.ones(3, 5))
    with pytest.raises(StateError, match="overwritten"):
        a.gather()
    with pytest.raises(StateError, match="nothing is staged"):
        GatherBuffer(comm.create_buffer(4096)).gather()
    b.gather()
    assert torch.equal(b.get_buffer(torch.float32).value, torch.ones(3, 5))
    a.destroy()


def test_saveable_copies_or_refuses_buffer_views(comm: Communicator) -> None:
    q = HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer())
    mgr = GatherBuffer.create(comm, (128, 256), [q], dtype=torch.float32)
    x = random_nd((128, 256), torch.float32, 11)
    local = mgr.copy_into_buffer(x, q)
    assert saveable(local) is local and detach_from_buffer(local) is local
    mgr.gather()
    view = mgr.get_buffer()
    t = view.value
    with pytest.raises(StateError, match="refusing to save"):
        saveable(t, policy=AliasPolicy.REFUSE)
    with pytest.raises(StateError, match="refusing to save a view"):
        saveable(view, policy=AliasPolicy.REFUSE)
    s = saveable(t)
    assert not aliases_buffer(s) and s is not t
    for a, b in zip(s.tensors(), t.tensors(), strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    plain = torch.randn(4)
    assert saveable(plain) is plain and saveable(None) is None
    with pytest.raises(InvalidArgumentError, match="expected a torch"):
        saveable([plain])
    mgr.destroy()


def test_helpers_save_the_local_shard_and_regather_for_wgrad(comm: Communicator) -> None:
    for q in (CurrentScalingQuantizer(), BlockScalingQuantizer(), MXFP8Quantizer(), None):
        mgr = GatherBuffer.create(comm, (64, 128), [q or torch.float32], dtype=torch.float32)
        x = random_nd((64, 128), torch.float32, 13)
        saved, view = gather_activation(mgr, x, q)
        assert not aliases_buffer(saved) and view.usage == (True, False)
        if q is not None:
            want_cols = not isinstance(q, CurrentScalingQuantizer)
            assert saved.has_columnwise == want_cols  # per-tensor: transposed after the gather
        forward = view.dequantize()
        mgr.copy_into_buffer(torch.randn(16, 64))  # another layer's op
        wgrad = gather_for_wgrad(mgr, saved, q)
        if q is None:
            assert torch.equal(wgrad.value, x)
            continue
        assert wgrad.usage == (False, True)
        assert_within_fp8_error(wgrad.value, x, True)
        # Per-tensor: the transpose of what forward gathered; blocks and MX: the columnwise
        # data (own blocks and scales) that was quantized in forward and saved.
        want = forward if not saved.has_columnwise else saved.dequantize(columnwise=True)
        assert torch.equal(wgrad.dequantize(columnwise=True), want)
        mgr.destroy()


# ---- negative cases: typed errors, nothing written ----------------------------------------------


def test_negative_cases_leave_the_buffer_usable(comm: Communicator) -> None:
    q = BlockScalingQuantizer()
    mgr = GatherBuffer.create(comm, (128, 256), [q], dtype=torch.float32)
    x = random_nd((128, 256), torch.float32, 17)
    mgr.copy_into_buffer(x, q)
    mgr.gather()
    view = mgr.get_buffer()
    want = view.dequantize()
    big = random_nd((256, 256), torch.float32, 1)
    rowwise_only = q.quantize(x, columnwise=False)
    other = MXFP8Quantizer()
    bad = [
        (lambda: mgr.copy_into_buffer(big, q), "need"),
        (lambda: mgr.copy_into_buffer(x.to(torch.int32), q), "must be float32"),
        (lambda: mgr.copy_into_buffer(x.to("meta"), q), "move it there"),
        (lambda: mgr.copy_into_buffer(rowwise_only, other), "formats"),
        (lambda: mgr.copy_into_buffer(rowwise_only, q, columnwise=True), "holds no columnwise"),
        (lambda: mgr.copy_into_buffer(x[0], q), "at least 2-D"),
        (lambda: mgr.copy_into_buffer([1, 2], q), "expects a torch.Tensor"),
        (lambda: mgr.copy_into_buffer(x, "fp8"), "must be a Quantizer"),
        (
            lambda: mgr.copy_into_buffer(x, q, local_chunk=False, rowwise=False, columnwise=False),
            "rowwise or columnwise",
        ),
        (lambda: mgr.get_buffer(other), "holds formats"),
        (lambda: mgr.get_buffer(torch.float32), "not a plain"),
        (lambda: mgr.get_buffer("e4m3"), "must be a Quantizer"),
        (lambda: mgr.get_buffer(q, rowwise=False, columnwise=False), "both False"),
        (lambda: mgr.copy_into_buffer(view.value), "a view into buffer"),
        (lambda: mgr.copy_into_buffer(view.value.rowwise_data.float(), None), "need"),
        (lambda: view.shard(3), "outside a group"),
        (view.shard_scale_invs, "no per-tensor"),
    ]
    for fn, match in bad:
        with pytest.raises(InvalidArgumentError, match=match):
            fn()
        # Nothing was written: the view is still valid and the buffer still works.
        assert torch.equal(view.dequantize(), want), match
    with pytest.raises(InvalidArgumentError, match="did not travel"):
        _rowwise_only_gather(mgr, q, x)
    y = random_nd((128, 256), torch.float32, 19)
    mgr.copy_into_buffer(y, q)
    mgr.gather()
    assert torch.equal(mgr.get_buffer().dequantize(), q.quantize(y).dequantize())
    mgr.destroy()
    mgr.destroy()  # idempotent


def _rowwise_only_gather(mgr: GatherBuffer, q: BlockScalingQuantizer, x: torch.Tensor) -> None:
    mgr.copy_into_buffer(x, q, columnwise=False)
    mgr.gather()
    mgr.get_buffer(q, columnwise=True)


def test_high_precision_quantizer_dtype_is_the_storage_dtype(comm: Communicator) -> None:
    from overlap.quantization import HighPrecisionConfig

    q = HighPrecisionQuantizer(HighPrecisionConfig(torch.bfloat16))
    mgr = GatherBuffer.create(comm, (5, 7), [q], dtype=torch.float32)
    x = random_nd((5, 7), torch.float32, 23)
    mgr.copy_into_buffer(x, q)
    mgr.gather()
    t = mgr.get_buffer(q).value
    assert t.rowwise_data.dtype == torch.bfloat16 and t.columnwise_data is t.rowwise_data
    assert torch.equal(t.rowwise_data, x.bfloat16())
    mgr.destroy()


def test_block_128x128_columnwise_only_shard_regathers(comm: Communicator) -> None:
    q = BlockScalingQuantizer(BlockScalingConfig(block="block_128x128"))
    mgr = GatherBuffer.create(comm, (128, 200), [q], dtype=torch.float32)
    x = random_nd((128, 200), torch.float32, 29)
    colonly = q.quantize(x, rowwise=False)
    # 128x128 tiles: the rowwise direction can be made exactly from the columnwise one.
    mgr.copy_into_buffer(colonly, rowwise=True, columnwise=False)
    mgr.gather()
    assert_within_fp8_error(mgr.get_buffer().value, x, False)
    assert not colonly.has_rowwise  # the caller's tensor was not changed
    mgr.destroy()


# ---- invariant 2 through autograd: two layers on one buffer ----------------------------------


class _GatheredLinear(torch.autograd.Function):
    """A toy sequence-parallel linear layer: gather the quantized activation, ``y = x W^T``;
    save the LOCAL shard and re-gather it for wgrad in backward."""

    @staticmethod
    def forward(ctx, x, w, mgr, q):
        saved, view = gather_activation(mgr, x, q)
        ctx.save_for_backward(*saveable(saved, policy=AliasPolicy.REFUSE).tensors(), w)
        ctx.meta, ctx.mgr, ctx.q = saved.meta, mgr, q
        return view.dequantize() @ w.t()

    @staticmethod
    def backward(ctx, dy):
        *tensors, w = ctx.saved_tensors
        saved = QuantizedTensor.from_tensors(tensors, ctx.meta)
        x_total = gather_for_wgrad(ctx.mgr, saved, ctx.q)
        dw = dy.t() @ x_total.dequantize(columnwise=True)
        return dy @ w, dw, None, None


@pytest.mark.parametrize(
    "make", [CurrentScalingQuantizer, BlockScalingQuantizer], ids=["current", "block1x128"]
)
def test_two_layers_on_one_buffer_keep_layer1_backward_exact(comm: Communicator, make) -> None:
    q1, q2 = make(), make()
    mgr = GatherBuffer.create(comm, (128, 256), [q1], dtype=torch.float32)
    x1 = random_nd((128, 256), torch.float32, 31)
    w1 = torch.randn(256, 256, requires_grad=True)
    w2 = torch.randn(64, 256, requires_grad=True)
    y1 = _GatheredLinear.apply(x1, w1, mgr, q1)
    y2 = _GatheredLinear.apply(y1 * 1e-2, w2, mgr, q2)  # overwrites the buffer
    dy2 = torch.randn_like(y2)
    y2.backward(dy2)
    # Reference: the same quantized operands, without any buffer.
    dy1 = (dy2 @ w2.detach()) * 1e-2
    xq = q1.quantize(x1, columnwise=True)
    want_dw1 = dy1.t() @ xq.dequantize(columnwise=True)
    assert torch.equal(w1.grad, want_dw1)
    mgr.destroy()


# ---- one model of a tensor in a buffer (NOTE [buffer generation], NOTE [one scale slot]) ----


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(1, 16), (5, 48), (128, 256), (333, 1024)])
def test_manager_and_op_lay_out_a_per_tensor_fp8_gather_alike(tp: int, shape: tuple) -> None:
    from overlap._native import native

    fmt = CurrentScalingQuantizer().formats
    layout = gather_layout(shape, tp, formats=fmt, dtype=torch.bfloat16)
    scale = layout.part(PartKind.ROWWISE_SCALE_INV)
    shard_bytes = math.prod(shape)  # one byte per FP8 element
    scale_offset, nbytes = native().comm_ops.ag_gemm_layout(tp, shard_bytes, True)
    assert layout.part(PartKind.ROWWISE_DATA).offset == 0
    assert (scale.offset, scale.slot_nbytes, layout.nbytes) == (
        scale_offset,
        native().comm_ops.SCALE_SLOT_BYTES,
        nbytes,
    )


def test_alias_guard_knows_every_buffer(comm: Communicator) -> None:
    """Not only a manager's buffers: an op's gathered input, a raw view of any buffer."""
    from overlap.ops import AllGatherGemm

    ag = AllGatherGemm(comm, 8, 16, torch.float32, keep_gathered=True)
    ag(torch.randn(8, 16), torch.randn(4, 16))
    kept = ag.gathered_input()
    assert aliases_buffer(kept)
    copy = saveable(kept)
    assert copy is not kept and not aliases_buffer(copy) and torch.equal(copy, kept)
    with pytest.raises(StateError, match="refusing to save"):
        saveable(kept, policy=AliasPolicy.REFUSE)
    raw = comm.create_buffer(64, "raw")
    assert aliases_buffer(raw.view(torch.float32, (4,), offset=16))
    raw.destroy()
    ag.destroy()
    assert not aliases_buffer(kept)  # a destroyed buffer's memory is nobody's buffer now


def test_an_ops_gathered_input_goes_stale_at_the_next_op(comm: Communicator) -> None:
    """Two ops sharing one buffer (as initialize_ub shares them): the first one's gathered
    input is refused once the second one ran, instead of returning the second one's rows."""
    from overlap.ops import AllGatherGemm

    a = AllGatherGemm(comm, 8, 16, torch.float32, keep_gathered=True, name="shared")
    b = AllGatherGemm(comm, 8, 16, torch.float32, keep_gathered=True, buffer=a.buffer)
    x = torch.randn(8, 16)
    a(x, torch.randn(4, 16))
    assert torch.equal(a.gathered_input(), x)
    b(torch.randn(8, 16), torch.randn(4, 16))
    with pytest.raises(StateError, match="overwritten since"):
        a.gathered_input()
    assert b.gathered_input().shape == (8, 16)
    mgr = GatherBuffer(a.buffer)  # a manager on the same buffer: its staging counts too
    mgr.copy_into_buffer(torch.randn(2, 16))
    with pytest.raises(StateError, match="overwritten since"):
        b.gathered_input()
    a.destroy()

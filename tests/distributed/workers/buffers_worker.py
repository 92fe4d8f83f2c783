"""Buffer managers over a TP group, checked against torch.distributed (gloo, CPU copies).

Usage: buffers_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: formats, shared_consumers, pipeline, current_sp, staleness, negative.

Every rank quantizes its own shard (magnitudes differ by rank), the manager gathers it, and
the gathered tensor is compared with every rank's local shard gathered by gloo: the same
bytes, the same scale_inv, dequantizing to the gathered input within FP8 error. Buffers are
poisoned (0xFF bytes, NaN in every float format) before each gather.

On the cuda transport each rank uses ``cuda:<local rank>``; results are moved to the CPU for
the checks; shards are quantized by the CUDA kernels there.
"""

from __future__ import annotations

import sys

import _worker
import torch
import torch.distributed as dist

from overlap.buffers import (
    AliasPolicy,
    BufferView,
    GatherBuffer,
    aliases_buffer,
    gather_activation,
    gather_for_wgrad,
    saveable,
)
from overlap.comm import Communicator, TorchBootstrap
from overlap.errors import InvalidArgumentError, StateError
from overlap.quantization import (
    BlockScalingConfig,
    BlockScalingQuantizer,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    QuantizedTensor,
    Quantizer,
    ScalingMode,
)
from tests.unit.quantizer_cases import QUANTIZERS, assert_within_fp8_error, random_nd

DEVICE = torch.device("cpu")  # cuda:<local rank> on the cuda transport (set in main)
CPU = torch.device("cpu")


# ---- references over gloo ----------------------------------------------------------------------


def allgather(tp: TorchBootstrap, t: torch.Tensor) -> list[torch.Tensor]:
    """Every TP rank's ``t`` (CPU), in TP-rank order."""
    t = t.detach().to(CPU).contiguous()
    raw = t.view(torch.uint8) if t.element_size() == 1 else t
    parts = [torch.empty_like(raw) for _ in range(tp.size)]
    dist.all_gather(parts, raw, group=tp.group)
    return [parts[g].view(t.dtype) for g in tp._order]


def allgather_qt(tp: TorchBootstrap, q: QuantizedTensor) -> list[QuantizedTensor]:
    """Every TP rank's quantized shard (CPU)."""
    q = q.to(CPU)
    per_tensor = [None if t is None else allgather(tp, t) for t in q.tensors()]
    return [
        QuantizedTensor.from_tensors([None if p is None else p[k] for p in per_tensor], q.meta)
        for k in range(tp.size)
    ]


def deq(t: QuantizedTensor, columnwise: bool) -> torch.Tensor:
    """Dequantized values on the CPU; a direction the shard does not hold is read from the
    other one (per-tensor: the transpose holds the same values)."""
    t = t.to(CPU)
    held = t.has_columnwise if columnwise else t.has_rowwise
    return t.dequantize(dtype=torch.float32, columnwise=columnwise if held else not columnwise)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = (t.to(CPU).contiguous().reshape(-1).view(torch.uint8) for t in (a, b))
    return torch.equal(a, b)


# ---- quantizing (the CUDA kernels on cuda, the host references on the CPU) --------------------


def quantize(q: Quantizer, x: torch.Tensor, **kw: object) -> QuantizedTensor:
    return q.quantize(x, **kw)


def stage(mgr: GatherBuffer, x: torch.Tensor, q: Quantizer, **kw: object) -> QuantizedTensor:
    """``mgr.copy_into_buffer(x, q, **kw)``: quantize this rank's shard into its slots."""
    return mgr.copy_into_buffer(x, q, **kw)


def poison(mgr: GatherBuffer) -> None:
    """Fill this rank's region with NaN bytes. Safe before a gather: no peer reads this
    region, and peers write into it only inside the next gather."""
    mgr.buffer.view(torch.uint8, (mgr.nbytes,)).fill_(0xFF)


def inputs(
    tp: TorchBootstrap, shape: tuple[int, ...], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's bf16 shard (magnitude differs by rank) and the gathered input."""
    x = random_nd(shape, torch.float32, seed * 101 + tp.rank) * 2.0 ** (3 * tp.rank)
    x = x.to(torch.bfloat16)
    return x.to(DEVICE), torch.cat(allgather(tp, x))


def check_gathered(
    tp: TorchBootstrap,
    view: BufferView,
    local: QuantizedTensor,
    x_total: torch.Tensor,
    *,
    usage: tuple[bool, bool],
    what: str,
) -> None:
    """The view holds every rank's shard: bytes per shard, scale_invs from the buffer, the
    dequantized whole within FP8 error of the gathered input."""
    refs = allgather_qt(tp, local)
    t = view.value
    assert isinstance(t, QuantizedTensor), what
    assert (t.has_rowwise, t.has_columnwise) == usage, (what, t)
    assert t.shape == tuple(x_total.shape), (what, t.shape)
    for col in (False, True):
        if not usage[col]:
            continue
        # Shard by shard: rank k's own data and scale_inv (NOTE [one scale per per-tensor
        # tensor] in overlap/buffers/manager.py).
        for k in range(tp.size):
            got = deq(view.shard(k), col)
            assert torch.equal(got, deq(refs[k], col)), f"{what}: shard {k} col={col}"
        whole = deq(t, col)
        want = torch.cat([deq(r, col) for r in refs])
        assert torch.equal(whole, want), f"{what}: gathered col={col}"
        assert_within_fp8_error(t.to(CPU), x_total, col)
        if t.format(col).mode is ScalingMode.TENSOR:
            # Invariant 1: the one scale_inv is the gathered one, in the buffer.
            assert aliases_buffer(t.tensors()[2 * col + 1]), what
    if local.has_rowwise and usage[0]:
        want = torch.cat([r.rowwise_data.reshape(-1).view(torch.uint8) for r in refs])
        assert same_bytes(t.rowwise_data, want), f"{what}: gathered rowwise bytes"


# ---- scenarios ---------------------------------------------------------------------------------

ODD_OK = (
    "delayed-e4m3",
    "delayed-e5m2-recent",
    "current-e4m3",
    "current-e5m2-pow2",
    "high-precision",
    "high-precision-bf16",
)


def formats(comm: Communicator, tp: TorchBootstrap) -> None:
    """Every format, several shapes (odd ones where the format allows), every usage."""
    specs = [make() for make, _ in QUANTIZERS.values()]
    mgr = GatherBuffer.create(comm, (2, 64, 257), specs, dtype=torch.bfloat16, name="formats")
    usages = [(True, False), (False, True), (True, True)]
    seed = 0
    for name, (make, mx) in QUANTIZERS.items():
        shapes = [(64, 96), (2, 32, 64)] if mx else [(128, 200), (2, 64, 136)]
        cases = [(s, u) for s in shapes for u in usages]
        if name in ODD_OK:
            cases += [((7, 129), u) for u in usages] + [((3, 5, 131), (True, True))]
        if name == "block1x128-e4m3":  # rowwise 1x128 blocks lie inside a row
            cases += [((7, 129), (True, False)), ((3, 5, 131), (True, False))]
        for shape, usage in cases:
            seed += 1
            what = f"{name} {shape} usage={usage}"
            q = make()
            x, x_total = inputs(tp, shape, seed)
            if "delayed" in name:
                quantize(q, x, amax_group=tp.group)  # prime the history (scale from amax)
            poison(mgr)
            local = stage(mgr, x, q, rowwise=usage[0], columnwise=usage[1], amax_group=tp.group)
            assert not aliases_buffer(local), what
            mgr.gather()
            view = mgr.get_buffer(q, rowwise=usage[0], columnwise=usage[1])
            check_gathered(tp, view, local, x_total, usage=usage, what=what)
            # local_chunk=False: every rank places the whole (same) tensor; no gather needed.
            q1, q2 = make(), make()
            if "delayed" in name:
                quantize(q1, x_total.to(DEVICE))
                quantize(q2, x_total.to(DEVICE))
            poison(mgr)
            whole = stage(
                mgr,
                x_total.to(DEVICE),
                q1,
                local_chunk=False,
                rowwise=usage[0],
                columnwise=usage[1],
            )
            got = mgr.get_buffer(q1, rowwise=usage[0], columnwise=usage[1]).value
            want = quantize(
                q2, x_total.to(DEVICE), rowwise=whole.has_rowwise, columnwise=whole.has_columnwise
            )
            for col in (False, True):
                if usage[col]:
                    assert torch.equal(deq(got, col), deq(want, col)), f"{what} whole col={col}"
    # Plain tensors of any dtype, odd shapes, 1-D included.
    for dtype, shape in [(torch.bfloat16, (5, 3, 7)), (torch.int32, (13,)), (torch.uint8, (3, 1))]:
        x = torch.randint(0, 100, shape).to(dtype).to(DEVICE) + tp.rank
        poison(mgr)
        assert mgr.copy_into_buffer(x) is x
        mgr.gather()
        got = mgr.get_buffer(dtype).value
        assert torch.equal(got.to(CPU), torch.cat(allgather(tp, x))), dtype
    mgr.destroy()


SEED_FORMATS = {
    "current": (CurrentScalingQuantizer, (256, 128)),
    "delayed": (lambda: DelayedScalingQuantizer(DelayedScalingConfig(history_len=4)), (256, 128)),
    "block1x128": (BlockScalingQuantizer, (128, 256)),
    "block128x128": (
        lambda: BlockScalingQuantizer(BlockScalingConfig(block="block_128x128")),
        (128, 256),
    ),
    "mxfp8": (MXFP8Quantizer, (64, 96)),
    "hybrid": (
        lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
        (128, 256),
    ),
}


def shared_consumers(comm: Communicator, tp: TorchBootstrap) -> None:
    """Two consumers share one buffer (the bug behind docs/design.md §3, invariant 2).
    Consumer 1 saves its activation, consumer 2 overwrites the buffer; consumer 1's saved
    activation and scale_inv are intact, its old view refuses to be read, and its backward
    re-gather from the saved shard is exact."""
    specs = [make() for make, _ in SEED_FORMATS.values()]
    mgr = GatherBuffer.create(comm, (256, 256), specs, dtype=torch.bfloat16, name="shared")
    other = GatherBuffer(mgr.buffer)  # a second manager over the same buffer
    for i, (name, (make, shape)) in enumerate(SEED_FORMATS.items()):
        q1, q2 = make(), CurrentScalingQuantizer()
        x1, x1_total = inputs(tp, shape, 500 + i)
        x2, x2_total = inputs(tp, (64, 256), 600 + i)
        x2, x2_total = x2 * 1000, x2_total * 1000  # another magnitude: another scale
        if name == "delayed":
            quantize(q1, x1, amax_group=tp.group)
        poison(mgr)
        # Consumer 1, forward: gather; save the local shard (and, to test it, a copy).
        saved1, view1 = gather_activation(mgr, x1, q1, amax_group=tp.group)
        snapshot = [None if t is None else t.clone() for t in saved1.tensors()]
        forward1 = deq(view1.value, False)
        copy1 = saveable(view1)
        assert not aliases_buffer(copy1) and aliases_buffer(view1.value), name
        for bad in (view1, view1.value):
            _worker.expect_raises(
                StateError, "refusing to save", lambda b=bad: saveable(b, policy=AliasPolicy.REFUSE)
            )
        # Consumer 2 (through either manager) overwrites the buffer.
        consumer2 = other if i % 2 else mgr
        local2 = stage(consumer2, x2, q2, amax_group=tp.group)
        consumer2.gather()
        check_gathered(
            tp, consumer2.get_buffer(q2), local2, x2_total, usage=(True, True), what=name
        )
        # Consumer 1's saved shard and its scale_inv are intact, and so is the copy.
        for before, after in zip(snapshot, saved1.tensors(), strict=True):
            assert (before is None) == (after is None), name
            if before is not None:
                assert same_bytes(before, after), f"{name}: saved shard changed"
        assert torch.equal(deq(copy1, False), forward1), f"{name}: saved copy changed"
        assert view1.stale, name
        _worker.expect_raises(StateError, "stale view", lambda v=view1: v.value)
        # Consumer 1, backward: re-gather for wgrad from the saved shard.
        wgrad = gather_for_wgrad(mgr, saved1, q1)
        assert wgrad.usage == (False, True)
        total = wgrad.value
        assert_within_fp8_error(total.to(CPU), x1_total, True)
        refs = allgather_qt(tp, saved1)
        assert torch.equal(deq(total, True), torch.cat([deq(r, True) for r in refs])), name
        if _per_tensor(q1):
            # The one scale_inv of the shards (an amax group), from the buffer.
            assert torch.equal(
                total.columnwise_scale_inv.to(CPU).reshape(-1),
                saved1.rowwise_scale_inv.to(CPU).reshape(-1),
            ), name
            assert torch.equal(deq(total, True), forward1), name
    mgr.destroy()


def _per_tensor(q: Quantizer) -> bool:
    return isinstance(q, (CurrentScalingQuantizer, DelayedScalingQuantizer))


def pipeline(comm: Communicator, tp: TorchBootstrap) -> None:
    """Pipeline-parallel ordering: several quantize + gather rounds before the consumers read,
    with the (delayed-scaling) quantizer called in between; every gathered tensor keeps the
    scale_inv of its own round. Then backwards in reverse order re-gather from the saved
    shards on one shared buffer."""
    rounds = 4
    q = DelayedScalingQuantizer(DelayedScalingConfig(history_len=1))
    shape = (32, 128)
    mgrs = [
        GatherBuffer.create(comm, shape, [q], dtype=torch.bfloat16, name=f"stage{i}")
        for i in range(rounds)
    ]
    saved, views, totals, scales = [], [], [], []
    for i in range(rounds):
        x, x_total = inputs(tp, shape, 700 + i)
        x = x * 2.0 ** (4 * i)  # every microbatch its own magnitude: its own scale
        x_total = x_total * 2.0 ** (4 * i)
        quantize(q, x, amax_group=tp.group)  # the quantizer runs between rounds (other layers)
        poison(mgrs[i])
        local = stage(mgrs[i], x, q, amax_group=tp.group, columnwise=False)
        mgrs[i].gather()
        saved.append(local)
        views.append(mgrs[i].get_buffer(q))
        totals.append(x_total)
        scales.append(local.rowwise_scale_inv.to(CPU).clone())
    assert len({s.item() for s in scales}) == rounds, scales  # the scales really differ
    for i in range(rounds):  # the consumers read only now
        t = views[i].value
        assert torch.equal(t.rowwise_scale_inv.to(CPU).reshape(-1), scales[i].reshape(-1)), i
        assert torch.equal(
            views[i].shard_scale_invs().to(CPU), scales[i].reshape(1).repeat(tp.size)
        )
        assert_within_fp8_error(t.to(CPU), totals[i], False)
    forward = [deq(v.value, False) for v in views]
    shared = mgrs[0]
    for i in reversed(range(rounds)):  # backwards, the quantizer having moved on
        quantize(q, totals[i].to(DEVICE) * 3, amax_group=tp.group)
        wgrad = gather_for_wgrad(shared, saved[i], q)
        t = wgrad.value
        assert torch.equal(t.columnwise_scale_inv.to(CPU).reshape(-1), scales[i].reshape(-1))
        assert torch.equal(deq(t, True), forward[i]), f"round {i}"
    for i in range(1, rounds):
        assert not views[i].stale  # other buffers' ops leave them alone
    assert views[0].stale
    for m in mgrs:
        m.destroy()


def current_sp(comm: Communicator, tp: TorchBootstrap) -> None:
    """Current scaling under sequence parallelism: with the TP group as amax group every shard
    gets the same scale and the gathered tensor equals quantizing the whole input; without,
    the scales differ and the gathered tensor refuses a single scale_inv."""
    world = dist.get_rank()
    group_id = world // tp.size
    mgr = GatherBuffer.create(
        comm, (48, 256), [CurrentScalingQuantizer()], dtype=torch.bfloat16, name="sp"
    )
    x, x_total = inputs(tp, (48, 256), 800 + group_id)
    q = CurrentScalingQuantizer()
    poison(mgr)
    local = stage(mgr, x, q, amax_group=tp.group, rowwise=True, columnwise=True)
    mgr.gather()
    view = mgr.get_buffer(q)
    assert view.uniform_scale
    per_shard = view.shard_scale_invs()
    assert torch.equal(per_shard, per_shard[:1].repeat(tp.size)), per_shard
    want = quantize(CurrentScalingQuantizer(), x_total.to(DEVICE), columnwise=False)
    t = view.value
    assert same_bytes(t.rowwise_data, want.rowwise_data), "gathered FP8 != whole quantized"
    assert torch.equal(
        t.rowwise_scale_inv.to(CPU).reshape(-1), want.rowwise_scale_inv.to(CPU).reshape(-1)
    )
    for col in (False, True):
        assert_within_fp8_error(t.to(CPU), x_total, col)
    check_gathered(tp, view, local, x_total, usage=(True, True), what="current sp")
    # Other TP groups (their own inputs) have their own scale.
    everyone = [torch.empty(1) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t.rowwise_scale_inv.to(CPU).reshape(1).contiguous())
    for r, s in enumerate(everyone):
        assert torch.equal(s, everyone[world]) == (r // tp.size == group_id), (r, everyone)
    # No amax group: every shard its own scale; a single scale_inv is refused, shards work.
    poison(mgr)
    local = stage(mgr, x, q, rowwise=True, columnwise=True)
    mgr.gather()
    view = mgr.get_buffer(q)
    if tp.size > 1:
        assert not view.uniform_scale
        _worker.expect_raises(InvalidArgumentError, "different scales", lambda: view.value)
        scales = view.shard_scale_invs()
        assert len(set(scales.tolist())) == tp.size, scales
    refs = allgather_qt(tp, local)
    for k in range(tp.size):
        s = view.shard(k)
        assert torch.equal(
            s.rowwise_scale_inv.to(CPU).reshape(-1), refs[k].rowwise_scale_inv.reshape(-1)
        ), k
        assert torch.equal(deq(s, True), deq(refs[k], False)), k
    mgr.destroy()


def staleness(comm: Communicator, tp: TorchBootstrap) -> None:
    """Views are valid until the next op on their buffer, whoever issues it."""
    q = BlockScalingQuantizer()
    mgr = GatherBuffer.create(comm, (128, 256), [q, torch.float32], dtype=torch.float32)
    second = GatherBuffer(mgr.buffer)
    x, x_total = inputs(tp, (128, 256), 900)
    _worker.expect_raises(StateError, "nothing is staged", mgr.gather)
    local = stage(mgr, x, q)
    local_view = mgr.get_buffer(local_chunk=True)
    assert torch.equal(deq(local_view.value, True), deq(local, True))
    _worker.expect_raises(StateError, "call gather", mgr.get_buffer)
    mgr.gather()
    assert local_view.stale
    _worker.expect_raises(StateError, "stale view", lambda: local_view.value)
    view = mgr.get_buffer()
    check_gathered(tp, view, local, x_total, usage=(True, True), what="staleness")
    kept = view.clone()
    y = torch.randn(16, 32, device=DEVICE) + tp.rank
    second.copy_into_buffer(y)
    second.gather()  # collective: every rank's view goes stale
    _worker.expect_raises(StateError, "stale view", lambda: view.value)
    _worker.expect_raises(StateError, "stale view", lambda: view.shard(0))
    _worker.expect_raises(StateError, "overwritten", mgr.gather)
    assert torch.equal(second.get_buffer().value.to(CPU), torch.cat(allgather(tp, y)))
    assert torch.equal(
        deq(kept, False), torch.cat([deq(r, False) for r in allgather_qt(tp, local)])
    )
    v = second.get_buffer()
    mgr.destroy()
    assert v.stale
    _worker.expect_raises(StateError, "stale view", lambda: v.value)
    _worker.expect_raises(StateError, "destroyed", lambda: second.copy_into_buffer(y))


def negative(comm: Communicator, tp: TorchBootstrap) -> None:
    """Every rank makes the same mistake: a typed error before any communication, and the
    buffer (and the last view) stay usable."""
    q = BlockScalingQuantizer(BlockScalingConfig(block="block_128x128"))
    mgr = GatherBuffer.create(comm, (128, 256), [q], dtype=torch.float32, name="neg")
    x, x_total = inputs(tp, (128, 256), 1000)
    local = stage(mgr, x, q)
    mgr.gather()
    view = mgr.get_buffer(q)
    want = deq(view.value, False)
    quantized = quantize(q, x, columnwise=False)
    wrong_device = torch.ones(128, 256) if DEVICE.type == "cuda" else x.to("meta")
    cases = [
        (lambda: mgr.copy_into_buffer(torch.ones(512, 256, device=DEVICE), q), "need"),
        (lambda: mgr.copy_into_buffer(x.to(torch.int32), q), "must be float32"),
        (lambda: mgr.copy_into_buffer(wrong_device, q), "move it there"),
        (lambda: mgr.copy_into_buffer(quantized, MXFP8Quantizer()), "formats"),
        (lambda: mgr.get_buffer(MXFP8Quantizer()), "holds formats"),
        (lambda: mgr.get_buffer(torch.bfloat16), "not a plain"),
    ]
    if tp.size > 1:
        odd = torch.ones(tp.size * 128 + 1, 256, device=DEVICE)
        cases += [
            (
                lambda: mgr.copy_into_buffer(torch.ones(100, 256, device=DEVICE), q),
                "cut a scale block",
            ),
            (lambda: mgr.copy_into_buffer(odd, q, local_chunk=False), "divisible by the group"),
        ]
    for fn, match in cases:
        _worker.expect_raises(InvalidArgumentError, match, fn)
        assert torch.equal(deq(view.value, False), want), match  # nothing was written
    assert torch.equal(want, torch.cat([deq(r, False) for r in allgather_qt(tp, local)]))
    assert_within_fp8_error(view.value.to(CPU), x_total, False)
    # The buffer still gathers correctly.
    y, y_total = inputs(tp, (128, 256), 1001)
    local = stage(mgr, y, q)
    mgr.gather()
    check_gathered(tp, mgr.get_buffer(q), local, y_total, usage=(True, True), what="after errors")
    mgr.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, _launch, DEVICE, tp = _worker.setup(sys.argv)
    comm = Communicator(tp, transport, timeout_s=60)
    {
        "formats": formats,
        "shared_consumers": shared_consumers,
        "pipeline": pipeline,
        "current_sp": current_sp,
        "staleness": staleness,
        "negative": negative,
    }[scenario](comm, tp)
    comm.synchronize()
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

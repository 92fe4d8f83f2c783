"""Collectives on symmetric buffers, checked against torch.distributed (gloo, on CPU copies).

Usage: collectives_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: correctness, delayed, timeout, queued, lifecycle, negative, views, mismatch,
dtype_mismatch, out_of_step, alias, create_errors.

On the cuda transport each rank uses ``cuda:<local rank>``; ops are stream-ordered and
asynchronous, so results are compared after the current stream's work (``.cpu()`` syncs).
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable

import _worker
import torch
import torch.distributed as dist

from overlap.comm import Communicator, SymmetricBuffer, TorchBootstrap
from overlap.errors import (
    BootstrapError,
    CommTimeoutError,
    ConfigError,
    InvalidArgumentError,
    StateError,
    SystemResourceError,
)

DTYPES = [torch.bfloat16, torch.float32, torch.uint8]  # uint8 stands for FP8 bytes
DEVICE = torch.device("cpu")  # cuda:<local rank> on the cuda transport (set in main)


def random_tensor(rows: int, cols: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.uint8:
        x = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=gen)
    else:
        x = torch.randn(rows, cols, generator=gen).to(dtype)
    return x.to(DEVICE)


def delay(seconds: float) -> None:
    """Make this rank late: sleep on the host, or a spin kernel ahead of the op on cuda."""
    if DEVICE.type == "cuda":
        torch.cuda._sleep(int(seconds * 1.5e9))  # ~cycles at H200 clocks
    else:
        time.sleep(seconds)


def reference_all_gather(tp: TorchBootstrap, x: torch.Tensor) -> torch.Tensor:
    x = x.cpu()
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    return torch.cat([parts[g] for g in tp._order]).to(DEVICE)


def reference_reduce_scatter(tp: TorchBootstrap, x: torch.Tensor) -> torch.Tensor:
    """fp32 sum in rank order of every rank's rows for this rank, rounded once."""
    everyone = reference_all_gather(tp, x.unsqueeze(0)).float()
    mine = everyone.chunk(tp.size, dim=1)[tp.rank]
    acc = torch.zeros_like(mine[0])
    for k in range(tp.size):
        acc += mine[k]
    return acc.to(x.dtype)


def correctness(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    buf = comm.create_buffer(1 << 20, "scratch")
    for trial in range(12):
        dtype = DTYPES[trial % len(DTYPES)]
        rows, cols = random.Random(trial).randrange(1, 40), random.Random(-trial).randrange(1, 77)
        x = random_tensor(rows, cols, dtype, gen)  # nbytes rarely a multiple of 16
        buf.put_split = 1 + trial % 3  # one to three copies per peer: same bytes
        buf.pull_gather = trial % 2 == 1  # pushes and pulls: same bytes
        buf.serial_puts = trial % 6 >= 3  # peers one after another or at once: same bytes
        buf.sm_share = (0, 0) if trial % 4 < 2 else (37, 3)  # part by SM copies: same bytes
        out = torch.full((rows * tp.size, cols), 7, dtype=dtype, device=DEVICE)  # poisoned
        got = buf.all_gather(x, out)
        assert got is out
        assert torch.equal(got, reference_all_gather(tp, x)), f"all_gather mismatch {trial}"
        if dtype != torch.uint8:
            y = random_tensor(rows * tp.size, cols, dtype, gen)
            rs = buf.reduce_scatter(y)
            want = reference_reduce_scatter(tp, y)
            assert torch.equal(rs, want), (
                f"reduce_scatter mismatch {trial}: {(rs - want).abs().max()}"
            )
            # Partials already in the buffer (where a GEMM writes them): no data round. Written
            # after a barrier, when no peer reads this region any more.
            buf.barrier()
            in_place = buf.view(dtype, y.shape)
            in_place.copy_(y)
            rs = buf.reduce_scatter(in_place)
            assert torch.equal(rs, want), f"in-place reduce_scatter mismatch {trial}"
            del in_place
    buf.destroy()


def delayed(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Back-to-back ops on one buffer with a deliberately slow rank (invariant 8)."""
    buf = comm.create_buffer(64 * 1024)
    slow = tp.size - 1
    xs = [random_tensor(32, 64, torch.float32, gen) for _ in range(8)]
    wants = [reference_all_gather(tp, x) for x in xs]
    rs_in = [random_tensor(32 * tp.size, 16, torch.bfloat16, gen) for _ in range(8)]
    rs_wants = [reference_reduce_scatter(tp, y) for y in rs_in]
    buf.pull_gather = True  # the pull protocol has its own reuse hazard: test it too
    # Issue everything first (on cuda the ops queue up behind the slow rank's spin kernels),
    # then check: a fast rank must not have overwritten data a slow one was still reading.
    got = []
    for i, x in enumerate(xs):
        if tp.rank == slow:
            delay(0.05 * (i % 3))
        got.append(buf.all_gather(x).clone())
        if tp.rank == slow:
            delay(0.03)
        got.append(buf.reduce_scatter(rs_in[i]).clone())
    for i in range(len(xs)):
        assert torch.equal(got[2 * i], wants[i]), f"all_gather {i} corrupted by a fast rank"
        assert torch.equal(got[2 * i + 1], rs_wants[i]), f"reduce_scatter {i}"
    buf.destroy()


def timeout(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """A rank that never joins: the others raise CommTimeoutError within the deadline + 5 s;
    the communicator is then failed (NOTE [failed transport]): every later op on any of its
    buffers raises at once, naming the timeout, until a new communicator replaces it. The
    absent rank's communicator fails too, through its peers' poisoned flags (NOTE [poisoned
    flags]), without having waited for anything."""
    buf = comm.create_buffer(4096)
    other = comm.create_buffer(4096)
    buf.timeout_s = 1.0
    absent = tp.size - 1
    if tp.rank == absent:
        time.sleep(3.0)  # stays alive but never calls the op
        assert comm.failed and "communicator failed" in (comm.failure or ""), comm.failure
    else:
        t0 = time.monotonic()
        try:
            buf.all_gather(torch.ones(4, device=DEVICE))
            buf.synchronize()  # cuda: the op is asynchronous; the timeout surfaces here
        except CommTimeoutError as exc:
            elapsed = time.monotonic() - t0
            msg = str(exc)
            assert elapsed < 1.0 + 5.0, elapsed
            assert "all_gather" in msg and f"rank {tp.rank}" in msg, msg
            assert f"peer {absent}" in msg or "peer" in msg, msg
        else:
            raise AssertionError("all_gather with an absent rank did not time out")
        # After a timeout the communicator refuses further ops with the same typed error, at
        # once, on every buffer (where another wait would take 30 s).
        buf.timeout_s = 30.0
        ones = torch.ones(4, device=DEVICE)
        for op in (buf.barrier, other.barrier, lambda: other.all_gather(ones)):
            t0 = time.monotonic()
            _worker.expect_raises(CommTimeoutError, "failed earlier", op)
            assert time.monotonic() - t0 < 5.0, "a failed communicator waited again"
            _worker.expect_raises(CommTimeoutError, f"rank {tp.rank} timed out", op)
        assert comm.failed and "all_gather" in (comm.failure or ""), comm.failure
    # A failed rank refuses new buffers too, and so, through the rendezvous, do its peers.
    _worker.expect_raises(CommTimeoutError, "failed earlier", lambda: comm.create_buffer(64))
    buf.destroy()
    comm.destroy()
    # A new communicator works (every rank, the absent one included).
    fresh = Communicator(tp, comm.transport, timeout_s=30)
    x = random_tensor(4, 4, torch.float32, gen)
    assert torch.equal(fresh.create_buffer(4096).all_gather(x), reference_all_gather(tp, x))
    fresh.destroy()


def queued(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Work queued ahead of an op does not count against its deadline (NOTE [watchdog], NOTE
    [one marker per op]): every rank queues 1.5-2 s of GPU work before each op, whose deadline
    is 1 s, and the ops all complete, exactly, without a timeout."""
    buf = comm.create_buffer(64 * 1024)
    buf._core.timeout_s = 1.0
    x = random_tensor(32, 64, torch.float32, gen)
    y = random_tensor(32 * tp.size, 16, torch.bfloat16, gen)
    want_ag, want_rs = reference_all_gather(tp, x), reference_reduce_scatter(tp, y)
    for pull in (False, True):
        buf.pull_gather = pull
        delay(3.0)
        got_ag = buf.all_gather(x).clone()
        delay(3.0)
        got_rs = buf.reduce_scatter(y).clone()
        buf.synchronize()  # a timeout would surface here
        assert torch.equal(got_ag, want_ag), f"all_gather (pull={pull})"
        assert torch.equal(got_rs, want_rs), f"reduce_scatter (pull={pull})"
    buf.destroy()


def _shm_entries(comm: Communicator) -> set[str]:
    """This job's shared-memory names (the tag is unique per job and group)."""
    return {e for e in os.listdir("/dev/shm") if comm._tag in e}


def _free_device_memory() -> int:
    return torch.cuda.mem_get_info(DEVICE)[0] if DEVICE.type == "cuda" else 0


def _cycle(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator, i: int) -> None:
    buf = comm.create_buffer(4096 + 64 * (i % 5))
    if i % 50 == 0:
        # Names are unlinked as soon as every rank has mapped them, not at destroy().
        tp.barrier()  # every owner has finished its rendezvous
        assert not _shm_entries(comm), _shm_entries(comm)
        x = random_tensor(4, 4, torch.float32, gen)
        assert torch.equal(buf.all_gather(x), reference_all_gather(tp, x))
    buf.destroy()
    buf.destroy()  # idempotent


def lifecycle(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """200 create/destroy cycles leak neither device memory, /dev/shm names, file descriptors
    nor mappings."""
    # Warm-up cycles first: the first ops load CUDA modules, create side streams and fill
    # torch's allocator cache, which stay (not a leak) and must not count.
    for i in range(50):
        _cycle(comm, tp, gen, i)
    tp.barrier()
    before_fds = len(os.listdir("/proc/self/fd"))
    before_free = _free_device_memory()
    for i in range(200):
        _cycle(comm, tp, gen, i)
    tp.barrier()
    assert not _shm_entries(comm), _shm_entries(comm)
    assert len(os.listdir("/proc/self/fd")) == before_fds
    with open("/proc/self/maps") as f:
        assert "overlap-" not in f.read(), "a shared-memory mapping survived destroy()"
    # Each buffer is at least one 2 MiB device page: 200 leaked ones would show.
    leaked = before_free - _free_device_memory()
    print(f"lifecycle rank={tp.rank}: device memory change over 200 cycles {leaked} bytes")
    assert leaked < 8 << 20, f"{leaked} bytes of device memory leaked over 200 cycles"


def negative(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    keep = comm.create_buffer(4096, "keep")
    # Sizes differ across ranks: a typed error on every rank, nothing left allocated.
    _worker.expect_raises(
        BootstrapError, "different sizes", lambda: comm.create_buffer(4096 + tp.rank * 64)
    )
    big = torch.zeros(4096 // tp.size + 1, dtype=torch.uint8, device=DEVICE)
    _worker.expect_raises(InvalidArgumentError, "exceed the buffer", lambda: keep.all_gather(big))
    _worker.expect_raises(
        InvalidArgumentError,
        "must be contiguous",
        lambda: keep.all_gather(torch.ones(4, 4, device=DEVICE).t()),
    )
    _worker.expect_raises(
        InvalidArgumentError,
        "divisible by the group size",
        lambda: keep.reduce_scatter(torch.ones(tp.size * 2 + 1, device=DEVICE)),
    )
    _worker.expect_raises(
        InvalidArgumentError,
        "not supported",
        lambda: keep.reduce_scatter(torch.ones(tp.size * 2, dtype=torch.float64, device=DEVICE)),
    )
    if DEVICE.type == "cuda":  # a host tensor given to the cuda transport
        _worker.expect_raises(
            InvalidArgumentError, "move the tensor", lambda: keep.all_gather(torch.ones(4))
        )
    _worker.expect_raises(
        InvalidArgumentError, "outside the buffer", lambda: keep.view(torch.uint8, (4097,))
    )
    _worker.expect_raises(
        InvalidArgumentError, "multiple of", lambda: keep.view(torch.float32, (2,), offset=2)
    )
    # The buffer still works after every rejected call.
    x = random_tensor(8, 8, torch.float32, gen)
    assert torch.equal(keep.all_gather(x), reference_all_gather(tp, x))
    keep.destroy()
    _worker.expect_raises(StateError, "destroyed", lambda: keep.all_gather(x))
    _worker.expect_raises(InvalidArgumentError, "positive int", lambda: comm.create_buffer(0))
    _worker.expect_raises(ConfigError, "put_split", lambda: setattr(keep, "put_split", 9))
    _worker.expect_raises(ConfigError, "sm_percent", lambda: setattr(keep, "sm_share", (101, 4)))


def views(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """DLPack views alias the regions: own and peers', no copy, alive after destroy()."""
    buf = comm.create_buffer(1 << 16)
    x = random_tensor(16, 24, torch.bfloat16, gen)
    want = reference_all_gather(tp, x)
    buf.all_gather(x)
    # Our op completing says our region is whole; a peer's region is whole once every rank
    # has finished its pushes into it, i.e. once all have entered the next op.
    buf.barrier()
    for peer in range(tp.size):  # now every region holds the whole result
        v = buf.view(torch.bfloat16, want.shape, peer=peer)
        assert v.device == x.device and torch.equal(v, want), f"view of peer {peer}"
    # A view aliases the region: what an op writes shows through it.
    mine = buf.view(torch.bfloat16, x.shape, offset=tp.rank * x.numel() * 2)
    fp8 = buf.view(torch.float8_e4m3fn, (8,), offset=64)
    assert fp8.dtype == torch.float8_e4m3fn
    y = random_tensor(16, 24, torch.bfloat16, gen)
    buf.all_gather(y)
    assert torch.equal(mine, y), "a view did not alias the region"
    # Several parts in one op: bf16 data and fp32 "scale_inv" land in their own regions.
    data = random_tensor(6, 10, torch.bfloat16, gen)
    scale = random_tensor(1, 1, torch.float32, gen)
    data_off = tp.size * y.nbytes + 256  # past the gathered y, which `mine` aliases
    scale_off = data_off + tp.size * data.nbytes + 64
    buf.all_gather_into([(data, data_off), (scale.view(-1), scale_off)])
    got_data = buf.view(torch.bfloat16, (tp.size * 6, 10), offset=data_off)
    got_scale = buf.view(torch.float32, (tp.size, 1), offset=scale_off)
    assert torch.equal(got_data, reference_all_gather(tp, data)), "all_gather_into data"
    assert torch.equal(got_scale, reference_all_gather(tp, scale)), "all_gather_into scales"
    _worker.expect_raises(
        InvalidArgumentError,
        "overlap",
        lambda: buf.all_gather_into([(data, 0), (data, data.nbytes)]),
    )
    assert torch.equal(mine, y), "the region changed outside the parts"
    buf.destroy()
    assert torch.equal(mine, y), "a view's memory did not outlive destroy()"
    del mine, v, fp8


def _expect_failed(
    comm: Communicator, buf: SymmetricBuffer, exc_type: type[BaseException], fault: str
) -> None:
    """``comm`` failed with ``fault``: a later op on ``buf`` raises ``exc_type`` at once
    (where another wait would take 30 s), naming it; then ``comm`` is destroyed."""
    buf.timeout_s = 30.0
    t0 = time.monotonic()
    _worker.expect_raises(exc_type, "failed earlier", buf.barrier)
    _worker.expect_raises(exc_type, fault, buf.barrier)
    assert time.monotonic() - t0 < 5.0, "a failed communicator waited again"
    assert comm.failed and fault in (comm.failure or ""), comm.failure
    comm.destroy()


def mismatch(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Ranks calling different collectives (or sizes) get a typed error naming both calls,
    and the communicator is failed (NOTE [failed transport]): a later op raises at once; a
    new communicator works."""
    buf = comm.create_buffer(1 << 16)
    first_half = tp.rank < tp.size // 2
    x = random_tensor(4 * tp.size, 8, torch.float32, gen)
    _worker.expect_raises(
        StateError,
        "collective mismatch",
        lambda: buf.all_gather(x) if first_half else buf.reduce_scatter(x),
    )
    _expect_failed(comm, buf, StateError, "collective mismatch")
    comm = Communicator(tp, comm.transport, timeout_s=30)
    buf = comm.create_buffer(1 << 16)
    rows = 4 + (tp.rank == 0)
    _worker.expect_raises(
        StateError,
        "different sizes",
        lambda: buf.all_gather(random_tensor(rows, 8, torch.float32, gen)),
    )
    _expect_failed(comm, buf, StateError, "different sizes")
    # A new communicator works once every rank calls the same op again.
    comm = Communicator(tp, comm.transport, timeout_s=30)
    buf = comm.create_buffer(1 << 16)
    x = random_tensor(8, 8, torch.float32, gen)
    assert torch.equal(buf.all_gather(x), reference_all_gather(tp, x))
    comm.destroy()


def dtype_mismatch(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """What changes the bytes exchanged is part of the op record: ranks that reduce-scatter
    different dtypes of one size, all-gather different dtypes of one size, or gather by pulls
    against pushes get a collective mismatch instead of garbage."""
    first_half = tp.rank < tp.size // 2
    transport = comm.transport
    comm.destroy()

    def case(call: Callable[[SymmetricBuffer], object]) -> None:
        c = Communicator(tp, transport, timeout_s=30)
        buf = c.create_buffer(1 << 16)
        _worker.expect_raises(StateError, "different sizes, dtypes or settings", lambda: call(buf))
        _expect_failed(c, buf, StateError, "collective mismatch")

    # reduce_scatter, bf16 against fp16
    y = random_tensor(4 * tp.size, 8, torch.bfloat16 if first_half else torch.float16, gen)
    case(lambda b: b.reduce_scatter(y))
    # all_gather, float32 against int32
    z = torch.ones(4, 8, dtype=torch.float32 if first_half else torch.int32, device=DEVICE)
    case(lambda b: b.all_gather(z))
    # all_gather by pulls against pushes
    x = random_tensor(4, 8, torch.float32, gen)

    def pulls_against_pushes(b: SymmetricBuffer) -> object:
        b.pull_gather = first_half
        return b.all_gather(x)

    case(pulls_against_pushes)


def out_of_step(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """NOTE [op sequence]: a rank whose op sequence is out of step (here rank 0 skips epochs
    through a test hook, as a failed op once did) is detected on the host transport before
    any data moves: its peers raise at once instead of pairing their op with another one of
    rank 0's; rank 0, whose peers never reach its epoch, times out. Both fail."""
    buf = comm.create_buffer(4096)
    buf.timeout_s = 1.0 if tp.rank == 0 else 30.0
    x = random_tensor(4, 4, torch.float32, gen)
    assert torch.equal(buf.all_gather(x), reference_all_gather(tp, x))
    if tp.rank == 0:
        buf._core._skip_epochs_for_test(4)
        _worker.expect_raises(CommTimeoutError, "timed out", lambda: buf.all_gather(x))
        _expect_failed(comm, buf, CommTimeoutError, "timed out")
    else:
        t0 = time.monotonic()
        _worker.expect_raises(StateError, "out of step", lambda: buf.all_gather(x))
        assert time.monotonic() - t0 < 10.0, "the out-of-step op waited for its deadline"
        _expect_failed(comm, buf, StateError, "out of step")


def alias(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """A reduce-scatter output inside the buffer (ours or a peer's region, which the peers
    read during the op) and an input inside it other than the partials in place are refused
    before the op communicates: the buffer stays usable."""
    buf = comm.create_buffer(1 << 16)
    y = random_tensor(4 * tp.size, 8, torch.float32, gen)
    peer = (tp.rank + 1) % tp.size
    for where in (tp.rank, peer):
        out = buf.view(torch.float32, (4, 8), offset=y.nbytes, peer=where)
        _worker.expect_raises(
            InvalidArgumentError, "output overlaps", lambda o=out: buf.reduce_scatter(y, o)
        )
    inside = buf.view(torch.float32, y.shape, offset=256)
    _worker.expect_raises(
        InvalidArgumentError, "input overlaps", lambda: buf.reduce_scatter(inside)
    )
    mine = buf.view(torch.float32, y.shape)
    _worker.expect_raises(
        InvalidArgumentError, "output overlaps", lambda: buf.reduce_scatter(mine, mine[:4])
    )
    assert not comm.failed
    assert torch.equal(buf.reduce_scatter(y), reference_reduce_scatter(tp, y))
    buf.destroy()


def create_errors(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Sizes a rank refuses raise typed errors on every rank, never a hang or a crash
    (NOTE [size bounds]); shared memory is reserved at creation (NOTE [shm reservation]), so
    a /dev/shm too small is a SystemResourceError now, not a SIGBUS in a later op."""
    huge = 2**64 - 1
    for nbytes in (huge, 2**64, 2**48 + 1):
        _worker.expect_raises(
            InvalidArgumentError, "exceeds", lambda n=nbytes: comm.create_buffer(n)
        )
    # One rank alone asks for too much: every rank raises, typed, and none waits for it.
    one = huge if tp.rank == 0 else 4096
    _worker.expect_raises(InvalidArgumentError, "rank 0: nbytes", lambda: comm.create_buffer(one))
    bad: object = "many" if tp.rank == tp.size - 1 else 4096
    _worker.expect_raises(
        InvalidArgumentError,
        "positive int",
        lambda: comm.create_buffer(bad),  # type: ignore[arg-type]
    )
    if DEVICE.type == "cpu":
        st = os.statvfs("/dev/shm")
        total = st.f_blocks * st.f_frsize
        if total > 0:  # a size-limited tmpfs: more than all of it cannot be reserved
            big = total + (1 << 20) if tp.rank == 0 else 4096
            _worker.expect_raises(
                SystemResourceError, "shared memory", lambda: comm.create_buffer(big)
            )
            tp.barrier()  # every rank has freed its segment
            assert not _shm_entries(comm), _shm_entries(comm)
            tp.barrier()  # before any rank creates the next one
    assert not comm.failed
    buf = comm.create_buffer(4096)
    x = random_tensor(4, 4, torch.float32, gen)
    assert torch.equal(buf.all_gather(x), reference_all_gather(tp, x))
    buf.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, launch, DEVICE, tp = _worker.setup(sys.argv)
    gen = torch.Generator().manual_seed(1234 + launch.rank)
    comm = Communicator(tp, transport, timeout_s=30)
    {
        "correctness": correctness,
        "delayed": delayed,
        "timeout": timeout,
        "queued": queued,
        "lifecycle": lifecycle,
        "negative": negative,
        "views": views,
        "mismatch": mismatch,
        "dtype_mismatch": dtype_mismatch,
        "out_of_step": out_of_step,
        "alias": alias,
        "create_errors": create_errors,
    }[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

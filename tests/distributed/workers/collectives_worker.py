"""Collectives on symmetric buffers, checked against torch.distributed (gloo, on CPU copies).

Usage: collectives_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: correctness, delayed, timeout, queued, lifecycle, negative, views, mismatch.

On the cuda transport each rank uses ``cuda:<local rank>``; ops are stream-ordered and
asynchronous, so results are compared after the current stream's work (``.cpu()`` syncs).
"""

from __future__ import annotations

import os
import random
import sys
import time

import _worker
import torch
import torch.distributed as dist

from overlap.comm import Communicator, TorchBootstrap
from overlap.errors import (
    BootstrapError,
    CommTimeoutError,
    ConfigError,
    InvalidArgumentError,
    StateError,
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
    """A rank that never joins: the others raise CommTimeoutError within the deadline + 5 s."""
    buf = comm.create_buffer(4096)
    buf._core.timeout_s = 1.0
    absent = tp.size - 1
    if tp.rank == absent:
        time.sleep(3.0)  # stays alive but never calls the op
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
        # After a timeout the communicator refuses further ops with the same typed error.
        _worker.expect_raises(CommTimeoutError, "timed out", buf.barrier)
    buf.destroy()


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


def mismatch(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Ranks calling different collectives (or sizes) get a typed error naming both calls."""
    buf = comm.create_buffer(1 << 16)
    first_half = tp.rank < tp.size // 2
    x = random_tensor(4 * tp.size, 8, torch.float32, gen)
    _worker.expect_raises(
        StateError,
        "collective mismatch",
        lambda: buf.all_gather(x) if first_half else buf.reduce_scatter(x),
    )
    rows = 4 + (tp.rank == 0)
    _worker.expect_raises(
        StateError,
        "different sizes",
        lambda: buf.all_gather(random_tensor(rows, 8, torch.float32, gen)),
    )
    # The buffer still works once every rank calls the same op again.
    x = random_tensor(8, 8, torch.float32, gen)
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
    }[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

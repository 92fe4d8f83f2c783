"""Host-transport collectives on symmetric buffers, checked against torch.distributed (gloo).

Usage: collectives_worker.py <scenario> <tp_size>
Scenarios: correctness, delayed, timeout, lifecycle, negative.
"""

from __future__ import annotations

import os
import random
import sys
import time

import _worker
import torch
import torch.distributed as dist

from overlap.comm import Communicator, TorchBootstrap, tp_subgroup
from overlap.errors import BootstrapError, CommTimeoutError, InvalidArgumentError, StateError
from overlap.launch import init_torch_distributed

DTYPES = [torch.bfloat16, torch.float32, torch.uint8]  # uint8 stands for FP8 bytes


def random_tensor(rows: int, cols: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype == torch.uint8:
        return torch.randint(0, 256, (rows, cols), dtype=torch.uint8, generator=gen)
    return torch.randn(rows, cols, generator=gen).to(dtype)


def reference_all_gather(tp: TorchBootstrap, x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    return torch.cat([parts[g] for g in tp._order])


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
        out = torch.full((rows * tp.size, cols), 7, dtype=dtype)  # poisoned
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
    buf.destroy()


def delayed(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Back-to-back ops on one buffer with a deliberately slow rank (invariant 8)."""
    buf = comm.create_buffer(64 * 1024)
    slow = tp.size - 1
    xs = [random_tensor(32, 64, torch.float32, gen) for _ in range(8)]
    wants = [reference_all_gather(tp, x) for x in xs]
    rs_in = [random_tensor(32 * tp.size, 16, torch.bfloat16, gen) for _ in range(8)]
    rs_wants = [reference_reduce_scatter(tp, y) for y in rs_in]
    for i, (x, want) in enumerate(zip(xs, wants, strict=True)):
        if tp.rank == slow:
            time.sleep(0.05 * (i % 3))
        assert torch.equal(buf.all_gather(x), want), f"all_gather {i} corrupted by a fast rank"
        if tp.rank == slow:
            time.sleep(0.03)
        assert torch.equal(buf.reduce_scatter(rs_in[i]), rs_wants[i]), f"reduce_scatter {i}"
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
            buf.all_gather(torch.ones(4))
        except CommTimeoutError as exc:
            elapsed = time.monotonic() - t0
            msg = str(exc)
            assert elapsed < 1.0 + 5.0, elapsed
            assert "all_gather" in msg and f"rank {tp.rank}" in msg, msg
            assert f"peer {absent}" in msg or "peer" in msg, msg
        else:
            raise AssertionError("all_gather with an absent rank did not time out")
    buf.destroy()


def _shm_entries(comm: Communicator) -> set[str]:
    """This job's shared-memory names (the tag is unique per job and group)."""
    return {e for e in os.listdir("/dev/shm") if comm._tag in e}


def lifecycle(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """200 create/destroy cycles leak neither /dev/shm names, file descriptors nor mappings."""
    tp.barrier()
    before_fds = len(os.listdir("/proc/self/fd"))
    for i in range(200):
        buf = comm.create_buffer(4096 + 64 * (i % 5))
        if i % 50 == 0:
            # Names are unlinked as soon as every rank has mapped them, not at destroy().
            tp.barrier()  # every owner has finished its rendezvous
            assert not _shm_entries(comm), _shm_entries(comm)
            x = random_tensor(4, 4, torch.float32, gen)
            assert torch.equal(buf.all_gather(x), reference_all_gather(tp, x))
        buf.destroy()
        buf.destroy()  # idempotent
    tp.barrier()
    assert not _shm_entries(comm), _shm_entries(comm)
    assert len(os.listdir("/proc/self/fd")) == before_fds
    with open("/proc/self/maps") as f:
        assert "overlap-" not in f.read(), "a shared-memory mapping survived destroy()"


def negative(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    keep = comm.create_buffer(4096, "keep")
    # Sizes differ across ranks: a typed error on every rank, nothing left allocated.
    _worker.expect_raises(
        BootstrapError, "different sizes", lambda: comm.create_buffer(4096 + tp.rank * 64)
    )
    big = torch.zeros(4096 // tp.size + 1, dtype=torch.uint8)
    _worker.expect_raises(InvalidArgumentError, "exceed the buffer", lambda: keep.all_gather(big))
    _worker.expect_raises(
        InvalidArgumentError, "must be contiguous", lambda: keep.all_gather(torch.ones(4, 4).t())
    )
    _worker.expect_raises(
        InvalidArgumentError,
        "divisible by the group size",
        lambda: keep.reduce_scatter(torch.ones(tp.size * 2 + 1)),
    )
    _worker.expect_raises(
        InvalidArgumentError,
        "not supported",
        lambda: keep.reduce_scatter(torch.ones(tp.size * 2, dtype=torch.float64)),
    )
    # The buffer still works after every rejected call.
    x = random_tensor(8, 8, torch.float32, gen)
    assert torch.equal(keep.all_gather(x), reference_all_gather(tp, x))
    keep.destroy()
    _worker.expect_raises(StateError, "destroyed", lambda: keep.all_gather(x))
    _worker.expect_raises(InvalidArgumentError, "positive int", lambda: comm.create_buffer(0))


def main() -> None:
    scenario, tp_size = sys.argv[1], int(sys.argv[2])
    launch = init_torch_distributed("gloo")
    tp = tp_subgroup(TorchBootstrap(), tp_size)
    gen = torch.Generator().manual_seed(1234 + launch.rank)
    comm = Communicator(tp, "host", timeout_s=30)
    {
        "correctness": correctness,
        "delayed": delayed,
        "timeout": timeout,
        "lifecycle": lifecycle,
        "negative": negative,
    }[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

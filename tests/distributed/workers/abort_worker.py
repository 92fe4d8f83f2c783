"""Communicator.abort() on the cuda transport (NOTE [abort] in csrc/comm/fault.h): a GPU wait
that no peer will ever satisfy ends within 100 ms of an abort from another thread, the GPU
stays usable, the aborted communicator fails every later op at once, and its peer fails
through the poisoned flags (NOTE [poisoned flags]) well before its deadline.

Usage (launched by launcher.run_local_ranks): abort_worker.py
Rank 0 enqueues an all-gather that rank 1 never joins, lets the GPU wait, then aborts from a
second thread; rank 1 waits (through the store) until rank 0 aborted, then calls the op.
"""

from __future__ import annotations

import threading
import time

import _worker
import torch
import torch.distributed as dist

from overlap.comm import Communicator
from overlap.errors import CommAbortedError, CommTimeoutError, OverlapError, StateError

DEADLINE_S = 30.0  # far beyond every bound checked here: only the abort can end the waits
BOUND_S = 0.1  # the bound on ending a wait after abort()
SLACK_S = 0.15  # the watchdog's poll and a loaded host's scheduling


def main() -> None:
    world = _worker.local_setup()
    rank = world.rank
    torch.cuda.set_device(rank % torch.cuda.device_count())
    comm = Communicator(world, "cuda", timeout_s=DEADLINE_S)
    buf = comm.create_buffer(1 << 20)
    x = torch.full((256,), float(rank + 1), device="cuda")
    # One op both ranks complete: the GPU path works before the fault.
    assert torch.equal(buf.all_gather(x).cpu(), torch.cat([torch.full((256,), 1.0),
                                                           torch.full((256,), 2.0)]))  # fmt: skip
    comm.synchronize()
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        buf.all_gather(x)  # enqueued; the GPU waits for rank 1, which never comes
        time.sleep(0.5)
        assert not comm.failed, "the communicator failed before the abort"
        aborted_at: list[float] = []

        def abort() -> None:
            aborted_at.append(time.monotonic())
            comm.abort()

        t = threading.Thread(target=abort)
        t.start()
        t.join()
        try:
            comm.synchronize()
        except (CommAbortedError, StateError) as exc:
            ended = time.monotonic() - aborted_at[0]
            print(f"rank 0: synchronize raised {type(exc).__name__} {ended * 1e3:.0f} ms after "
                  f"abort(): {exc}", flush=True)  # fmt: skip
            assert ended < BOUND_S + SLACK_S, f"the GPU wait ended {ended:.3f} s after abort()"
        else:
            raise AssertionError("synchronize() after abort() raised nothing")
        torch.cuda.synchronize()  # the GPU's waits were released: nothing is left hanging
        assert torch.equal((x * 2).cpu(), torch.full((256,), 2.0)), "the GPU is not usable"
        t0 = time.monotonic()
        try:
            buf.all_gather(x)
        except OverlapError as exc:
            assert time.monotonic() - t0 < 1.0, "a failed communicator's op did not fail at once"
            print(f"rank 0: next op raised {type(exc).__name__}", flush=True)
        else:
            raise AssertionError("an op on an aborted communicator raised nothing")
        store.set("aborted", "1")
    else:
        store.wait(["aborted"])
        t0 = time.monotonic()
        try:
            buf.all_gather(x)
            comm.synchronize()
        except (CommAbortedError, CommTimeoutError, StateError) as exc:
            elapsed = time.monotonic() - t0
            print(f"rank 1: {type(exc).__name__} after {elapsed:.2f} s: {exc}", flush=True)
            assert elapsed < DEADLINE_S / 2, "the peer of an aborted rank waited its deadline"
        else:
            raise AssertionError("the peer of an aborted rank completed an op with it")
        torch.cuda.synchronize()
    buf.destroy()
    comm.destroy()
    store.set(f"done{rank}", "1")
    store.wait(["done0", "done1"])


if __name__ == "__main__":
    _worker.run_local(main)

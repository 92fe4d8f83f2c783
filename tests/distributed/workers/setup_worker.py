"""Set-up deadlines (NOTE [set-up deadlines] in overlap/comm/_setup.py): a peer that dies or
hangs during Communicator(), create_buffer() or initialize_ub() makes every live rank raise a
typed error within the deadline, and nothing stays in /dev/shm.

Usage (launched by launcher.run_local_ranks, no mpirun: a rank dies): setup_worker.py <scenario>
Scenarios (the last rank is the victim):
  die_in_create      killed (SIGKILL) inside create_buffer, once its segment exists
  hang_in_communicator  never takes part in Communicator()
  die_in_initialize_ub  killed inside initialize_ub's second buffer
"""

from __future__ import annotations

import os
import signal
import sys
import time

import _worker

from overlap.comm import Bootstrap, Communicator
from overlap.errors import BootstrapError, CommTimeoutError

TIMEOUT_S = 2.0
MARGIN_S = 3.0  # scheduling, process start-up of a loaded CI machine


class Sabotaged(Bootstrap):
    """``group`` whose ``kill_at``-th exchange (counted from 1) kills this process."""

    def __init__(self, group: Bootstrap, kill_at: int) -> None:
        self._group = group
        self._calls = 0
        self._kill_at = kill_at
        self.rank, self.size = group.rank, group.size

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        self._calls += 1
        if self._calls == self._kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return self._group.allgather_bytes(data)

    def split(self, color: int, key: int) -> Bootstrap:
        raise NotImplementedError


def shm_names(tag: str) -> list[str]:
    return [e for e in os.listdir("/dev/shm") if tag in e]


def expect_setup_failure(call: object, what: str) -> None:
    t0 = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except (CommTimeoutError, BootstrapError) as exc:
        elapsed = time.monotonic() - t0
        print(f"{what}: {type(exc).__name__} after {elapsed:.2f} s: {exc}", flush=True)
        assert elapsed < TIMEOUT_S + MARGIN_S, f"{what} raised only after {elapsed:.1f} s"
    else:
        raise AssertionError(f"{what} with a dead or absent peer raised nothing")


def die_in_create(world: Bootstrap, victim: bool) -> None:
    # Communicator() exchanges twice; the third exchange is create_buffer's first, after the
    # victim's segment exists: the survivors must remove it.
    group = Sabotaged(world, kill_at=3) if victim else world
    comm = Communicator(group, "host", timeout_s=TIMEOUT_S)
    expect_setup_failure(lambda: comm.create_buffer(1 << 16), "create_buffer")
    assert comm.failed, "a set-up timeout leaves the group out of step: the communicator fails"
    time.sleep(0.5)  # a peer that is slow to clean up would show here
    assert not shm_names(comm._tag), shm_names(comm._tag)
    comm.destroy()


def hang_in_communicator(world: Bootstrap, victim: bool) -> None:
    if victim:
        time.sleep(TIMEOUT_S + 1.0)  # alive, but never takes part
        return
    expect_setup_failure(lambda: Communicator(world, "host", timeout_s=TIMEOUT_S), "Communicator")


def die_in_initialize_ub(world: Bootstrap, victim: bool) -> None:
    import torch

    import overlap

    # Communicator(): 2 exchanges; its one buffer (NOTE [userbuffer memory]): 3 more. The
    # victim dies in the buffer's second exchange (every segment exists and is mapped).
    group = Sabotaged(world, kill_at=4) if victim else world
    before = set(os.listdir("/dev/shm"))
    expect_setup_failure(
        lambda: overlap.initialize_ub(
            (8 * world.size, 32),
            group,
            torch.float32,
            transport="host",
            timeout_s=TIMEOUT_S,
            register=False,
        ),
        "initialize_ub",
    )
    time.sleep(0.5)
    left = {e for e in set(os.listdir("/dev/shm")) - before if e.startswith("overlap-")}
    assert not left, left


def main() -> None:
    world = _worker.local_setup()
    victim = world.rank == world.size - 1
    {
        "die_in_create": die_in_create,
        "hang_in_communicator": hang_in_communicator,
        "die_in_initialize_ub": die_in_initialize_ub,
    }[sys.argv[1]](world, victim)


if __name__ == "__main__":
    _worker.run_local(main)

"""Both bootstrap adapters exchange bytes and agree on rank, size and TP subgroups.

Usage: bootstrap_worker.py <adapter: mpi|gloo> <tp_size>
"""

from __future__ import annotations

import os
import random
import sys

import _worker

from overlap.comm.bootstrap import MPIBootstrap, TorchBootstrap, check_single_host, tp_subgroup
from overlap.errors import ConfigError
from overlap.launch import detect_launch_env, init_torch_distributed


def payload(rank: int, round_: int) -> bytes:
    """Deterministic, rank-dependent bytes of varied length (0 bytes up to ~1 MiB)."""
    rng = random.Random(rank * 1000 + round_)
    size = [0, 1, 17, 4096, 1 << 20][(rank + round_) % 5] + rng.randrange(3)
    return rng.randbytes(size)


def check_group(group, expected_ranks: list[int], world_rank: int) -> None:
    assert group.size == len(expected_ranks), (group.size, expected_ranks)
    assert group.rank == expected_ranks.index(world_rank), (group.rank, expected_ranks)
    for round_ in range(3):
        got = group.allgather_bytes(payload(world_rank, round_))
        want = [payload(r, round_) for r in expected_ranks]
        assert got == want, f"allgather mismatch in round {round_}"
    root = group.size - 1
    data = group.broadcast_bytes(payload(world_rank, 7) if group.rank == root else None, root)
    assert data == payload(expected_ranks[root], 7)
    group.barrier()


def main() -> None:
    adapter, tp_size = sys.argv[1], int(sys.argv[2])
    launch = detect_launch_env()
    from mpi4py import MPI

    assert launch.launcher == "openmpi"
    assert (launch.rank, launch.world_size) == (
        MPI.COMM_WORLD.Get_rank(),
        MPI.COMM_WORLD.Get_size(),
    )
    if adapter == "mpi":
        world = MPIBootstrap()
    else:
        init_torch_distributed("gloo")
        assert os.environ["RANK"] == str(launch.rank)
        assert os.environ["WORLD_SIZE"] == str(launch.world_size)
        world = TorchBootstrap()
    rank, size = launch.rank, launch.world_size
    check_group(world, list(range(size)), rank)
    check_single_host(world, "the world")

    tp = tp_subgroup(world, tp_size)
    first = rank // tp_size * tp_size
    check_group(tp, list(range(first, first + tp_size)), rank)

    # Arbitrary subgroups: odd and even ranks, ordered in reverse by key.
    parity = world.split(color=rank % 2, key=-rank)
    members = sorted((r for r in range(size) if r % 2 == rank % 2), reverse=True)
    check_group(parity, members, rank)

    # A TP size that does not divide the world fails on every rank, before any exchange.
    _worker.expect_raises(ConfigError, "positive divisor", lambda: tp_subgroup(world, size + 1))
    world.barrier()  # still usable after the error


if __name__ == "__main__":
    _worker.run(main)

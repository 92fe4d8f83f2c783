"""Rank detection for every launcher and the mpirun command line."""

from __future__ import annotations

import pytest

from overlap.errors import ConfigError
from overlap.launch import detect_launch_env, mpirun_command


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 1, 0, 1, "single")),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            (3, 4, 1, 2, "openmpi"),
        ),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, (1, 2, 1, 2, "torchrun")),
        (
            {
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "1",
                "SLURM_NTASKS_PER_NODE": "4",
            },
            (5, 8, 1, 4, "slurm"),
        ),
        # Open MPI wins over stale torchrun variables inherited from the parent shell.
        (
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "2",
                "RANK": "7",
                "WORLD_SIZE": "9",
            },
            (0, 2, 0, 2, "openmpi"),
        ),
    ],
    ids=["single", "openmpi", "torchrun", "slurm", "openmpi-first"],
)
def test_detect_launch_env(environ: dict[str, str], expected: tuple) -> None:
    e = detect_launch_env(environ)
    assert (e.rank, e.world_size, e.local_rank, e.local_size, e.launcher) == expected


@pytest.mark.parametrize(
    "environ",
    [{"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}],
    ids=["not-an-int", "rank-out-of-range"],
)
def test_detect_launch_env_rejects_garbage(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        detect_launch_env(environ)


def test_mpirun_command_forwards_env_and_no_multicast() -> None:
    cmd = mpirun_command(4, ["python", "w.py"], env={"A": "1"}, mpirun="/usr/bin/mpirun")
    assert cmd[:3] == ["/usr/bin/mpirun", "-np", "4"]
    assert "--oversubscribe" in cmd and cmd[-2:] == ["python", "w.py"]
    pairs = {cmd[i + 1] for i, c in enumerate(cmd) if c == "-x"}
    assert {
        "A=1",
        "NCCL_NVLS_ENABLE=0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "NVSHMEM_DISABLE_NVLS=1",
    } <= pairs


def test_mpirun_command_rejects_zero_ranks() -> None:
    with pytest.raises(ConfigError, match="nprocs"):
        mpirun_command(0, ["x"])

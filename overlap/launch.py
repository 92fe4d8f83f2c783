"""Process launch helpers: who am I, torch rendezvous under mpirun, and mpirun command lines.

``mpirun`` does not set torch's rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``). :func:`init_torch_distributed` derives them in one place: rank 0
opens a TCP store on a port the OS picks (so back-to-back launches never collide on a port)
and broadcasts its address over MPI.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shlex
import socket
from collections.abc import Mapping, Sequence

from overlap.env import settings
from overlap.errors import ConfigError

__all__ = [
    "LaunchEnv",
    "detect_launch_env",
    "init_torch_distributed",
    "mpirun_command",
]

# Variables every mpirun launch forwards to its ranks (docs/design.md §7: no NVLink multicast).
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in a multi-process job.

    Attributes:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of processes in the job.
        local_rank: rank among the processes of this host.
        local_size: number of processes on this host.
        launcher: "openmpi", "torchrun", "slurm" or "single".
    """

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    launcher: str


def _int_var(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def detect_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Find rank and size from Open MPI, torchrun/``RANK``, or Slurm variables (in that order).

    A process started by none of them is rank 0 of a job of one.
    """
    env = os.environ if environ is None else environ
    schemes = (
        (
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    )
    for launcher, rank_v, size_v, local_rank_v, local_size_v in schemes:
        if rank_v in env and size_v in env:
            rank, size = _int_var(env, rank_v), _int_var(env, size_v)
            local_rank = _int_var(env, local_rank_v) if local_rank_v in env else rank
            local_size = (
                _int_var(env, local_size_v)
                if local_size_v in env and env[local_size_v].isdigit()
                else size
            )
            if not 0 <= rank < size:
                raise ConfigError(f"{launcher}: rank {rank} is outside world size {size}")
            return LaunchEnv(rank, size, local_rank, local_size, launcher)
    return LaunchEnv(0, 1, 0, 1, "single")


def init_torch_distributed(
    backend: str = "gloo",
    *,
    timeout_s: float | None = None,
    mpi_comm: object | None = None,
) -> LaunchEnv:
    """Initialise ``torch.distributed`` for this job and return its :class:`LaunchEnv`.

    Under torchrun (``MASTER_ADDR``/``MASTER_PORT`` set) this is the standard ``env://``
    initialisation. Under mpirun, rank 0 opens a TCP store on an OS-chosen port and broadcasts
    ``host:port`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``); the usual variables
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) are then set
    for code that reads them. Collective over the job.

    Args:
        backend: "gloo" or "nccl" (nccl binds each rank to ``cuda:local_rank`` first).
        timeout_s: rendezvous and collective timeout (default ``OVERLAP_TIMEOUT_S``).
        mpi_comm: an mpi4py communicator spanning the job.

    Before the process exits, call ``dist.barrier(); dist.destroy_process_group()``: gloo's
    worker threads otherwise race the interpreter's shutdown and can abort a process whose
    work succeeded.
    """
    import torch.distributed as dist

    launch = detect_launch_env()
    timeout = datetime.timedelta(seconds=timeout_s or settings().timeout_s)
    if backend == "nccl":
        import torch

        torch.cuda.set_device(launch.local_rank % max(1, torch.cuda.device_count()))
    if dist.is_initialized():
        return launch
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ and launch.launcher != "openmpi":
        dist.init_process_group(backend, timeout=timeout)
        return launch

    if mpi_comm is None:
        from mpi4py import MPI

        mpi_comm = MPI.COMM_WORLD
    store = None
    address = None
    if launch.rank == 0:
        hosts = mpi_comm.gather(socket.gethostname(), root=0)
        # All ranks on this host: loopback. Otherwise the address the others can reach.
        host = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.getfqdn())
        store = dist.TCPStore(
            host, 0, launch.world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        address = (host, store.port)
    else:
        mpi_comm.gather(socket.gethostname(), root=0)
    host, port = mpi_comm.bcast(address, root=0)
    if store is None:
        store = dist.TCPStore(host, port, launch.world_size, is_master=False, timeout=timeout)
    os.environ.update(
        {
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "RANK": str(launch.rank),
            "WORLD_SIZE": str(launch.world_size),
            "LOCAL_RANK": str(launch.local_rank),
        }
    )
    dist.init_process_group(
        backend, store=store, rank=launch.rank, world_size=launch.world_size, timeout=timeout
    )
    return launch


def mpirun_command(
    nprocs: int,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    mpirun: str | None = None,
    tag_output: bool = True,
) -> list[str]:
    """Command line running ``argv`` on ``nprocs`` local ranks under Open MPI.

    Adds ``--oversubscribe`` (more ranks than cores is fine for tests), ``--allow-run-as-root``
    when running as root, ``--bind-to none``, ``--tag-output`` (rank prefixes on every output
    line, unless ``tag_output`` is false), and ``-x NAME=VALUE`` for every
    entry of ``env`` plus the no-multicast variables of docs/design.md §7.
    """
    if nprocs < 1:
        raise ConfigError(f"nprocs must be >= 1, got {nprocs}")
    cmd = [
        mpirun or settings().mpirun,
        "-np",
        str(nprocs),
        "--oversubscribe",
        "--bind-to",
        "none",
    ]
    if tag_output:
        cmd.append("--tag-output")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    # Shared-memory transport only: the ranks of a test or benchmark are on one host, and the
    # containers we run in often forbid the cross-memory-attach syscalls vader tries first.
    cmd += ["--mca", "btl", "self,vader", "--mca", "btl_vader_single_copy_mechanism", "none"]
    for name, value in {**NO_MULTICAST_ENV, **(env or {})}.items():
        cmd += ["-x", f"{name}={value}"]
    return cmd + list(argv)


def format_command(cmd: Sequence[str]) -> str:
    """Shell-quoted command line, for logs and error messages."""
    return " ".join(shlex.quote(c) for c in cmd)

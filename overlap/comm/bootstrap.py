"""Bootstrap: the injected byte-exchange that every collective rendezvous runs on.

NOTE [injected bootstrap]: the C++ runtime never talks to MPI or torch.distributed. It exports
bytes (buffer handles, sizes, host ids), a :class:`Bootstrap` exchanges them among the ranks of
a group, and the runtime imports what it received. Two adapters are provided:

* :class:`MPIBootstrap` over an mpi4py communicator;
* :class:`TorchBootstrap` over a ``torch.distributed`` ProcessGroup (gloo or nccl).

A TP group may be any subgroup of the world (:func:`tp_subgroup` builds the Megatron layout of
contiguous blocks); the world may hold several TP groups.

Every method documented as *collective* must be called by all ranks of the group, in the same
order.
"""

from __future__ import annotations

import abc
import os
import socket
from typing import Any

from overlap.errors import BootstrapError, ConfigError

__all__ = ["Bootstrap", "MPIBootstrap", "TorchBootstrap", "check_single_host", "tp_subgroup"]


class Bootstrap(abc.ABC):
    """Collective byte exchange among the ranks of one group.

    Attributes:
        rank: this process's rank in the group, 0 <= rank < size.
        size: number of ranks in the group.
    """

    rank: int
    size: int

    @abc.abstractmethod
    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Collective: return every rank's ``data``, indexed by group rank (sizes may differ)."""

    @abc.abstractmethod
    def split(self, color: int, key: int) -> Bootstrap:
        """Collective: sub-groups of the ranks sharing ``color``, ordered by ``key`` then rank."""

    def barrier(self) -> None:
        """Collective: return once every rank of the group has entered."""
        self.allgather_bytes(b"")

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """Collective: ``root``'s ``data`` on every rank (other ranks pass ``None``)."""
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ConfigError(f"broadcast root {root} outside group of size {self.size}")
        if self.rank == root and data is None:
            raise ConfigError("broadcast_bytes: the root must pass bytes, not None")
        return self.allgather_bytes(data if self.rank == root else b"")[root]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def _split_members(pairs: list[tuple[int, int]], color: int) -> list[int]:
    """Parent ranks with ``color``, ordered by (key, parent rank)."""
    return [r for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)]


class MPIBootstrap(Bootstrap):
    """Bootstrap over an mpi4py communicator (default ``MPI.COMM_WORLD``)."""

    def __init__(self, comm: Any = None) -> None:
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        if not (hasattr(comm, "Get_rank") and hasattr(comm, "allgather")):
            raise ConfigError(
                f"MPIBootstrap needs an mpi4py communicator, got {type(comm).__name__}"
            )
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [bytes(d) for d in self.comm.allgather(bytes(data))]

    def barrier(self) -> None:
        self.comm.Barrier()

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ConfigError(f"broadcast root {root!r} outside group of size {self.size}")
        if self.rank == root and data is None:
            raise ConfigError("broadcast_bytes: the root must pass bytes, not None")
        return bytes(self.comm.bcast(data, root=root))

    def split(self, color: int, key: int) -> MPIBootstrap:
        return MPIBootstrap(self.comm.Split(color, key))


class TorchBootstrap(Bootstrap):
    """Bootstrap over a ``torch.distributed`` ProcessGroup (default: the world group).

    With the nccl backend the current CUDA device must be set (``torch.cuda.set_device``).
    """

    def __init__(self, group: Any = None, *, order: list[int] | None = None) -> None:
        """Wrap ``group`` (default: the world group).

        Args:
            group: a ProcessGroup this process belongs to.
            order: ``order[i]`` is the ProcessGroup rank that has bootstrap rank ``i``
                (default: identity). ProcessGroups always number their members by global rank;
                this lets :meth:`split` honour the ``key`` order as MPI does.
        """
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ConfigError(
                "TorchBootstrap needs torch.distributed to be initialised first "
                "(overlap.launch.init_torch_distributed does it under mpirun or torchrun)"
            )
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise ConfigError(
                f"TorchBootstrap needs a torch.distributed ProcessGroup, got {type(group).__name__}"
            )
        self._dist = dist
        self.group = group if group is not None else dist.group.WORLD
        group_rank = dist.get_rank(self.group)
        if group_rank < 0:
            raise ConfigError("TorchBootstrap: this process is not a member of the given group")
        self.size = dist.get_world_size(self.group)
        try:
            self._order = list(range(self.size)) if order is None else list(order)
            valid = sorted(self._order) == list(range(self.size))
        except TypeError:
            valid = False
        if not valid:
            raise ConfigError(f"order {order!r:.60} is not a permutation of range({self.size})")
        self.rank = self._order.index(group_rank)

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, bytes(data), group=self.group)
        return [bytes(out[g]) for g in self._order]

    def split(self, color: int, key: int) -> TorchBootstrap:
        import pickle

        pairs = [pickle.loads(b) for b in self.allgather_bytes(pickle.dumps((color, key)))]
        members = _split_members(pairs, color)
        global_ranks = [self._dist.get_global_rank(self.group, self._order[m]) for m in members]
        # Only the members create (and synchronise on) their group, so groups of other colours
        # and ranks outside the parent group never have to take part.
        sub = self._dist.new_group(
            ranks=global_ranks,
            backend=self._dist.get_backend(self.group),
            use_local_synchronization=True,
        )
        by_global = sorted(global_ranks)  # the new ProcessGroup's own numbering
        return TorchBootstrap(sub, order=[by_global.index(g) for g in global_ranks])


def tp_subgroup(world: Bootstrap, tp_size: int) -> Bootstrap:
    """Collective: this rank's TP group when ``world`` is cut into contiguous blocks.

    Ranks ``[g * tp_size, (g + 1) * tp_size)`` form TP group ``g`` (the Megatron layout).

    Raises:
        ConfigError: ``tp_size`` is not positive or does not divide the world size. Raised on
            every rank before any communication, so no rank is left waiting.
    """
    if not isinstance(world, Bootstrap):
        raise ConfigError(f"tp_subgroup needs a Bootstrap, got {type(world).__name__}")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int):
        raise ConfigError(f"TP size must be an int, got {tp_size!r:.40}")
    if tp_size < 1 or world.size % tp_size != 0:
        raise ConfigError(
            f"TP size {tp_size} must be a positive divisor of the world size {world.size}; "
            f"valid TP sizes: {[d for d in range(1, world.size + 1) if world.size % d == 0]}"
        )
    return world.split(color=world.rank // tp_size, key=world.rank)


def host_id() -> str:
    """Identifies this machine (hostname plus kernel boot id): equal ids share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    return f"{socket.gethostname()}/{boot}"


def check_single_host(group: Bootstrap, what: str = "this group") -> None:
    """Collective: raise on every rank unless all ranks of ``group`` share one host.

    Userbuffers are mapped between the processes of one NVLink domain, so a group spread over
    hosts cannot work; this catches it at set-up time with a message listing the hosts.

    Raises:
        BootstrapError: the ranks are on more than one host.
        ConfigError: ``group`` is not a :class:`Bootstrap`.
    """
    if not isinstance(group, Bootstrap):
        raise ConfigError(f"check_single_host needs a Bootstrap, got {type(group).__name__}")
    ids = [b.decode() for b in group.allgather_bytes(host_id().encode())]
    if len(set(ids)) > 1:
        by_host: dict[str, list[int]] = {}
        for r, h in enumerate(ids):
            by_host.setdefault(h.split("/")[0], []).append(r)
        raise BootstrapError(
            f"all ranks of {what} must be on one host (they share GPU memory), but they span "
            f"{len(set(ids))} hosts: {by_host}. Choose a TP size of at most the GPUs per node "
            f"(pid {os.getpid()}, rank {group.rank} of {group.size})"
        )

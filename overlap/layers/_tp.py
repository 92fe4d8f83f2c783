"""The tensor-parallel group of a layer: userbuffers ops where enabled, plain collectives else.

A :class:`TensorParallelGroup` pairs a ``torch.distributed`` ProcessGroup (the TP group) with
an optional :class:`~overlap.ub.Userbuffers` handle of the same ranks. The layers' overlap ops
come from the handle; everything else (the no-overlap path, a switched-off overlap, the
all-reduce of replicated parameters' gradients, the FP8 amax reductions) runs as plain
``torch.distributed`` collectives on the ProcessGroup: NCCL on GPUs, gloo on CPUs.

NOTE [group ids]: the custom ops of :mod:`overlap.layers._ops` take a group as an ``int``
(``torch.library`` schemas carry no Python objects); :attr:`TensorParallelGroup.id` keys a
registry of live groups, which holds them weakly: the layers hold their group, and an autograd
node holds the group of its forward until its backward has run (a layer may be freed before
the backward of its last forward). A group is shared, never copied: ``copy.deepcopy`` of a
layer keeps the same group (and userbuffers), as it keeps the same ProcessGroup.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

from overlap.errors import ConfigError, InvalidArgumentError, StateError
from overlap.quantization import ProcessGroupAmaxReducer

if TYPE_CHECKING:
    import torch

    from overlap.ub import Userbuffers

__all__ = ["TensorParallelGroup", "lookup_group"]

_REGISTRY: weakref.WeakValueDictionary[int, TensorParallelGroup] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


def _torch_group_of(ub: Userbuffers) -> Any:
    """The ProcessGroup behind a handle built from one (its TorchBootstrap), else None."""
    return getattr(ub.comm.group, "group", None)


class TensorParallelGroup:
    """The TP group a layer communicates over.

    Args:
        group: the TP ProcessGroup (default: the group ``ub`` was built from when it was built
            from a ProcessGroup, else the world group). Every rank of it holds one shard.
        ub: optional userbuffers of the same ranks, in the same order (from
            :func:`overlap.initialize_ub`); None runs every collective on ``group``.

    Raises:
        ConfigError: ``torch.distributed`` is not initialised, or ``ub`` spans other ranks
            than ``group`` (or numbers them differently).
        StateError: ``ub`` was destroyed.
    """

    def __init__(self, group: Any = None, ub: Userbuffers | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "tensor-parallel layers need torch.distributed to be initialised (the TP group "
                "is a ProcessGroup): call overlap.launch.init_torch_distributed() under mpirun, "
                "or torch.distributed.init_process_group() under torchrun"
            )
        if ub is not None and ub.destroyed:
            raise StateError("the userbuffers handle given to the layer was destroyed")
        if group is None and ub is not None:
            group = _torch_group_of(ub)
        self.group = group if group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.backend = str(dist.get_backend(self.group))
        if ub is not None and (ub.tp != self.size or ub.comm.group.rank != self.rank):
            raise ConfigError(
                f"the userbuffers handle spans {ub.tp} ranks with this one as rank "
                f"{ub.comm.group.rank}, but the layer's TP group has {self.size} ranks with "
                f"this one as rank {self.rank}: build both from the same group "
                "(initialize_ub(shape, tp_group=group))"
            )
        self.ub = ub
        self.id = next(_IDS)
        _REGISTRY[self.id] = self

    # A group is a shared resource (NOTE [group ids]).
    def __deepcopy__(self, memo: dict[int, Any]) -> TensorParallelGroup:
        return self

    def __copy__(self) -> TensorParallelGroup:
        return self

    def __reduce__(self) -> Any:
        raise TypeError(
            "a TensorParallelGroup (a ProcessGroup and userbuffers) cannot be pickled; save "
            "the layer's state_dict() instead"
        )

    def __repr__(self) -> str:
        ub = "none" if self.ub is None else f"tp={self.ub.tp}"
        return f"TensorParallelGroup(rank={self.rank}, size={self.size}, ub={ub})"

    @property
    def amax_group(self) -> ProcessGroupAmaxReducer:
        """The FP8 amax reduction over this group (docs/design.md §3, invariant 3)."""
        return ProcessGroupAmaxReducer(self.group)

    def userbuffers(self, what: str) -> Userbuffers:
        """The handle, or a StateError naming ``what`` needed it."""
        if self.ub is None:
            raise ConfigError(f"{what} needs userbuffers, but the layer has ub=None")
        if self.ub.destroyed:
            raise StateError(f"{what}: the layer's userbuffers handle was destroyed")
        return self.ub

    # ---- plain collectives (the no-overlap path) ------------------------------------------

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``[m, ...]`` of every rank as ``[size * m, ...]`` (rank order), a new tensor. FP8
        travels as its bytes."""
        import torch
        import torch.distributed as dist

        x = x.contiguous()
        out = torch.empty((self.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        if self.size == 1:
            return out.copy_(x)
        src, dst = _as_wire(x), _as_wire(out)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(dst, src, group=self.group)
        return out

    def reduce_scatter_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows ``[m, ...]`` of the sum over ranks of ``x`` ``[size * m, ...]``."""
        import torch.distributed as dist

        if x.shape[0] % self.size:
            raise InvalidArgumentError(
                f"reduce-scatter of {x.shape[0]} rows over {self.size} ranks: the rows (tokens) "
                "must be a multiple of the TP size"
            )
        x = x.contiguous()
        m = x.shape[0] // self.size
        if self.size == 1:
            return x.clone()
        out = x.new_empty((m, *x.shape[1:]))
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, x, op=dist.ReduceOp.SUM, group=self.group)
        return out

    def all_reduce_max(self, values: list[float], device: torch.device) -> list[float]:
        """The element-wise maximum over ranks of ``values`` (a tensor on ``device`` for the
        group's backend; NOTE [shape plans])."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=device)
        if self.size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [float(v) for v in t.tolist()]

    def device_barrier(self, device: torch.device) -> None:
        """Queues a one-element all-reduce over the group on ``device``'s current stream and
        returns without waiting for it: work queued after it on that stream starts once every
        rank's GPU has reached it (NOTE [shape plans]). Nothing on a group of one."""
        import torch
        import torch.distributed as dist

        if self.size > 1:
            dist.all_reduce(torch.zeros(1, device=device), group=self.group)

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``x``, a new tensor."""
        import torch.distributed as dist

        out = x.contiguous().clone()
        if self.size > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out


def _as_wire(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensors travel as bytes (not every backend knows the FP8 dtypes)."""
    import torch

    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8)
    return t


def lookup_group(group_id: int) -> TensorParallelGroup:
    """The live group of ``group_id`` (NOTE [group ids])."""
    group = _REGISTRY.get(int(group_id))
    if group is None:
        raise StateError(
            f"tensor-parallel group #{group_id} no longer exists (its layers were freed)"
        )
    return group

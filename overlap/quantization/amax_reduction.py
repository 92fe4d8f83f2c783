"""The amax reduction group, given at the point of use (docs/design.md §3, invariant 3).

NOTE [amax group at the call]: with sequence parallelism and per-tensor scaling, every shard
of an activation must share one scale, so the amax is all-reduced (MAX) over the TP group
before the cast. The group is an argument of :meth:`Quantizer.quantize` (``amax_group=``),
never an attribute of a quantizer or a quantized tensor: quantizers stay plain, picklable and
deep-copyable, and one quantizer can serve layers of different groups without one forward
overwriting the group another backward needs (docs/design.md §3, invariant 3).

An amax group is any object with ``all_reduce_max(amax)`` (:class:`AmaxReducer`). Adapters:

* :class:`ProcessGroupAmaxReducer`: a ``torch.distributed`` ProcessGroup (``all_reduce`` MAX);
* :class:`BootstrapAmaxReducer`: an overlap :class:`~overlap.comm.Bootstrap` (through its
  byte all-gather; it synchronises the host, so prefer a ProcessGroup on GPUs);
* :class:`CallableAmaxReducer`: a plain function.

:func:`as_amax_reducer` picks the adapter for a raw group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from overlap.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

    from overlap.comm.bootstrap import Bootstrap

__all__ = [
    "AmaxReducer",
    "BootstrapAmaxReducer",
    "CallableAmaxReducer",
    "ProcessGroupAmaxReducer",
    "as_amax_reducer",
]


@runtime_checkable
class AmaxReducer(Protocol):
    """All-reduces amax values (MAX) over the ranks that share a scale."""

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        """Collective: replace ``amax`` (float32, contiguous) in place by its elementwise
        maximum over the group. A NaN on any rank must make the result NaN (the scale then
        falls back to 1 on every rank)."""
        ...


class ProcessGroupAmaxReducer:
    """All-reduce MAX over a ``torch.distributed`` ProcessGroup (gloo for CPU tensors, nccl
    for CUDA ones), on the current stream as torch runs it."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)


class BootstrapAmaxReducer:
    """All-reduce MAX over an overlap :class:`~overlap.comm.Bootstrap` (a byte all-gather).

    The amax is copied to the host and back: it synchronises the device, meant for CPU tensors
    and tests.
    """

    def __init__(self, group: Bootstrap) -> None:
        self.group = group

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        import torch

        local = amax.detach().to("cpu", torch.float32).contiguous()
        gathered = self.group.allgather_bytes(local.numpy().tobytes())
        peers = [torch.frombuffer(bytearray(b), dtype=torch.float32) for b in gathered]
        if any(p.numel() != local.numel() for p in peers):
            raise InvalidArgumentError(
                f"BootstrapAmaxReducer: ranks reduce amax tensors of different sizes "
                f"{[p.numel() for p in peers]}"
            )
        result = peers[0]
        for p in peers[1:]:
            result = torch.maximum(result, p)  # propagates NaN
        amax.copy_(result.reshape(amax.shape))


class CallableAmaxReducer:
    """Wraps ``fn(amax)``, which either reduces ``amax`` in place (returning None or ``amax``)
    or returns the reduced tensor (copied into ``amax``)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        self.fn = fn

    def all_reduce_max(self, amax: torch.Tensor) -> None:
        out = self.fn(amax)
        if out is not None and out is not amax:
            amax.copy_(out.reshape(amax.shape))


def as_amax_reducer(group: Any) -> AmaxReducer:
    """``group`` as an :class:`AmaxReducer`: itself if it has ``all_reduce_max``, else the
    adapter for a torch ProcessGroup, an overlap Bootstrap or a callable.

    Raises:
        InvalidArgumentError: ``group`` is none of these.
    """
    # This runs per quantizer creation, i.e. per step of an FP8 layer: the adapters of this
    # module are recognised by their type first, since isinstance() against a
    # runtime-checkable Protocol walks the protocol's attributes on every call.
    # A ProcessGroup (what the layers pass) has no all_reduce_max, so testing for it first
    # answers as the Protocol test would.
    if type(group) in _ADAPTERS:
        return group
    try:
        import torch.distributed as dist

        if dist.is_available() and isinstance(group, dist.ProcessGroup):
            return ProcessGroupAmaxReducer(group)
    except ImportError:
        pass
    if isinstance(group, AmaxReducer):
        return group
    from overlap.comm.bootstrap import Bootstrap

    if isinstance(group, Bootstrap):
        return BootstrapAmaxReducer(group)
    if callable(group):
        return CallableAmaxReducer(group)
    raise InvalidArgumentError(
        f"amax_group must have an all_reduce_max(tensor) method (an AmaxReducer), or be a "
        f"torch.distributed ProcessGroup, an overlap Bootstrap or a callable; got "
        f"{type(group).__name__}"
    )


_ADAPTERS = (ProcessGroupAmaxReducer, BootstrapAmaxReducer, CallableAmaxReducer)

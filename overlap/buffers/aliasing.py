"""Saving for backward without aliasing a userbuffer (DESIGN.md invariant 2).

Symmetric buffers are shared by every layer and overwritten by the next op, so a tensor saved
for backward must never be a view into one (seed discussion 001: a layer quantized its
activation straight into the buffer and saved that view; the next layer's op overwrote it).

* :func:`aliases_buffer` says whether a tensor (or any tensor of a quantized tensor) lies in
  the memory of a live symmetric buffer that a buffer manager knows, found by address range
  (this rank's region and every mapped peer region);
* :func:`saveable` returns an object safe to save: itself when nothing aliases a buffer, else
  a copy of the aliasing tensors (``AliasPolicy.COPY``) or a :class:`StateError`
  (``AliasPolicy.REFUSE``); :func:`detach_from_buffer` is ``saveable`` with copying.

NOTE [buffer state registry]: the state of a buffer that managers share (generation counter,
staged shard, address ranges) is kept per :class:`~overlap.comm.SymmetricBuffer` in a weak
registry here, so that several managers over one buffer see each other's ops and the alias
check knows every buffer in use. Ops issued on the buffer directly, not through a manager,
are invisible to it (the runtime does not expose its op epoch to Python).
"""

from __future__ import annotations

import enum
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from overlap.errors import InvalidArgumentError, StateError
from overlap.quantization.tensor import QuantizedTensor

if TYPE_CHECKING:
    import torch

    from overlap.comm import SymmetricBuffer

__all__ = ["AliasPolicy", "aliases_buffer", "detach_from_buffer", "saveable"]


class AliasPolicy(enum.Enum):
    """What :func:`saveable` does with a tensor that aliases a userbuffer."""

    COPY = "copy"  #: copy the aliasing tensors (the rest is kept as is)
    REFUSE = "refuse"  #: raise StateError


class BufferState:
    """Shared state of one symmetric buffer (NOTE [buffer state registry]).

    Attributes:
        generation: bumped by every op on the buffer issued through a manager; a view made at
            generation ``g`` is valid while the generation is still ``g``.
        last_op: what made the latest generation (for error messages).
        staged: the manager-level record of what the buffer holds (see ``manager.py``).
    """

    def __init__(self, buffer: SymmetricBuffer) -> None:
        import torch

        self.name = buffer.name
        self.generation = 0
        self.last_op = "creation"
        self.staged: Any = None
        self._buffer = weakref.ref(buffer)
        # Address range of every rank's region as mapped in this process.
        self.ranges = []
        for peer in range(buffer.size):
            start = buffer.view(torch.uint8, (buffer.nbytes,), peer=peer).data_ptr()
            self.ranges.append((start, start + buffer.nbytes))

    @property
    def live(self) -> bool:
        buf = self._buffer()
        return buf is not None and not buf.destroyed

    def overlaps(self, t: torch.Tensor) -> bool:
        """True if ``t``'s elements lie (partly) in one of this buffer's regions."""
        lo, hi = _extent(t)
        return lo < hi and any(lo < end and start < hi for start, end in self.ranges)

    def bump(self, op: str) -> int:
        """Record an op that overwrites the buffer; returns the new generation."""
        self.generation += 1
        self.last_op = op
        return self.generation


_STATES: weakref.WeakKeyDictionary[SymmetricBuffer, BufferState] = weakref.WeakKeyDictionary()


def buffer_state(buffer: SymmetricBuffer) -> BufferState:
    """The shared state of ``buffer`` (created on first use)."""
    state = _STATES.get(buffer)
    if state is None:
        state = _STATES[buffer] = BufferState(buffer)
    return state


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, last byte + 1)`` spanned by ``t``'s elements."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    span = 1 + sum(
        (size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)
    )
    return (t.data_ptr(), t.data_ptr() + span * t.element_size())


def _aliased_buffer(t: torch.Tensor) -> str | None:
    """The name of the live buffer whose memory ``t`` overlaps, or None."""
    for state in list(_STATES.values()):
        if state.live and state.overlaps(t):
            return state.name
    return None


def _tensors_of(obj: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(obj, QuantizedTensor):
        return [t for t in obj.tensors() if t is not None]
    if isinstance(obj, torch.Tensor):
        return [obj]
    raise InvalidArgumentError(
        f"expected a torch.Tensor, a QuantizedTensor or a BufferView, got {type(obj).__name__}"
    )


def aliases_buffer(obj: torch.Tensor | QuantizedTensor | Any) -> bool:
    """True if ``obj`` (a tensor, a quantized tensor or a
    :class:`~overlap.buffers.BufferView`) shares memory with a live symmetric buffer known
    to a buffer manager. A view (live or stale) is always buffer memory."""
    from overlap.buffers.manager import BufferView

    if isinstance(obj, BufferView):
        return True
    return any(_aliased_buffer(t) is not None for t in _tensors_of(obj))


T = TypeVar("T")


def saveable(obj: T, *, policy: AliasPolicy = AliasPolicy.COPY) -> T:
    """``obj`` in a form that may be saved for backward: never a view into a userbuffer.

    Args:
        obj: a ``torch.Tensor``, a :class:`QuantizedTensor` or a
            :class:`~overlap.buffers.BufferView` (its value; it must not be stale). None is
            returned as is.
        policy: copy the tensors that alias a buffer (default) or refuse them.

    Returns:
        ``obj`` itself when nothing aliases a buffer; otherwise a new object of the same kind
        (a :class:`QuantizedTensor` for a view) whose aliasing tensors are copies (tensors
        shared by both directions stay shared; the others are kept, not copied).

    Raises:
        StateError: ``policy`` is REFUSE and ``obj`` aliases a buffer, or a stale view.
        InvalidArgumentError: ``obj`` is of another type.
    """
    from overlap.buffers.manager import BufferView

    if obj is None:
        return obj
    if isinstance(obj, BufferView):
        value = obj.value  # raises StateError if stale
        if policy is AliasPolicy.REFUSE:
            raise StateError(
                f"refusing to save a view of userbuffer {obj.buffer_name!r}: it is overwritten "
                "by the next op on that buffer (DESIGN.md invariant 2); save the local shard "
                "and re-gather in backward, or copy it"
            )
        return saveable(value, policy=AliasPolicy.COPY)  # type: ignore[return-value]
    tensors = _tensors_of(obj)
    names = {n for n in (_aliased_buffer(t) for t in tensors) if n is not None}
    if not names:
        return obj
    if policy is AliasPolicy.REFUSE:
        raise StateError(
            f"refusing to save a tensor that aliases userbuffer(s) {sorted(names)}: buffers are "
            "overwritten by the next op (DESIGN.md invariant 2); save the local shard and "
            "re-gather in backward, or copy it (AliasPolicy.COPY)"
        )
    import torch

    copies: dict[int, torch.Tensor] = {}

    def fix(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or _aliased_buffer(t) is None:
            return t
        return copies.setdefault(id(t), t.clone(memory_format=torch.contiguous_format))

    if isinstance(obj, QuantizedTensor):
        return QuantizedTensor.from_tensors([fix(t) for t in obj.tensors()], obj.meta)  # type: ignore[return-value]
    return fix(obj)  # type: ignore[return-value,arg-type]


def detach_from_buffer(obj: T) -> T:
    """``saveable(obj, policy=AliasPolicy.COPY)``: a copy of whatever aliases a userbuffer."""
    return saveable(obj, policy=AliasPolicy.COPY)

"""Saving for backward without aliasing a userbuffer (docs/design.md §3, invariant 2).

Symmetric buffers are shared by every layer and overwritten by the next op, so a tensor saved
for backward must never be a view into one (a bug seen in a peer library: a layer quantized its
activation straight into the buffer and saved that view; the next layer's op overwrote it).

* :func:`aliases_buffer` says whether a tensor (or any tensor of a quantized tensor) lies in
  the memory of a live symmetric buffer that a buffer manager knows, found by address range
  (this rank's region and every mapped peer region);
* :func:`saveable` returns an object safe to save: itself when nothing aliases a buffer, else
  a copy of the aliasing tensors (``AliasPolicy.COPY``) or a :class:`StateError`
  (``AliasPolicy.REFUSE``); :func:`detach_from_buffer` is ``saveable`` with copying.

NOTE [buffer state registry]: what buffer managers share about a buffer (the staged shard,
the last manager op for messages) is kept per :class:`~overlap.comm.SymmetricBuffer` in a
weak registry here, so that several managers over one buffer see each other's staging. The
generation and the address ranges are the buffer's own (NOTE [buffer generation] in
:mod:`overlap.comm.communicator`): views go stale on ANY op of the buffer, by a manager or
an overlap op, and the alias check knows every live buffer of the process.
"""

from __future__ import annotations

import abc
import enum
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from overlap.comm.communicator import buffer_of
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
    """A buffer manager's record of one symmetric buffer (NOTE [buffer state registry]).

    Attributes:
        last_op: what made the latest generation, as far as managers know (messages).
        staged: the manager-level record of what the buffer holds (see ``manager.py``).
    """

    def __init__(self, buffer: SymmetricBuffer) -> None:
        self.name = buffer.name
        self.last_op = "creation"
        self.staged: Any = None
        self._buffer = weakref.ref(buffer)

    @property
    def generation(self) -> int:
        """The buffer's generation (NOTE [buffer generation] in overlap.comm.communicator):
        every op on it, by any object, and every local write changes it; -1 once the buffer
        is gone."""
        buf = self._buffer()
        return -1 if buf is None else buf.generation

    @property
    def live(self) -> bool:
        buf = self._buffer()
        return buf is not None and not buf.destroyed

    def overlaps(self, t: torch.Tensor) -> bool:
        """True if ``t``'s elements lie (partly) in one of this buffer's regions."""
        buf = self._buffer()
        return buf is not None and not buf.destroyed and buf.overlaps(t)

    def bump(self, op: str, *, local: bool = True) -> int:
        """Record ``op``, a local write into the buffer (``local``) or an op that already ran
        (its epoch moved the generation); returns the generation after it."""
        buf = self._buffer()
        if local and buf is not None:
            buf.note_local_write()
        self.last_op = op
        return self.generation


_STATES: weakref.WeakKeyDictionary[SymmetricBuffer, BufferState] = weakref.WeakKeyDictionary()


def buffer_state(buffer: SymmetricBuffer) -> BufferState:
    """The managers' shared record of ``buffer`` (created on first use)."""
    state = _STATES.get(buffer)
    if state is None:
        state = _STATES[buffer] = BufferState(buffer)
    return state


def _aliased_buffer(t: torch.Tensor) -> str | None:
    """The name of the live symmetric buffer whose memory ``t`` overlaps, or None: every
    buffer of the process, whoever made it (NOTE [buffer generation])."""
    buf = buffer_of(t)
    return None if buf is None else buf.name


class BufferValue(abc.ABC):
    """A tensor read out of a buffer, valid until the buffer's next op (the base of
    :class:`~overlap.buffers.BufferView`; defined here so that the alias guard knows it
    without importing the managers)."""

    @property
    @abc.abstractmethod
    def value(self) -> Any:
        """The tensor (raises StateError when stale)."""

    @property
    @abc.abstractmethod
    def buffer_name(self) -> str:
        """The name of its buffer."""


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
    if isinstance(obj, BufferValue):
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
    if obj is None:
        return obj
    if isinstance(obj, BufferValue):
        value = obj.value  # raises StateError if stale
        if policy is AliasPolicy.REFUSE:
            raise StateError(
                f"refusing to save a view of userbuffer {obj.buffer_name!r}: it is overwritten "
                "by the next op on that buffer (docs/design.md §3, invariant 2); save the local "
                "shard and re-gather in backward, or copy it"
            )
        return saveable(value, policy=AliasPolicy.COPY)  # type: ignore[return-value]
    tensors = _tensors_of(obj)
    names = {n for n in (_aliased_buffer(t) for t in tensors) if n is not None}
    if not names:
        return obj
    if policy is AliasPolicy.REFUSE:
        raise StateError(
            f"refusing to save a tensor that aliases userbuffer(s) {sorted(names)}: buffers are "
            "overwritten by the next op (docs/design.md §3, invariant 2); save the local shard and "
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

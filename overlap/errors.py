"""Typed exceptions raised by overlap.

Every error overlap raises derives from :class:`OverlapError`. Errors from the C++ core are
translated into these classes by the extension module (see ``csrc/bindings/errors.cpp``): the
core's ``ErrorKind`` picks the class, and the message carries ``file:line``, the failed check
and the values involved.

Where a standard exception fits, the class also derives from it, so ``except ValueError`` and
``except TimeoutError`` keep working for callers that do not know about overlap.
"""

from __future__ import annotations

__all__ = [
    "BootstrapError",
    "CommAbortedError",
    "CommTimeoutError",
    "ConfigError",
    "CudaError",
    "InvalidArgumentError",
    "OverlapError",
    "StaleBufferError",
    "StateError",
    "SystemResourceError",
    "UnsupportedHardwareError",
]


class OverlapError(RuntimeError):
    """Base class of every error raised by overlap (also: an internal bug in overlap)."""


class ConfigError(OverlapError, ValueError):
    """A configuration is invalid: options, group layout, environment variables."""


class InvalidArgumentError(OverlapError, ValueError):
    """A call received a bad tensor, shape, dtype, device, pointer or size."""


class StateError(OverlapError):
    """An object was used in the wrong lifecycle state (before rendezvous, after destroy...)."""


class StaleBufferError(StateError):
    """A view of a symmetric buffer (a gathered input, a buffer manager's view) was read after
    another op or write on the buffer (or on another window of its memory) may have overwritten
    it (NOTE [buffer generation] in :mod:`overlap.comm.communicator`): copy a view before the
    buffer's next op, or save the local shard and re-gather."""


class CommTimeoutError(OverlapError, TimeoutError):
    """A communication wait passed its deadline. The message names op, rank, peer and step."""


class CommAbortedError(OverlapError):
    """A communication wait was cut short on this rank: its communicator was aborted
    (:meth:`overlap.comm.Communicator.abort`) or a signal interrupted the wait. The
    communicator is failed from then on (create a new one)."""


class UnsupportedHardwareError(OverlapError):
    """The GPU, driver or this build of overlap cannot do what was asked."""


class CudaError(OverlapError):
    """A CUDA runtime, driver or cuBLAS call failed."""


class BootstrapError(OverlapError):
    """Ranks disagreed or failed during a collective rendezvous."""


class SystemResourceError(OverlapError, OSError):
    """An operating-system call failed (shared memory, file descriptors, mmap...)."""

"""Deadlines and clean-up for the collective set-up of communicators and buffers.

NOTE [set-up deadlines]: the bootstrap's collectives (mpi4py, ``torch.distributed``) have no
deadline of their own: a peer that died, hung or never called ``create_buffer`` left its peers
blocked in the rendezvous for good, and a peer killed while it held a shared-memory name left
that name in ``/dev/shm``. So every exchange of ``Communicator()`` and
``Communicator.create_buffer()`` runs on a helper thread, and the caller waits for it until the
call's deadline (the communicator's ``timeout_s``, counted from the start of the call):

* past the deadline the call raises :class:`~overlap.errors.CommTimeoutError` naming the step;
  a bootstrap that raised instead (gloo: a peer's connection closed) raises
  :class:`~overlap.errors.BootstrapError` with the bootstrap's message;
* the helper stays blocked in the bootstrap's collective, so the group is out of step with its
  peers from then on: the communicator is failed (NOTE [failed transport] in
  ``csrc/comm/transport.h``, which also makes its peers fail through their flags), and the job
  has to be torn down or regrouped;
* whatever the failure, every live rank removes every rank's shared-memory name of the buffer
  being created (the names are known to all ranks in advance, NOTE [shm names] in
  ``communicator.py``), so a rank that died holding one leaves nothing behind.

Covered: a peer that dies, hangs or never arrives at any exchange of ``Communicator()`` or
``create_buffer()``, hence of ``initialize_ub()``, which communicates through nothing else.
Not covered: an MPI bootstrap whose MPI library gives less than ``MPI_THREAD_MULTIPLE`` (its
exchanges run on the caller's thread, without a deadline: another thread may not call MPI
while the abandoned one is still inside it), and a peer lost after the rendezvous, which the
ops' own deadlines cover (invariant 7). Verdict: a helper thread per exchange, a failed
communicator after a set-up timeout, every rank's names removed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from overlap.comm.bootstrap import Bootstrap, MPIBootstrap
from overlap.errors import BootstrapError, CommTimeoutError, OverlapError

T = TypeVar("T")


class Deadline:
    """The end of one set-up call: ``seconds`` from now; ``what`` names the call."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds = seconds
        self.what = what
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())


def _threads_allowed(group: Bootstrap) -> bool:
    """Whether the group's exchanges may run on a helper thread (NOTE [set-up deadlines])."""
    if isinstance(group, MPIBootstrap):
        from mpi4py import MPI

        return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    return True


def _current_cuda_device() -> int | None:
    """The caller's CUDA device where torch has set one up (a helper thread starts on device 0,
    and the nccl backend exchanges on the current device)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_device())


_SETTLE_S = 0.05
_settling = threading.Lock()
_settle_registered: list[bool] = []  # one entry once the exit handler is registered


def _settle_at_exit() -> None:
    """NOTE [settle at exit]: since the set-up exchanges run on helper threads, a two-rank job
    on the host transport that ends with ``dist.destroy_process_group()`` died at exit with
    ``std::terminate`` in about a third of the runs: one of gloo's worker threads releases a
    last reference to a Python object after the interpreter has begun to finalize, and a
    thread that asks for the GIL then is ended mid-unwind. Which object gloo releases late is
    not known; a sleep between the destroy and the exit made every run pass. So an exit
    handler gives those threads the GIL for a moment before finalization. Verdict: 50 ms at
    exit, registered once, only after a set-up exchange ran on a helper thread."""
    with _settling:
        if _settle_registered:
            return
        import atexit

        atexit.register(time.sleep, _SETTLE_S)
        _settle_registered.append(True)


def run_collective(
    fn: Callable[[], T],
    group: Bootstrap,
    deadline: Deadline,
    step: str,
    on_failure: Callable[[str, str], None] | None = None,
) -> T:
    """``fn()`` (one collective of ``group``) with the deadline of NOTE [set-up deadlines].

    Args:
        fn: the collective call.
        group: the group it runs on (its rank names this rank in messages).
        deadline: the call's deadline.
        step: what ``fn`` is, for messages ("the exchange of buffer handles").
        on_failure: called with ``(kind, message)`` (kind ``"timeout"`` or ``"bootstrap"``)
            before the error is raised, when the group is left out of step: the communicator
            fails itself there.

    Raises:
        CommTimeoutError: the deadline passed before every rank took part.
        BootstrapError: the bootstrap raised (an :class:`~overlap.errors.OverlapError` it
            raised is passed on as it is).
    """
    if not _threads_allowed(group):
        return fn()
    _settle_at_exit()
    box: dict[str, Any] = {}
    done = threading.Event()
    device = _current_cuda_device()

    def target() -> None:
        try:
            if device is not None:
                sys.modules["torch"].cuda.set_device(device)
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="overlap-setup", daemon=True).start()
    try:
        finished = done.wait(deadline.remaining())
    except BaseException:  # Ctrl-C: the helper stays inside the collective
        if on_failure is not None:
            on_failure("bootstrap", f"{deadline.what}: interrupted during {step}")
        raise
    if not finished:
        message = (
            f"{deadline.what}: rank {group.rank} of {group.size} waited {deadline.seconds:g} s "
            f"for its peers at {step}: a peer died, hangs or is not calling the same set-up "
            "(the group is out of step from here on: tear the job down or regroup)"
        )
        if on_failure is not None:
            on_failure("timeout", message)
        raise CommTimeoutError(message)
    error = box.get("error")
    if error is None:
        return box["value"]  # type: ignore[no-any-return]
    if isinstance(error, OverlapError):
        raise error
    message = (
        f"{deadline.what}: the bootstrap failed on rank {group.rank} of {group.size} at {step} "
        f"({type(error).__name__}: {error}); a peer may have died"
    )
    if on_failure is not None:
        on_failure("bootstrap", message)
    raise BootstrapError(message) from error


class DeadlineGroup(Bootstrap):
    """``group`` whose exchanges keep ``deadline`` (NOTE [set-up deadlines]); for the
    set-up's helpers that take a :class:`~overlap.comm.Bootstrap`."""

    def __init__(self, group: Bootstrap, deadline: Deadline, step: str) -> None:
        self._group = group
        self._deadline = deadline
        self._step = step
        self.rank = group.rank
        self.size = group.size

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return run_collective(
            lambda: self._group.allgather_bytes(data), self._group, self._deadline, self._step
        )

    def split(self, color: int, key: int) -> Bootstrap:
        raise NotImplementedError("a set-up group is not split")

"""Issue 32: aborting a communicator, Ctrl-C during a wait, and destroy() while another thread
is inside an op (NOTE [abort], NOTE [interrupting waits] in csrc/comm/fault.h; NOTE [destroy
while in use] in csrc/comm/symmetric_buffer.h). Two ranks run as threads of one process on the
host transport (tests/unit/local_group.py); the cases that crashed the process, or that send
it signals, run in a child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from overlap.comm import Communicator, SymmetricBuffer
from overlap.errors import CommAbortedError, CommTimeoutError
from tests.unit.local_group import on_every_rank

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 0.1  # the bound: every wait ends within 100 ms of an abort or a Ctrl-C


def _pair(timeout_s: float = 30.0) -> list[tuple[Communicator, SymmetricBuffer]]:
    def make(group: object) -> tuple[Communicator, SymmetricBuffer]:
        comm = Communicator(group, "host", timeout_s=timeout_s)  # type: ignore[arg-type]
        return comm, comm.create_buffer(4096)

    return on_every_rank(2, make)


class _Blocked:
    """Runs ``buf.all_gather`` on a thread of its own, whose peer never comes."""

    def __init__(self, buf: SymmetricBuffer) -> None:
        self.error: BaseException | None = None
        self.ended = 0.0
        self.thread = threading.Thread(target=self._run, args=(buf,), daemon=True)
        self.thread.start()
        time.sleep(0.3)  # inside the wait by now
        assert self.thread.is_alive(), self.error

    def _run(self, buf: SymmetricBuffer) -> None:
        try:
            buf.all_gather(torch.ones(4))
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()


def test_abort_ends_a_blocked_wait_at_once_and_fails_the_peer() -> None:
    (c0, b0), (c1, b1) = _pair()
    blocked = _Blocked(b0)
    t0 = time.monotonic()
    c0.abort()
    blocked.thread.join(5.0)
    assert isinstance(blocked.error, CommAbortedError), repr(blocked.error)
    assert blocked.ended - t0 < BOUND_S, f"the wait ended {blocked.ended - t0:.3f} s after abort"
    assert "all_gather: rank 0 stopped waiting for peer 1" in str(blocked.error)
    assert c0.failed and "aborted" in (c0.failure or "")
    # The aborted communicator refuses everything at once, typed.
    with pytest.raises(CommAbortedError, match="failed earlier"):
        b0.barrier()
    c0.abort()  # idempotent
    # The peer fails through its flags (NOTE [poisoned flags]), long before its 30 s deadline.
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match="peer 0's communicator failed"):
        b1.all_gather(torch.ones(4))
    assert time.monotonic() - t0 < 5.0
    assert c1.failed
    c0.destroy()
    c1.destroy()


def test_an_idle_abort_fails_the_peers_next_op_at_once() -> None:
    (c0, _), (c1, b1) = _pair()
    c0.abort()
    assert c0.failed
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match="peer 0's communicator failed"):
        b1.barrier()
    assert time.monotonic() - t0 < 5.0
    c0.destroy()
    c1.destroy()


def test_abort_from_a_signal_handler_ends_the_wait_it_interrupted() -> None:
    """Signal-safe: a handler that runs while the main thread waits (NOTE [interrupting
    waits]) may abort; the wait then ends within the bound."""
    (c0, b0), (c1, _) = _pair()
    fired: list[float] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(time.monotonic())
        c0.abort()

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(CommAbortedError, match="stopped waiting for peer 1"):
            b0.all_gather(torch.ones(4))
        ended = time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert fired and ended - fired[0] < BOUND_S, (fired, ended)
    c0.destroy()
    c1.destroy()


def _child(script: str, timeout_s: float = 60.0) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


_PAIR = """
    import threading, time, torch
    from overlap.comm import Communicator
    from overlap.errors import CommAbortedError, CommTimeoutError, StateError
    from tests.unit.local_group import on_every_rank

    def make(group):
        comm = Communicator(group, "host", timeout_s=TIMEOUT)
        return comm, comm.create_buffer(4096)

    (c0, b0), (c1, b1) = on_every_rank(2, make)
"""


def test_ctrl_c_interrupts_a_wait_within_the_bound() -> None:
    """Ctrl-C was only delivered once the wait's deadline expired (19 s later with 20 s)."""
    script = (
        _PAIR.replace("TIMEOUT", "20.0")
        + """
    print("waiting", flush=True)
    try:
        b0.all_gather(torch.ones(4))
    except KeyboardInterrupt:
        print(f"interrupted at {time.monotonic()!r}", flush=True)
    assert c0.failed and "interrupted by a signal" in c0.failure, c0.failure
    try:
        b0.barrier()
    except CommAbortedError as exc:
        assert "failed earlier" in str(exc)
    else:
        raise AssertionError("the interrupted communicator still works")
    t0 = time.monotonic()
    try:
        b1.all_gather(torch.ones(4))
    except CommTimeoutError as exc:
        assert "peer 0's communicator failed" in str(exc), exc
    assert time.monotonic() - t0 < 5.0
    c0.destroy()
    c1.destroy()
    print("OK", flush=True)
    """
    )
    child = _child(script)
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "waiting", line + child.stdout.read()
    time.sleep(0.3)  # inside the wait
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    try:
        out, _ = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
    assert child.returncode == 0 and "OK" in out, out
    caught = float(out.split("interrupted at ")[1].split()[0])
    assert caught - sent < BOUND_S, f"Ctrl-C ended the wait {caught - sent:.3f} s after it came"


@pytest.mark.parametrize("what", ["buffer", "communicator"])
def test_destroy_while_another_thread_is_inside_an_op(what: str) -> None:
    """destroy() from another thread once freed the memory the op was reading: SIGSEGV. It
    now waits for the op (which an abort ends at once) and never frees memory in use; from
    inside the op, on the same thread (a signal handler), it is a StateError."""
    destroy = "b0.destroy()" if what == "buffer" else "c0.destroy()"
    script = (
        _PAIR.replace("TIMEOUT", "30.0")
        + f"""
    box = {{}}
    def op():
        try:
            b0.all_gather(torch.ones(4))
        except BaseException as exc:
            box["error"] = exc
    def destroy():
        {destroy}
        box["destroyed"] = time.monotonic()
    worker = threading.Thread(target=op)
    worker.start()
    time.sleep(0.3)
    destroyer = threading.Thread(target=destroy)
    destroyer.start()
    time.sleep(0.5)
    assert "destroyed" not in box, "destroy() returned while an op used the buffer"
    assert worker.is_alive()
    c0.abort()
    worker.join(5)
    destroyer.join(5)
    assert isinstance(box.get("error"), CommAbortedError), box
    assert "destroyed" in box and b0.destroyed
    try:
        b0.barrier()
    except (StateError, CommAbortedError):
        pass
    else:
        raise AssertionError("an op on a destroyed buffer ran")
    # From a signal handler inside the op, on the same thread: a typed error, no deadlock.
    (d0, e0), (d1, _) = on_every_rank(2, make)
    import signal
    seen = {{}}
    def handler(signum, frame):
        try:
            e0.destroy()
        except StateError as exc:
            seen["state"] = str(exc)
        d0.abort()
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        e0.all_gather(torch.ones(4))
    except CommAbortedError:
        pass
    assert "would wait for itself" in seen.get("state", ""), seen
    e0.destroy()
    for c in (c1, d0, d1):
        c.destroy()
    print("OK", flush=True)
    """
    )
    child = _child(script)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and "OK" in out, f"exit code {child.returncode}:\n{out}"

"""NOTE [settle at exit] (overlap/comm/_setup.py): the first set-up exchange that runs on a
helper thread registers one exit handler that gives gloo's worker threads the GIL before the
interpreter finalizes (without it, examples/mlp_block.py on the host transport ended with
std::terminate in about a third of the runs; tests/distributed/test_examples.py)."""

from __future__ import annotations

import time

import pytest

from overlap.comm import _setup
from overlap.comm.bootstrap import Bootstrap


class _Alone(Bootstrap):
    rank, size = 0, 1

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [data]

    def split(self, color: int, key: int) -> Bootstrap:
        return self


def test_one_exit_handler_after_the_first_threaded_exchange(monkeypatch) -> None:
    registered: list[tuple[object, tuple[object, ...]]] = []
    monkeypatch.setattr(_setup, "_settle_registered", [])
    monkeypatch.setattr("atexit.register", lambda fn, *args: registered.append((fn, args)))
    group = _Alone()
    for _ in range(3):
        got = _setup.run_collective(
            lambda: group.allgather_bytes(b"x"), group, _setup.Deadline(5.0, "test"), "a step"
        )
        assert got == [b"x"]
    assert registered == [(time.sleep, (_setup._SETTLE_S,))]
    assert 0 < _setup._SETTLE_S <= 0.1  # a moment, not a visible delay at exit


def test_an_exchange_on_the_callers_thread_registers_nothing(monkeypatch) -> None:
    monkeypatch.setattr(_setup, "_settle_registered", [])
    monkeypatch.setattr(_setup, "_threads_allowed", lambda group: False)
    monkeypatch.setattr("atexit.register", lambda *a: pytest.fail("registered an exit handler"))
    group = _Alone()
    assert _setup.run_collective(lambda: 7, group, _setup.Deadline(5.0, "t"), "s") == 7

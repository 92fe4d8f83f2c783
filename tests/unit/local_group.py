"""Several ranks of one group as threads of one process (host transport): each thread's
bootstrap exchanges bytes with the others in memory. Lets single-process tests block a rank
in a collective whose peer never comes, abort it, destroy it or interrupt it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from overlap.comm import Bootstrap

T = TypeVar("T")


class LocalGroup:
    """``size`` ranks whose bootstraps meet in memory; :meth:`member` gives rank ``r``'s."""

    def __init__(self, size: int, timeout_s: float = 30.0) -> None:
        self.size = size
        self._timeout_s = timeout_s
        self._barrier = threading.Barrier(size)
        self._slots: list[bytes] = [b""] * size

    def member(self, rank: int) -> Bootstrap:
        return _Member(self, rank)

    def allgather(self, rank: int, data: bytes) -> list[bytes]:
        self._slots[rank] = bytes(data)
        self._barrier.wait(self._timeout_s)
        out = list(self._slots)
        self._barrier.wait(self._timeout_s)  # nobody overwrites a slot before all have read
        return out


class _Member(Bootstrap):
    def __init__(self, group: LocalGroup, rank: int) -> None:
        self._group = group
        self.rank = rank
        self.size = group.size

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return self._group.allgather(self.rank, data)

    def split(self, color: int, key: int) -> Bootstrap:
        raise NotImplementedError


def on_every_rank(size: int, fn: Callable[[Bootstrap], T], timeout_s: float = 30.0) -> list[T]:
    """Runs ``fn(bootstrap)`` on ``size`` threads, one per rank of a new :class:`LocalGroup`
    (e.g. a collective constructor); returns the results by rank, raising the first error."""
    group = LocalGroup(size)
    results: list[object] = [None] * size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(group.member(rank))
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]

"""Issue 32, item 7: shared-memory names are unguessable (NOTE [shm names] in
overlap/comm/communicator.py) and a peer refuses a segment its rank did not create (NOTE
[segment cookies] in csrc/comm/transport.h). Names of this process's jobs only: the test plays
the other local user itself."""

from __future__ import annotations

import os
import re

import pytest
import torch

from overlap._native import native
from overlap.comm import Communicator
from overlap.errors import BootstrapError
from tests.unit.test_comm_fail_safe import OneRank


class Watching(OneRank):
    """A one-rank group that lists this job's segments in /dev/shm at every exchange: what
    another local user watching /dev/shm sees while a buffer is being created."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        self.seen += [e for e in os.listdir("/dev/shm") if e.startswith("overlap-")]
        return [data]


def _predictions(name: str) -> set[str]:
    """What a watcher would try for the next buffer's name: every number in the name, plus
    one."""
    out = set()
    for m in re.finditer(r"\d+", name):
        out.add(name[: m.start()] + str(int(m.group()) + 1) + name[m.end() :])
    return out


def test_the_next_buffer_name_cannot_be_taken_first() -> None:
    """A watcher used to compute the next name from the current one (a job token, the pid, the
    rank, a counter) and create it first: the job's next create_buffer then failed."""
    group = Watching()
    comm = Communicator(group, "host")
    first = comm.create_buffer(64)
    (seen,) = {e for e in group.seen if comm._tag in e}
    taken = []
    try:
        for guess in _predictions(seen):
            path = f"/dev/shm/{guess}"
            if not os.path.exists(path):
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666))
                taken.append(path)
        group.seen.clear()
        second = comm.create_buffer(64)  # not one of the names taken
        x = torch.arange(4, dtype=torch.float32)
        assert torch.equal(second.all_gather(x), x)
        (seen2,) = {e for e in group.seen if comm._tag in e} - {p[9:] for p in taken}
    finally:
        for path in taken:
            os.unlink(path)
    # "overlap-<job>-<secret>-<rank>": the job's tag is shared, the rest unrelated.
    job, secret, rank = seen.removeprefix("overlap-").split("-")
    job2, secret2, rank2 = seen2.removeprefix("overlap-").split("-")
    assert job == job2 == comm._tag and rank == rank2 == "0"
    assert len(secret) == len(secret2) == 24 and secret != secret2
    # Another communicator of the same group draws another tag.
    other = Communicator(OneRank(), "host")
    assert other._tag != comm._tag and len(other._tag) == 16
    first.destroy()
    comm.destroy()


def _pair(tag: str) -> tuple[object, object, bytes, bytes]:
    t = native().comm.make_host_transport()
    bufs = [
        native().comm.SymmetricBuffer(
            transport=t, rank=r, size=2, nbytes=256, tag=f"{tag}-{r}", timeout_s=5.0
        )
        for r in range(2)
    ]
    return bufs[0], bufs[1], bufs[0].local_handle(), bufs[1].local_handle()


def test_a_segment_the_rank_did_not_create_is_refused() -> None:
    """Another process that replaced a rank's segment (same name and size) was mapped by its
    peers as if it were the rank's: now its cookie differs from the one the rank sent through
    the bootstrap, and the peer refuses it."""
    tag = f"unit-{os.getpid()}-impostor"
    a, b, ha, hb = _pair(tag)
    path = f"/dev/shm/overlap-{tag}-0"
    size = os.path.getsize(path)
    os.unlink(path)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        with pytest.raises(BootstrapError, match="cookie differs"):
            b.connect([ha, hb])
    finally:
        os.close(fd)
        os.unlink(path)
        a.destroy()
        b.destroy()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a segment to another user")
def test_a_segment_of_another_user_is_refused() -> None:
    tag = f"unit-{os.getpid()}-owner"
    a, b, ha, hb = _pair(tag)
    os.chown(f"/dev/shm/overlap-{tag}-0", 12345, -1)
    try:
        with pytest.raises(BootstrapError, match="belongs to uid 12345"):
            b.connect([ha, hb])
    finally:
        a.destroy()
        b.destroy()

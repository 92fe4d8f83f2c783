"""Single-process checks of issue 32's bounds: sizes and timeouts that once overflowed are typed
errors (NOTE [size bounds] in csrc/comm/symmetric_buffer.h), and shared memory is reserved when
a buffer is created (NOTE [shm reservation] in csrc/comm/host/shm_region.cpp). The multi-rank
cases (failed communicators, mismatches) are in tests/distributed."""

from __future__ import annotations

import math
import os

import pytest

from overlap import env
from overlap._native import native
from overlap.comm import Communicator
from overlap.comm.bootstrap import Bootstrap
from overlap.errors import ConfigError, InvalidArgumentError, SystemResourceError

BAD_TIMEOUTS = [math.inf, 1e12, math.nan, -1.0, env.MAX_TIMEOUT_S * 2]


class OneRank(Bootstrap):
    """A group of one rank: every collective is local."""

    rank, size = 0, 1

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [data]

    def split(self, color: int, key: int) -> Bootstrap:
        return self


def test_python_bounds_mirror_the_core() -> None:
    assert native().comm.max_timeout_s == env.MAX_TIMEOUT_S
    assert native().comm.max_buffer_bytes == 2**48


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=str)
def test_timeouts_beyond_the_bound_are_config_errors(timeout: float) -> None:
    """An infinite or huge deadline once overflowed the steady clock: every wait then timed
    out after a millisecond ("timed out after inf s")."""
    with pytest.raises(ConfigError, match="timeout_s must be > 0 and <= 1e\\+06 s"):
        Communicator(OneRank(), "host", timeout_s=timeout)
    with pytest.raises(ConfigError, match="timeout must be > 0 and <= 1e\\+06 s"):
        native().comm.SymmetricBuffer(
            transport=native().comm.make_host_transport(),
            rank=0,
            size=1,
            nbytes=64,
            tag=f"unit-{os.getpid()}-timeout",
            timeout_s=timeout,
        )
    comm = Communicator(OneRank(), "host", timeout_s=env.MAX_TIMEOUT_S)
    buf = comm.create_buffer(64)
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        buf.timeout_s = timeout
    with pytest.raises(ConfigError, match="timeout must be > 0"):
        buf._core.timeout_s = timeout  # the core checks too
    assert buf.timeout_s == env.MAX_TIMEOUT_S
    comm.destroy()


@pytest.mark.parametrize("raw", ["inf", "1e12", "nan", "-inf"])
def test_overlap_timeout_s_must_be_finite_and_bounded(raw: str) -> None:
    with pytest.raises(ConfigError, match="must be > 0 and <= 1e\\+06") as info:
        env.settings({"OVERLAP_TIMEOUT_S": raw})
    assert "OVERLAP_TIMEOUT_S" in str(info.value)
    assert env.settings({"OVERLAP_TIMEOUT_S": "1e6"}).timeout_s == env.MAX_TIMEOUT_S


@pytest.mark.parametrize("nbytes", [2**64 - 1, 2**64, 2**48 + 1], ids=hex)
def test_create_buffer_refuses_sizes_beyond_the_bound(nbytes: int) -> None:
    """2**64 - 1 once wrapped the host segment's size around to 4095 bytes: the buffer was
    created and the next all_gather wrote far past it (a segfault)."""
    import torch

    comm = Communicator(OneRank(), "host")
    with pytest.raises(InvalidArgumentError, match="exceeds the largest symmetric buffer"):
        comm.create_buffer(nbytes)
    if nbytes < 2**64:
        with pytest.raises(InvalidArgumentError, match="must be in \\[1, 281474976710656\\]"):
            native().comm.SymmetricBuffer(
                transport=native().comm.make_host_transport(),
                rank=0,
                size=1,
                nbytes=nbytes,
                tag=f"unit-{os.getpid()}-size",
                timeout_s=1.0,
            )
    buf = comm.create_buffer(64)  # the communicator still works
    x = torch.arange(8, dtype=torch.float32)
    assert torch.equal(buf.all_gather(x), x)
    comm.destroy()


def test_a_buffer_larger_than_dev_shm_is_a_typed_error_at_creation() -> None:
    """The host transport reserves its segment: a tmpfs too small for it is a
    SystemResourceError from create_buffer, not a SIGBUS in the first large op."""
    st = os.statvfs("/dev/shm")
    total = st.f_blocks * st.f_frsize
    if total == 0:
        pytest.skip("/dev/shm has no size limit")
    comm = Communicator(OneRank(), "host")
    with pytest.raises(SystemResourceError, match=r"reserving .* bytes of shared memory"):
        comm.create_buffer(total + (1 << 20))
    assert not [e for e in os.listdir("/dev/shm") if comm._tag in e]
    assert not comm.failed and comm.failure is None  # nothing communicated: nothing failed
    comm.destroy()


def test_views_refuse_sizes_beyond_64_bits() -> None:
    import torch

    comm = Communicator(OneRank(), "host")
    buf = comm.create_buffer(64)
    with pytest.raises(InvalidArgumentError, match="outside the buffer"):
        buf.view(torch.uint8, (2**64,))
    with pytest.raises(InvalidArgumentError, match="outside the buffer"):
        buf.view(torch.uint8, (1,), offset=2**64 - 1)
    with pytest.raises(InvalidArgumentError, match="peer 1 is outside"):
        buf.view(torch.uint8, (1,), peer=1)
    comm.destroy()

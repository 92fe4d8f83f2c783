"""Single-process checks of the bootstrap layer (the multi-rank ones are in tests/distributed)."""

from __future__ import annotations

import pytest

from overlap.comm.bootstrap import Bootstrap, check_single_host, host_id, tp_subgroup
from overlap.errors import BootstrapError, ConfigError


class FakeGroup(Bootstrap):
    """A group whose other ranks are simulated: allgather returns canned peer values."""

    def __init__(self, rank: int, peers: list[bytes]) -> None:
        self.rank, self.size, self.peers = rank, len(peers), peers

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return [data if r == self.rank else p for r, p in enumerate(self.peers)]

    def split(self, color: int, key: int) -> Bootstrap:
        raise AssertionError("split must not be reached")


@pytest.mark.parametrize("tp", [0, -2, 3, 5], ids=lambda t: f"tp{t}")
def test_tp_size_must_divide_world(tp: int) -> None:
    with pytest.raises(ConfigError, match=r"valid TP sizes: \[1, 2, 4\]"):
        tp_subgroup(FakeGroup(0, [b""] * 4), tp)


def test_single_host_passes_and_multi_host_is_rejected() -> None:
    here = host_id().encode()
    check_single_host(FakeGroup(0, [here, here]))
    with pytest.raises(BootstrapError, match=r"span 2 hosts.*'elsewhere': \[1\]"):
        check_single_host(FakeGroup(0, [here, b"elsewhere/boot"]), "TP group 0")


def test_broadcast_root_validation() -> None:
    g = FakeGroup(0, [b"", b""])
    with pytest.raises(ConfigError, match="outside group"):
        g.broadcast_bytes(b"x", root=2)
    with pytest.raises(ConfigError, match="must pass bytes"):
        g.broadcast_bytes(None, root=0)
    assert g.broadcast_bytes(b"abc", root=0) == b"abc"


class SilentGroup(FakeGroup):
    """A group that must never be asked anything: construction has to fail before any
    collective call."""

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        raise AssertionError("a collective was reached before the configuration was validated")


def test_communicator_rejects_bad_configuration_before_any_collective() -> None:
    from overlap import cuda_available
    from overlap.comm import Communicator
    from overlap.errors import UnsupportedHardwareError

    group = SilentGroup(0, [b"", b""])
    with pytest.raises(ConfigError, match="unknown transport 'nvlink'"):
        Communicator(group, "nvlink")
    with pytest.raises(ConfigError, match="timeout_s must be > 0"):
        Communicator(group, "host", timeout_s=0)
    with pytest.raises(ConfigError, match="only meaningful for the cuda transport"):
        Communicator(group, "host", device=0)
    if not cuda_available():
        with pytest.raises(UnsupportedHardwareError, match="the cuda transport"):
            Communicator(group, "cuda")
    else:
        with pytest.raises(ConfigError, match="does not exist"):
            Communicator(group, "cuda", device=999)

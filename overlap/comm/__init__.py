"""Python side of the userbuffers runtime: bootstrap adapters, communicators, buffers."""

from overlap.comm.bootstrap import (
    Bootstrap,
    MPIBootstrap,
    TorchBootstrap,
    check_single_host,
    tp_subgroup,
)
from overlap.comm.communicator import Communicator, SymmetricBuffer, TransportKind

__all__ = [
    "Bootstrap",
    "Communicator",
    "MPIBootstrap",
    "SymmetricBuffer",
    "TorchBootstrap",
    "TransportKind",
    "check_single_host",
    "tp_subgroup",
]

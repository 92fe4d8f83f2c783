"""Python side of the userbuffers runtime: bootstrap adapters, communicators, buffers."""

from overlap.comm.bootstrap import (
    Bootstrap,
    MPIBootstrap,
    TorchBootstrap,
    check_single_host,
    tp_subgroup,
)
from overlap.comm.communicator import Communicator, SymmetricBuffer, TransportKind
from overlap.comm.graphs import CudaGraph

__all__ = [
    "Bootstrap",
    "Communicator",
    "CudaGraph",
    "MPIBootstrap",
    "SymmetricBuffer",
    "TorchBootstrap",
    "TransportKind",
    "check_single_host",
    "tp_subgroup",
]

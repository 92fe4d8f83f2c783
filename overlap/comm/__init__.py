"""Python side of the userbuffers runtime: bootstrap adapters, communicators, buffers."""

from overlap.comm.bootstrap import (
    Bootstrap,
    MPIBootstrap,
    TorchBootstrap,
    check_single_host,
    tp_subgroup,
)
from overlap.comm.communicator import (
    Communicator,
    SymmetricBuffer,
    TransportKind,
    buffer_of,
    live_buffers,
)
from overlap.comm.graphs import CudaGraph

__all__ = [
    "Bootstrap",
    "Communicator",
    "CudaGraph",
    "MPIBootstrap",
    "SymmetricBuffer",
    "TorchBootstrap",
    "TransportKind",
    "buffer_of",
    "check_single_host",
    "live_buffers",
    "tp_subgroup",
]

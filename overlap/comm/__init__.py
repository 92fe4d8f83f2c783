"""Python side of the userbuffers runtime: bootstrap adapters (and, later, communicators)."""

from overlap.comm.bootstrap import (
    Bootstrap,
    MPIBootstrap,
    TorchBootstrap,
    check_single_host,
    tp_subgroup,
)

__all__ = ["Bootstrap", "MPIBootstrap", "TorchBootstrap", "check_single_host", "tp_subgroup"]

"""overlap: hide tensor-parallel communication behind GEMMs.

A C++ userbuffers runtime runs pipelined all-gather and reduce-scatter over buffers shared by
the GPUs of one NVLink domain, overlapped with quantized cuBLASLt GEMMs. This package is its
Python front end.

Quick facts about the build::

    python -m overlap.info
"""

from overlap._native import build_info, cuda_available, require_cuda
from overlap._version import __version__
from overlap.comm.graphs import CudaGraph
from overlap.errors import (
    BootstrapError,
    CommAbortedError,
    CommTimeoutError,
    ConfigError,
    CudaError,
    InvalidArgumentError,
    OverlapError,
    StaleBufferError,
    StateError,
    SystemResourceError,
    UnsupportedHardwareError,
)
from overlap.ub import destroy_ub, get_ub, initialize_ub

__all__ = [
    "BootstrapError",
    "CommAbortedError",
    "CommTimeoutError",
    "ConfigError",
    "CudaError",
    "CudaGraph",
    "InvalidArgumentError",
    "OverlapError",
    "StaleBufferError",
    "StateError",
    "SystemResourceError",
    "UnsupportedHardwareError",
    "__version__",
    "build_info",
    "cuda_available",
    "destroy_ub",
    "get_ub",
    "initialize_ub",
    "require_cuda",
]

"""Loads the extension module ``overlap._C`` and wires it to Python.

The import is lazy so that pure-Python parts (configuration, errors, the env table) work even
when the extension has not been built; anything that needs the core calls :func:`native`.
"""

from __future__ import annotations

import atexit
import functools
import logging
from types import ModuleType
from typing import Any

from overlap._logging import logger
from overlap.env import settings
from overlap.errors import OverlapError, UnsupportedHardwareError

__all__ = ["build_info", "cuda_available", "native", "require_cuda"]


@functools.cache
def native() -> ModuleType:
    """Return the loaded ``overlap._C`` module.

    Raises:
        OverlapError: the extension is missing or cannot be loaded; the message says how to
            build it.
    """
    try:
        from overlap import _C
    except ImportError as exc:
        raise OverlapError(
            f"overlap's C++ extension (overlap._C) cannot be imported: {exc}. Build it with "
            "`pip install --no-build-isolation -e .` from the repository root "
            "(scripts/setup_env.sh does all set-up)."
        ) from exc
    level = settings().log_level
    logger.setLevel(level)
    _C.set_log_level(logging.getLevelName(level))
    _apply_gemm_autotune(_C, settings().gemm_autotune)
    # NOTE [finalizing]: C++ owners skip driver calls once the interpreter is shutting down.
    atexit.register(_C.mark_process_finalizing)
    info = _C.runtime_info()
    if not info["cuda_compiled"]:
        logger.info(
            "overlap built without CUDA support (%s): host transport only", info["no_cuda_reason"]
        )
    return _C


def _apply_gemm_autotune(c_module: ModuleType, candidates: int) -> None:
    """OVERLAP_GEMM_AUTOTUNE -> the core's process-wide setting (0 = off; see overlap.gemm)."""
    current = c_module.gemm.get_autotune()
    c_module.gemm.set_autotune(
        enabled=candidates > 0,
        max_candidates=candidates if candidates > 0 else current["max_candidates"],
        rounds=current["rounds"],
    )


@functools.cache
def build_info() -> dict[str, Any]:
    """Build and machine facts: CUDA compiled?, architectures, cuBLASLt loaded, devices.

    Keys: ``cuda_compiled`` (bool), ``no_cuda_reason`` (str), ``cuda_archs`` (str),
    ``cudart_version``/``driver_version`` (int, CUDA's encoding, 0 if absent),
    ``device_count`` (int), ``device_error`` (str), ``cublaslt_version`` (int),
    ``cublaslt_loaded_library`` (path), ``devices`` (list of dicts).
    """
    return dict(native().runtime_info())


def cuda_available() -> bool:
    """True when this build has CUDA support and at least one GPU is visible."""
    info = build_info()
    return bool(info["cuda_compiled"]) and info["device_count"] > 0


def require_cuda(what: str) -> None:
    """Raise :class:`UnsupportedHardwareError` explaining why ``what`` cannot run on CUDA."""
    info = build_info()
    if not info["cuda_compiled"]:
        raise UnsupportedHardwareError(
            f"{what} needs CUDA, but this build of overlap has no CUDA support "
            f"({info['no_cuda_reason']}). Rebuild on a machine with nvcc and cuBLASLt."
        )
    if info["device_count"] == 0:
        raise UnsupportedHardwareError(
            f"{what} needs a CUDA GPU, but none is visible: {info['device_error']}"
        )

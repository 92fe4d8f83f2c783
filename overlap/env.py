"""Environment variables: the one place overlap reads them.

All variables share the ``OVERLAP_`` prefix. Runtime variables are debugging and deployment
overrides; configuration proper goes through typed arguments. Build-time variables are read
by CMake during ``pip install`` and are listed here so that the table is complete.

Print the table with ``python -m overlap.info --env``.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

from overlap._logging import get_logger
from overlap.errors import ConfigError

__all__ = [
    "ENV_VARS",
    "EnvVar",
    "Scope",
    "Settings",
    "check_timeout_s",
    "format_table",
    "settings",
]

PREFIX = "OVERLAP_"


class Scope(enum.Enum):
    """When a variable is read."""

    RUNTIME = "runtime"
    BUILD = "build"
    TEST = "test"


@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One documented environment variable."""

    name: str
    type: str
    default: str
    scope: Scope
    description: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "OVERLAP_LOG_LEVEL",
        "str",
        "WARNING",
        Scope.RUNTIME,
        "Level of the `overlap` logger and of the C++ core's stderr log "
        "(DEBUG, INFO, WARNING, ERROR).",
    ),
    EnvVar(
        "OVERLAP_TIMEOUT_S",
        "float",
        "60",
        Scope.RUNTIME,
        "Default deadline in seconds of every communication wait; a wait past it raises "
        "CommTimeoutError and fails the communicator. Must be > 0 and at most 1e6 (finite).",
    ),
    EnvVar(
        "OVERLAP_GEMM_AUTOTUNE",
        "int",
        "8",
        Scope.RUNTIME,
        "cuBLASLt algorithms timed on the first GEMM of each new key (shape, dtypes, layouts, "
        "epilogue, SM target, alignment); the fastest is cached for the process, so that first "
        "call is slower. 0 or 1: the heuristic's first algorithm, no tuning (run-to-run "
        "identical choice). At most 64. overlap.gemm.autotune() pre-tunes at start-up.",
    ),
    EnvVar(
        "OVERLAP_BUILD_CUDA",
        "AUTO/ON/OFF",
        "AUTO",
        Scope.BUILD,
        "Compile the CUDA sources: AUTO when nvcc and cuBLASLt are found, ON to require them, "
        "OFF for a host-only build.",
    ),
    EnvVar(
        "OVERLAP_CUDA_ARCHS",
        "str",
        "90a",
        Scope.BUILD,
        "CUDA architectures in CMake syntax, e.g. `90a` or `90a;100a`.",
    ),
    EnvVar(
        "OVERLAP_CUBLAS_ROOT",
        "path",
        "(search)",
        Scope.BUILD,
        "Directory with include/cublasLt.h and lib/libcublasLt.so*; default: the nvidia-cublas "
        "pip package, then the CUDA toolkit.",
    ),
    EnvVar(
        "OVERLAP_CUTLASS_DIR",
        "path",
        "(search)",
        Scope.BUILD,
        "Directory with CUTLASS's include/ and tools/util/include/ (the waiting GEMM of the "
        "fused AG+GEMM); default: the nvidia-cutlass pip package; not found: built without it.",
    ),
    EnvVar(
        "OVERLAP_TEST_NP_TIMEOUT_S",
        "float",
        "180",
        Scope.TEST,
        "Timeout of one mpirun launch in tests/distributed.",
    ),
    EnvVar(
        "OVERLAP_MPIRUN",
        "path",
        "mpirun",
        Scope.TEST,
        "The mpirun used by tests/distributed and the benchmark launcher.",
    ),
)

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _parse_seconds(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not a number; unset it or give seconds, e.g. 60"
        ) from None


def _parse_positive_float(name: str, raw: str) -> float:
    value = _parse_seconds(name, raw)
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be > 0")
    return value


def _core_limit(module: str, name: str) -> Any:
    """A limit the C++ core defines (NOTE [overlap defaults]), read from the extension itself
    (not through ``overlap._native``, which imports this module)."""
    from overlap import _C

    return getattr(getattr(_C, module), name)


def __getattr__(name: str) -> Any:
    """The core's limits as module attributes (PEP 562), read when first used:

    * ``MAX_TIMEOUT_S``: the longest deadline of a wait, in seconds (1e6, about 11.6 days;
      ``SymmetricBuffer::kMaxTimeoutS``): deadlines are points of a clock counting int64
      nanoseconds, which an infinite or huge timeout would overflow;
    * ``GEMM_AUTOTUNE_MAX``: the most cuBLASLt candidates ``OVERLAP_GEMM_AUTOTUNE`` may ask
      for (``gemm::kMaxAutotuneCandidates``).
    """
    if name == "MAX_TIMEOUT_S":
        return float(_core_limit("comm", "max_timeout_s"))
    if name == "GEMM_AUTOTUNE_MAX":
        return int(_core_limit("gemm", "MAX_AUTOTUNE_CANDIDATES"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_timeout_s(value: object, what: str = "timeout_s") -> float:
    """``value`` as a deadline in seconds.

    Raises:
        ConfigError: ``value`` is not a number, or not in ``(0, MAX_TIMEOUT_S]`` (NaN and
            infinity included: there is no "no deadline").
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    seconds = float(value)
    limit = __getattr__("MAX_TIMEOUT_S")
    if not 0 < seconds <= limit:
        raise ConfigError(
            f"{what} must be > 0 and <= {limit:g} s (finite; there is no unbounded "
            f"deadline), got {value!r}"
        )
    return seconds


def _parse_timeout(name: str, raw: str) -> float:
    return check_timeout_s(_parse_seconds(name, raw), f"{name}={raw!r}")


def _parse_autotune(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not an integer; give the number of cuBLASLt candidates to time "
            "(e.g. 8), or 0 to turn GEMM autotuning off"
        ) from None
    most = __getattr__("GEMM_AUTOTUNE_MAX")
    if not 0 <= value <= most:
        raise ConfigError(f"{name}={raw!r} must be in [0, {most}] (0 = off)")
    return value


def _parse_log_level(name: str, raw: str) -> str:
    level = raw.strip().upper()
    if level not in _LOG_LEVELS:
        raise ConfigError(f"{name}={raw!r} must be one of {', '.join(_LOG_LEVELS)}")
    return level


@dataclasses.dataclass(frozen=True)
class Settings:
    """Runtime settings read from the environment (see :data:`ENV_VARS`)."""

    log_level: str = "WARNING"
    timeout_s: float = 60.0
    gemm_autotune: int = 8
    mpirun: str = "mpirun"
    test_np_timeout_s: float = 180.0


_PARSERS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "OVERLAP_LOG_LEVEL": ("log_level", _parse_log_level),
    "OVERLAP_TIMEOUT_S": ("timeout_s", _parse_timeout),
    "OVERLAP_GEMM_AUTOTUNE": ("gemm_autotune", _parse_autotune),
    "OVERLAP_MPIRUN": ("mpirun", lambda _name, raw: raw),
    "OVERLAP_TEST_NP_TIMEOUT_S": ("test_np_timeout_s", _parse_positive_float),
}


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse the runtime variables of ``environ`` (default ``os.environ``).

    Raises:
        ConfigError: a variable is set to an invalid value; the message names it.
    """
    environ = os.environ if environ is None else environ
    known = {v.name for v in ENV_VARS}
    values: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(PREFIX):
            continue
        if name not in known:
            # A typo must not pass silently, but an unrelated variable must not break a job.
            get_logger("env").warning(
                "ignoring unknown environment variable %s; known OVERLAP_* variables: %s "
                "(python -m overlap.info --env prints the table)",
                name,
                ", ".join(sorted(known)),
            )
            continue
        if name in _PARSERS and raw != "":
            field, parse = _PARSERS[name]
            values[field] = parse(name, raw)
    return Settings(**values)


def format_table() -> str:
    """The variable table as Markdown (the README embeds the same table)."""
    lines = ["| variable | type | default | when | description |", "|---|---|---|---|---|"]
    for v in ENV_VARS:
        lines.append(
            f"| `{v.name}` | {v.type} | `{v.default}` | {v.scope.value} | {v.description} |"
        )
    return "\n".join(lines)

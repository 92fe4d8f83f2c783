"""TransformerEngine ``ub_cfgs`` dicts in overlap's terms.

TE configures its userbuffers with a dict of GEMM names to dicts of knobs
(``{"qkv_fprop": {"method": "ring_exchange", ...}, ...}``; TE's ``initialize_ub`` fills every
knob it is not given from a default entry, and users often copy that whole entry).
:func:`convert` turns such a dict into the keyword arguments of one
:class:`~overlap.ub.GemmOverlapConfig` per name; :meth:`overlap.ub.UbConfig.from_te_dict` and
:func:`overlap.initialize_ub` use it. Mapping of the keys:

* ``method``: ``"ring_exchange"`` -> ``RING_AG`` on an all-gather GEMM name, and ``RING_RS``
  on a reduce-scatter one; ``"pipeline"`` -> ``PIPELINE_RS`` (reduce-scatter names only);
  ``"bulk"`` -> ``BULK_AG`` on fprop/dgrad, ``BULK_RS`` on wgrad (NOTE [ub bulk]);
  ``"external"`` (TE's proj/fc2 wgrad, which read the gathered dY their dgrad left in its
  buffer) -> ``NONE``, which does the same here.
* ``fp8_buf`` -> ``fp8``.
* ``is_reduce_scatter``: checked against the method (given, or the name's default): True
  exactly for the reduce-scatters (``PIPELINE_RS``, ``RING_RS``, ``BULK_RS``).
* ``atomic_gemm``: only ``False`` (overlap has no atomic GEMM).
* ``num_sm``, ``cga_size``, ``set_sm_margin``, ``num_splits``, ``use_ce``, ``aggregate``,
  ``pipeline_rs_overlap_first_gemm``, ``comm_priority``, ``gemm_priority``: tune TE's
  SM-based communication kernels and its streams and have no equivalent (overlap's
  all-gather runs on the copy engines, its chunks are one per rank, and its lanes fork from
  the caller's stream): one ``UserWarning`` names those given.
* any other key, an unknown GEMM name, or a value of the wrong type:
  :class:`~overlap.errors.ConfigError`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

from overlap.errors import ConfigError
from overlap.ub.names import OverlapMethod, check_name, default_method, direction

__all__ = ["NO_EQUIVALENT", "TE_KEYS", "convert"]

#: Keys with an equivalent here.
TE_KEYS = frozenset({"method", "fp8_buf", "atomic_gemm", "is_reduce_scatter"})
#: Keys of TE's own default entries without one (warned about, not applied).
NO_EQUIVALENT = frozenset(
    {
        "num_sm",
        "cga_size",
        "set_sm_margin",
        "num_splits",
        "use_ce",
        "aggregate",
        "pipeline_rs_overlap_first_gemm",
        "comm_priority",
        "gemm_priority",
    }
)


def convert(te_cfgs: object, tp: int | None = None) -> dict[str, dict[str, Any]]:
    """``{name: GemmOverlapConfig keyword arguments}`` of a TE ``ub_cfgs`` dict (the module
    docstring has the mapping); ``tp`` chooses the default methods ``is_reduce_scatter`` is
    checked against where an entry gives no method.

    Raises:
        ConfigError: not a dict of dicts, an unknown GEMM name or key, a value of the wrong
            type, or a method that does not fit its name.
    """
    if not isinstance(te_cfgs, Mapping):
        raise ConfigError(f"ub_cfgs: expected a dict, got {type(te_cfgs).__name__}")
    out: dict[str, dict[str, Any]] = {}
    ignored: dict[str, list[str]] = {}
    for name, entry in te_cfgs.items():
        check_name(name)
        if not isinstance(entry, Mapping):
            raise ConfigError(f"ub_cfgs[{name!r}]: expected a dict, got {entry!r}")
        unknown = set(entry) - TE_KEYS - NO_EQUIVALENT
        if unknown:
            raise ConfigError(
                f"ub_cfgs[{name!r}]: unknown keys {sorted(unknown)}; known: "
                f"{sorted(TE_KEYS | NO_EQUIVALENT)}"
            )
        atomic = _flag(name, entry, "atomic_gemm")
        if atomic:
            raise ConfigError(
                f"ub_cfgs[{name!r}].atomic_gemm: True is not supported (overlap has no "
                "atomic GEMM); allowed: False"
            )
        given = sorted(set(entry) & NO_EQUIVALENT)
        if given:
            ignored[name] = given
        method = _method(name, entry.get("method"))
        scatters = _flag(name, entry, "is_reduce_scatter")
        if scatters is not None:
            effective = method if method is not None else default_method(name, tp)
            if scatters != effective.reduce_scatters:
                raise ConfigError(
                    f"ub_cfgs[{name!r}].is_reduce_scatter: {scatters} contradicts the method "
                    f"{effective.value!r}"
                    + ("" if method is not None else " (the default)")
                    + f", which {'reduce-scatters' if effective.reduce_scatters else 'does not'}"
                )
        kwargs: dict[str, Any] = {"method": method}
        fp8 = _flag(name, entry, "fp8_buf")
        if fp8 is not None:
            kwargs["fp8"] = fp8
        out[name] = kwargs
    if ignored:
        _warn(
            "ub_cfgs keys without an equivalent in overlap (its all-gather uses the copy "
            f"engines, not SMs, and its lanes fork from the caller's stream), not applied: "
            f"{ignored}"
        )
    return out


def _flag(name: str, entry: Mapping[str, Any], key: str) -> bool | None:
    """A bool entry (None when absent)."""
    if key not in entry:
        return None
    value = entry[key]
    if not isinstance(value, bool):
        raise ConfigError(f"ub_cfgs[{name!r}].{key}: {value!r} must be True or False")
    return value


def _method(name: str, method: object) -> OverlapMethod | None:
    if method is None:
        return None
    d = direction(name)
    if method == "bulk":
        return OverlapMethod.BULK_RS if d is None else OverlapMethod.BULK_AG
    if method == "external" and name in ("proj_wgrad", "fc2_wgrad"):
        return OverlapMethod.NONE
    if method in ("ring_exchange", "pipeline") and d is not None:
        if method == "pipeline" and d is OverlapMethod.RING_AG:
            raise ConfigError(
                f"ub_cfgs[{name!r}].method: 'pipeline' is a reduce-scatter overlap and "
                f"{name} all-gathers; allowed: ['ring_exchange', 'bulk']"
            )
        if method == "ring_exchange" and d is OverlapMethod.PIPELINE_RS:
            return OverlapMethod.RING_RS
        return d
    if d is not None:
        allowed = ["ring_exchange", "pipeline", "bulk"]
    else:
        allowed = ["bulk", "external"] if name in ("proj_wgrad", "fc2_wgrad") else ["bulk"]
    raise ConfigError(f"ub_cfgs[{name!r}].method: {method!r} is not one of {allowed}")


def _warn(message: str) -> None:
    """A UserWarning attributed to the first caller outside the ``overlap.ub`` package
    (``UbConfig.from_te_dict`` and ``initialize_ub`` both convert TE dicts)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("overlap.ub"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)

"""The standard GEMM names of a transformer layer, their overlap methods and the default policy.

Twelve GEMMs (``qkv``/``proj``/``fc1``/``fc2`` x ``fprop``/``dgrad``/``wgrad``), each with
the communication of its place in a sequence-parallel layer (``T`` tokens, ``H`` hidden, ``tp``
ranks, a rank holding ``T / tp`` rows of the residual stream):

* an AG+GEMM (``RING_AG``) gathers a ``[T / tp, H]`` shard into ``[T, H]``: qkv/fc1 fprop
  (the layer-norm output) and proj/fc2 dgrad (the output gradient);
* a GEMM+RS (``PIPELINE_RS``, or ``RING_RS`` for the ring-exchange method) reduce-scatters
  ``[T, H]`` partial sums into ``[T / tp, H]``: proj/fc2 fprop (and qkv/fc1 dgrad when
  chosen instead of the bulk pair below);
* a bulk all-gather (``BULK_AG``, :class:`~overlap.ops.AllGatherBesideGemm`) gathers a
  ``[T / tp, H]`` shard beside the GEMM of its name: by default qkv/fc1 dgrad, which gathers
  the layer input (the layer-norm output) that wgrad needs while dgrad runs;
* a bulk reduce-scatter (``BULK_RS``, :class:`~overlap.ops.ReduceScatterBesideGemm`)
  reduce-scatters ``[T, H]`` partial sums beside the GEMM of its name: by default qkv/fc1
  wgrad, which reduce-scatters dgrad's output while wgrad runs.

This module says which methods fit which name and which one runs by default; the one TP-size
dependent choice (the GEMM+RS method at TP 2) comes from the C++ core (NOTE [ub tp 2] in
``csrc/comm/overlap/defaults.cpp``).

NOTE [ub bulk]: the backward of qkv/fc1 (column-parallel, sequence-parallel input) defaults to
TransformerEngine's and Megatron-LM's bulk pair: ``{layer}_dgrad`` is ``BULK_AG`` (gather the
input for wgrad while dgrad ``dX = dY W`` runs; dgrad's output stays ``[T, H]`` partial sums)
and ``{layer}_wgrad`` is ``BULK_RS`` (reduce-scatter those partial sums while wgrad
``dW = dY^T X`` runs), so both collectives hide behind a GEMM. Choosing ``PIPELINE_RS`` for
the dgrad instead reduce-scatters inside the dgrad GEMM; the wgrad then has nothing left to
reduce-scatter and defaults to ``NONE`` (an explicit ``BULK_RS`` is kept: the op objects are
generic). proj/fc2 wgrad have no collective (``NONE``): their gathered operand is the one the
``RING_AG`` dgrad left in its buffer (it keeps it by default: NOTE [ub gathered inputs]). Bulk
ops of one kind share a window like the others (NOTE [ub buffer sharing] in
:mod:`overlap.ub.handle`); a bulk all-gather's gathered input is read by the wgrad GEMM beside
the bulk reduce-scatter, whose window shares no byte with the bulk all-gather's (NOTE
[userbuffer memory]).

NOTE [ub gathered inputs]: whether a ``RING_AG`` op keeps the whole gathered input in its
buffer by default. proj/fc2 dgrad do: their wgrad (``NONE``) reads the gathered dY from it
(NOTE [ub bulk]). qkv/fc1 fprop do only when that layer's dgrad is not ``BULK_AG``, which
re-gathers the input for wgrad: the caller then copies the fprop's gathered input out for
backward (docs/design.md §3, invariant 2). Not keeping saves a local copy beside the pushes
(NOTE [ag_gemm own slot]). Verdict: keep only what a later GEMM of the layer reads.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from overlap._native import native
from overlap.errors import ConfigError

__all__ = [
    "GEMM_NAMES",
    "GEMM_RS",
    "LAYERS",
    "PASSES",
    "OverlapMethod",
    "allowed_methods",
    "check_name",
    "default_method",
    "direction",
    "keeps_gathered_by_default",
    "method_in",
]

LAYERS = ("qkv", "proj", "fc1", "fc2")
PASSES = ("fprop", "dgrad", "wgrad")
GEMM_NAMES: tuple[str, ...] = tuple(f"{layer}_{p}" for layer in LAYERS for p in PASSES)


class OverlapMethod(enum.Enum):
    """How a GEMM's TP communication is overlapped."""

    RING_AG = "ring_ag"  # AllGatherGemm: gather the input while the GEMM consumes it
    PIPELINE_RS = "pipeline_rs"  # GemmReduceScatter: reduce-scatter while the GEMM computes
    RING_RS = "ring_rs"  # GemmReduceScatter(method="ring"): running sums travel the ring
    BULK_AG = "bulk_ag"  # AllGatherBesideGemm: gather a shard beside the GEMM (NOTE [ub bulk])
    BULK_RS = "bulk_rs"  # ReduceScatterBesideGemm: reduce-scatter beside the GEMM
    NONE = "none"  # not overlapped

    @property
    def overlapped(self) -> bool:
        """Whether overlap builds an op object for this method."""
        return self is not OverlapMethod.NONE

    @property
    def bulk(self) -> bool:
        """Whether this is a bulk method (a collective beside an unrelated GEMM)."""
        return self in (OverlapMethod.BULK_AG, OverlapMethod.BULK_RS)

    @property
    def reduce_scatters(self) -> bool:
        """Whether its collective is a reduce-scatter (TransformerEngine's
        ``is_reduce_scatter``)."""
        return self in (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS, OverlapMethod.BULK_RS)


# The GEMM+RS methods: one GemmReduceScatter each, sharing one buffer (NOTE [ub buffer sharing]).
GEMM_RS = (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS)


def check_name(name: object) -> None:
    """Raise :class:`ConfigError` unless ``name`` is a standard GEMM name (listing them)."""
    if name not in GEMM_NAMES:
        raise ConfigError(f"unknown GEMM name {name!r}; valid names: {list(GEMM_NAMES)}")


def direction(name: str) -> OverlapMethod | None:
    """The pipelined method a GEMM name's communication fits: ``RING_AG`` (gathers its input)
    or ``PIPELINE_RS`` (reduce-scatters its output); None for a wgrad."""
    layer, pass_ = name.split("_")
    if pass_ == "wgrad":
        return None
    gathers = (layer in ("qkv", "fc1")) == (pass_ == "fprop")
    return OverlapMethod.RING_AG if gathers else OverlapMethod.PIPELINE_RS


def allowed_methods(name: str) -> list[OverlapMethod]:
    """The methods that fit GEMM ``name``'s communication."""
    d = direction(name)
    bulk = [OverlapMethod.BULK_AG, OverlapMethod.BULK_RS, OverlapMethod.NONE]
    if d is OverlapMethod.PIPELINE_RS:  # either GEMM+RS method
        return [d, OverlapMethod.RING_RS, *bulk]
    return bulk if d is None else [d, *bulk]


def default_method(name: str, tp: int | None = None) -> OverlapMethod:
    """The default method of a standard GEMM name: fprop of qkv/fc1 and dgrad of proj/fc2 are
    ``RING_AG``; fprop of proj/fc2 is the core's default GEMM+RS at TP size ``tp``
    (``PIPELINE_RS``, or at TP 2 ``RING_RS`` with ``pull_shards``: NOTE [ub tp 2] in
    ``csrc/comm/overlap/defaults.cpp``); dgrad of qkv/fc1 is ``BULK_AG`` and their wgrad
    ``BULK_RS`` (TE's and Megatron-LM's layout, NOTE [ub bulk]); wgrad of proj/fc2 is
    ``NONE`` (no collective). :class:`~overlap.ub.UbConfig` makes qkv/fc1 wgrad default to
    ``NONE`` when their dgrad is a GEMM+RS (:func:`method_in`)."""
    check_name(name)
    layer, pass_ = name.split("_")
    if pass_ != "fprop" and layer in ("qkv", "fc1"):
        return OverlapMethod.BULK_AG if pass_ == "dgrad" else OverlapMethod.BULK_RS
    d = direction(name)
    if d is OverlapMethod.PIPELINE_RS:
        method = native().comm_ops.gemm_rs_default(0 if tp is None else int(tp)).method
        return OverlapMethod.RING_RS if method.name == "RING" else OverlapMethod.PIPELINE_RS
    return d if d is not None else OverlapMethod.NONE


def method_in(name: str, given: Mapping[str, OverlapMethod], tp: int | None) -> OverlapMethod:
    """The default method of ``name`` among the methods ``given`` for other names:
    :func:`default_method`, except that qkv/fc1 wgrad is ``NONE`` when the same layer's dgrad
    is given as a GEMM+RS (its partial sums are then already reduce-scattered; NOTE [ub bulk])."""
    layer, pass_ = name.split("_")
    if pass_ == "wgrad" and given.get(f"{layer}_dgrad") in GEMM_RS:
        return OverlapMethod.NONE
    return default_method(name, tp)


def keeps_gathered_by_default(name: str, methods: Mapping[str, OverlapMethod]) -> bool:
    """Whether the ``RING_AG`` op of GEMM ``name`` keeps its gathered input by default, given
    every name's method (NOTE [ub gathered inputs])."""
    layer, pass_ = name.split("_")
    if pass_ == "dgrad":
        return True
    return methods[f"{layer}_dgrad"] is not OverlapMethod.BULK_AG

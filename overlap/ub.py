"""Userbuffers set-up for a transformer layer: ``initialize_ub`` / ``get_ub`` / ``destroy_ub``.

One call builds the communicator of the TP group, the symmetric buffers and the overlap op
objects of the standard GEMM names (``qkv``/``proj``/``fc1``/``fc2`` x ``fprop``/``dgrad``/
``wgrad``), from a typed configuration (:class:`UbConfig`, :class:`GemmOverlapConfig`) that is
validated before anything collective happens. A TransformerEngine-style ``ub_cfgs`` dict is
converted by :meth:`UbConfig.from_te_dict`.

Shapes, with ``T`` the global token count (sequence x micro-batch), ``H`` the hidden size and
``tp`` the TP size (sequence parallelism: a rank holds ``T / tp`` rows of the residual stream):

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

Every buffer is sized by ``T`` and ``H`` alone (the other GEMM dimension, ``3H / tp`` or
``ffn / tp``, is the weight's and is given at call time), so the layer's FFN and QKV widths
are not part of the configuration.

NOTE [ub buffer sharing]: the ops of one kind (all AG+GEMMs, all GEMM+RSs) of a layer run one
after another, never concurrently, so they share one buffer per (kind, buffer dtype,
put_split): every AG+GEMM of a bf16 layer runs on one buffer, every GEMM+RS (pipelined or
ring, sized for the larger need) on another. A gathered input
(``AllGatherGemm.gathered_input``) is therefore only defined until the next op of any GEMM
name of that kind; never save it for backward (docs/design.md §3, invariant 2).

NOTE [ub tp 2]: at TP 2 (``UbConfig.tp``, which :func:`initialize_ub` sets to its group's
size) proj/fc2 fprop default to ``RING_RS`` with ``pull_shards`` (two sub-chunks, one compute
lane) instead of ``PIPELINE_RS``. On 2xH200 (``python -m benchmarks.overlap_ops --launch 2
--cuda --full``, 2026-11-22) that ring was faster than the pipelined default (one lane, one
copy per peer) on 11 of the 12 GEMM+RS rows of the suite, by up to 8% (proj FP8 M 16384:
0.906 -> 0.830 ms; te4096 FP8 0.235 -> 0.227; fc2 FP8 M 16384 3.027 -> 2.899), and 3%
slower on fc2 FP8 M 8192 (1.457 -> 1.504). Other TP sizes keep ``PIPELINE_RS``: on 4xH200
(``--launch 4 --tp 4``, the same day) that ring was faster on 5 of the 12 rows (proj FP8 M
16384: 0.761 -> 0.705 ms) and slower on 7 (fc2 FP8 M 16384: 1.491 -> 1.527); over four
later runs of the TP 4 suite (48 row samples, 2026-11-22) the ring was faster on 26, by
0.5% on average, a tie. Also at TP 2, ``RING_AG`` defaults to one compute lane instead of
two: each rank's chunk GEMMs are twice as tall as at TP 4, and two of them side by side
contend rather than fill each other's tails. Over three runs of the TP 2 suite (36 AG+GEMM
row samples, ``python -m benchmarks.overlap_ops --launch 2 --cuda --full``, the third with this
default) one lane was faster on 25, by 1.0% on average and up to 7.6% (te8192 bf16 1.626 ->
1.503 ms; fc1 bf16 M 8192 6.108 -> 5.744), at most 3.9% slower (qkv FP8 M 16384, within the
runs' noise). At TP 4 two lanes stay: they were the best single setting over 48 samples.

NOTE [ub bulk]: the backward of qkv/fc1 (column-parallel, sequence-parallel input) defaults to
TransformerEngine's and Megatron-LM's bulk pair: ``{layer}_dgrad`` is ``BULK_AG`` (gather the
input for wgrad while dgrad ``dX = dY W`` runs; dgrad's output stays ``[T, H]`` partial sums)
and ``{layer}_wgrad`` is ``BULK_RS`` (reduce-scatter those partial sums while wgrad
``dW = dY^T X`` runs), so both collectives hide behind a GEMM. Choosing ``PIPELINE_RS`` for
the dgrad instead reduce-scatters inside the dgrad GEMM; the wgrad then has nothing left to
reduce-scatter and defaults to ``NONE`` (an explicit ``BULK_RS`` is kept: the op objects are
generic). proj/fc2 wgrad have no collective (``NONE``): their gathered operand is the one the
``RING_AG`` dgrad left in its buffer (it keeps it by default: NOTE [ub gathered inputs]). Bulk
ops of one kind share a buffer like the others (NOTE [ub buffer sharing]); a bulk all-gather's
gathered input is read by the wgrad GEMM beside the bulk reduce-scatter, which runs on the
other kind's buffer.

NOTE [ub environment]: unlike TE's userbuffers, nothing here needs
``CUDA_DEVICE_MAX_CONNECTIONS=1``: the all-gathers run on the copy engines and the GEMM+RS
reduction kernel is launched after its chunk's GEMM on the same stream, so no communication
kernel has to become resident beside a GEMM that fills the GPU. The one kernel that does run
beside a GEMM, the bulk reduce-scatter's local reduction, finds SMs free because the side
GEMM plans for ``gemm_sm_margin`` fewer (with ``CUDA_DEVICE_MAX_CONNECTIONS=1`` it may queue
behind the GEMM instead: correct, less overlap). :func:`initialize_ub` checks what the ops do
need (tokens divisible by the TP size, a CUDA device for the cuda transport).

The module-level default registry (:func:`initialize_ub` stores the handle it returns,
:func:`get_ub` and :func:`destroy_ub` use it) is a convenience for scripts; layers should take
the :class:`Userbuffers` handle explicitly (docs/design.md §8). Only one default handle
exists at a time; ``initialize_ub(..., register=False)`` builds a handle outside it.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from overlap.errors import ConfigError, StateError

if TYPE_CHECKING:
    import torch

    from overlap.comm import Bootstrap, Communicator, SymmetricBuffer
    from overlap.ops import (
        AllGatherBesideGemm,
        AllGatherGemm,
        GemmReduceScatter,
        ReduceScatterBesideGemm,
    )

    UbOp = AllGatherGemm | GemmReduceScatter | AllGatherBesideGemm | ReduceScatterBesideGemm

__all__ = [
    "GEMM_NAMES",
    "GemmOverlapConfig",
    "OverlapMethod",
    "UbConfig",
    "Userbuffers",
    "default_method",
    "destroy_ub",
    "get_ub",
    "initialize_ub",
]

LAYERS = ("qkv", "proj", "fc1", "fc2")
PASSES = ("fprop", "dgrad", "wgrad")
GEMM_NAMES: tuple[str, ...] = tuple(f"{layer}_{p}" for layer in LAYERS for p in PASSES)

_DTYPES = ("bfloat16", "float16", "float32")
_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


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


def _direction(name: str) -> OverlapMethod | None:
    """The pipelined method a GEMM name's communication fits (None: wgrad)."""
    layer, pass_ = name.split("_")
    if pass_ == "wgrad":
        return None
    gathers = (layer in ("qkv", "fc1")) == (pass_ == "fprop")
    return OverlapMethod.RING_AG if gathers else OverlapMethod.PIPELINE_RS


def default_method(name: str, tp: int | None = None) -> OverlapMethod:
    """The default method of a standard GEMM name: fprop of qkv/fc1 and dgrad of proj/fc2 are
    ``RING_AG``; fprop of proj/fc2 is ``PIPELINE_RS``, or at ``tp`` 2 ``RING_RS`` (with
    ``pull_shards``, NOTE [ub tp 2]); dgrad of qkv/fc1 is ``BULK_AG`` and their wgrad
    ``BULK_RS`` (TE's and Megatron-LM's layout, NOTE [ub bulk]); wgrad of proj/fc2 is
    ``NONE`` (no collective). :class:`UbConfig` makes qkv/fc1 wgrad default to ``NONE`` when
    their dgrad is ``PIPELINE_RS``."""
    _check_name(name)
    layer, pass_ = name.split("_")
    column_parallel = layer in ("qkv", "fc1")
    if pass_ == "fprop" or not column_parallel:
        direction = _direction(name)
        if direction is OverlapMethod.PIPELINE_RS and tp == 2:
            return OverlapMethod.RING_RS
        return direction if direction is not None else OverlapMethod.NONE
    return OverlapMethod.BULK_AG if pass_ == "dgrad" else OverlapMethod.BULK_RS


def _default_in(name: str, given: Mapping[str, GemmOverlapConfig], tp: int | None) -> OverlapMethod:
    """:func:`default_method`, except that qkv/fc1 wgrad is ``NONE`` when the same layer's
    dgrad is given as ``PIPELINE_RS`` or ``RING_RS`` (its partial sums are then already
    reduce-scattered; NOTE [ub bulk])."""
    method = default_method(name, tp)
    layer, pass_ = name.split("_")
    dgrad = given.get(f"{layer}_dgrad")
    if pass_ == "wgrad" and dgrad is not None and dgrad.method in _GEMM_RS:
        return OverlapMethod.NONE
    return method


def _keeps_gathered_by_default(name: str, gemms: Mapping[str, GemmOverlapConfig]) -> bool:
    """NOTE [ub gathered inputs]: whether the ``RING_AG`` op of GEMM ``name`` keeps the whole
    gathered input in its buffer by default. proj/fc2 dgrad do: their wgrad (``NONE``) reads
    the gathered dY from it (NOTE [ub bulk]). qkv/fc1 fprop do only when that layer's dgrad
    is not ``BULK_AG``, which re-gathers the input for wgrad: the caller then copies the fprop's
    gathered input out for backward (docs/design.md §3, invariant 2). Not keeping saves a local copy
    beside the pushes (NOTE [ag_gemm own slot]: up to 8% of the op)."""
    layer, pass_ = name.split("_")
    if pass_ == "dgrad":
        return True
    return gemms[f"{layer}_dgrad"].method is not OverlapMethod.BULK_AG


def _check_name(name: object) -> None:
    if name not in GEMM_NAMES:
        raise ConfigError(f"unknown GEMM name {name!r}; valid names: {list(GEMM_NAMES)}")


def _allowed(name: str) -> list[OverlapMethod]:
    direction = _direction(name)
    bulk = [OverlapMethod.BULK_AG, OverlapMethod.BULK_RS, OverlapMethod.NONE]
    if direction is OverlapMethod.PIPELINE_RS:  # either GEMM+RS method
        return [direction, OverlapMethod.RING_RS, *bulk]
    return bulk if direction is None else [direction, *bulk]


# The GEMM+RS methods: one GemmReduceScatter each, sharing one buffer (NOTE [ub buffer sharing]).
_GEMM_RS = (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS)


@dataclasses.dataclass(frozen=True)
class GemmOverlapConfig:
    """How one GEMM name is overlapped. Validated at construction (:class:`ConfigError`).

    Attributes:
        method: the overlap method (``None``: the GEMM name's default, filled in by
            :class:`UbConfig`).
        compute_lanes: streams the chunk GEMMs alternate over, 1..4 (default: 2 for
            ``RING_AG``, 1 for ``PIPELINE_RS`` / ``RING_RS``, the ops' defaults; bulk ops have
            none). :class:`UbConfig` made for TP 2 fills in 1 for ``RING_AG`` (NOTE [ub tp
            2]).
        put_split: copies carrying one shard to one peer, 1..8 (``RING_AG``, ``BULK_AG`` and
            ``BULK_RS``; a property of the shared buffer, so names with different values get
            different buffers).
        staggered_puts: push the shard to one peer after the other (``RING_AG`` only; the
            default, as :class:`~overlap.ops.AllGatherGemm`'s).
        pull_shards: the peers pull what they need instead of it being pushed to them
            (``RING_AG``: each rank's shard, after two device-side handshakes, NOTE [ag_gemm
            pulls], ``put_split`` and ``staggered_puts`` then do not apply; ``RING_RS``: the
            running sums, NOTE [gemm_rs_ring pulls]; ignored by the other methods). ``None``:
            the default, False, except for a ``RING_RS`` that :class:`UbConfig` chose by
            default at TP 2, which it sets to True (NOTE [ub tp 2]).
        pieces: pieces each chunk is split into, 1..4 (``RING_AG``: each peer's shard
            travels and is multiplied in pieces, NOTE [ag_gemm pieces]; ``PIPELINE_RS``: the
            chunks are computed, pulled and summed in rounds, NOTE [gemm_rs pieces]): for
            shapes whose communication takes about as long as the GEMM. ``BULK_RS``: the
            partial sums travel and are summed in pieces, each as soon as it has landed
            (NOTE [bulk_rs pieces]). ``None``: the op's default (``BULK_RS``: 4 at TP 2, else
            2, :func:`~overlap.ops.bulk.bulk_rs_defaults`; other methods 1).
        reduce_max_blocks: bound on the reduction kernel's grid, 0 = fill the GPU
            (``PIPELINE_RS`` and ``BULK_RS``; ``None``: the op's default, 0 for
            ``PIPELINE_RS`` and 64 blocks for ``BULK_RS``, which runs beside a GEMM;
            ``RING_RS``: its FP8 output cast, default 0).
        gemm_sm_margin: ``BULK_RS`` only: SMs the side GEMM leaves to the reduction when the
            call gives no ``sm_count`` (``None``: the op's default, 8).
        ring_subchunks: sub-chunks each ring hop is pipelined in, 1..4 (``RING_RS`` only;
            NOTE [gemm_rs_ring schedule]).
        keep_gathered: ``RING_AG`` only: every call leaves the whole gathered input in the
            buffer for ``gathered_input()`` (:class:`~overlap.ops.AllGatherGemm`'s
            ``keep_gathered``; a call may still override it). ``None``: :class:`UbConfig`
            fills in the name's default (NOTE [ub gathered inputs]).
        fp8: the GEMM's input travels in FP8 (``RING_AG`` / ``BULK_AG``: the buffer holds FP8
            shards and their scale_inv; ``PIPELINE_RS`` / ``BULK_RS``: the partial sums still
            travel in the layer's dtype, so the buffer is the same).
    """

    method: OverlapMethod | None = None
    compute_lanes: int | None = None
    put_split: int = 1
    staggered_puts: bool = True
    pull_shards: bool | None = None
    reduce_max_blocks: int | None = None
    fp8: bool = False
    gemm_sm_margin: int | None = None
    ring_subchunks: int = 2
    pieces: int | None = None
    keep_gathered: bool | None = None

    def __post_init__(self) -> None:
        if self.method is not None and not isinstance(self.method, OverlapMethod):
            try:
                object.__setattr__(self, "method", OverlapMethod(self.method))
            except ValueError:
                raise ConfigError(
                    f"GemmOverlapConfig.method: {self.method!r} is not one of "
                    f"{[m.value for m in OverlapMethod]}"
                ) from None
        _check_int("GemmOverlapConfig.compute_lanes", self.compute_lanes, 1, 4, optional=True)
        _check_int("GemmOverlapConfig.put_split", self.put_split, 1, 8)
        _check_int(
            "GemmOverlapConfig.reduce_max_blocks", self.reduce_max_blocks, 0, None, optional=True
        )
        _check_int("GemmOverlapConfig.gemm_sm_margin", self.gemm_sm_margin, 0, None, optional=True)
        _check_int("GemmOverlapConfig.ring_subchunks", self.ring_subchunks, 1, 4)
        _check_int("GemmOverlapConfig.pieces", self.pieces, 1, 4, optional=True)
        for field in ("staggered_puts", "pull_shards", "fp8", "keep_gathered"):
            value = getattr(self, field)
            optional = field in ("pull_shards", "keep_gathered")
            if not isinstance(value, bool) and not (optional and value is None):
                raise ConfigError(
                    f"GemmOverlapConfig.{field}: {getattr(self, field)!r} must be True or False"
                )

    @property
    def lanes(self) -> int:
        """``compute_lanes`` with the op's default filled in."""
        if self.compute_lanes is not None:
            return self.compute_lanes
        return 1 if self.method in _GEMM_RS else 2

    @property
    def max_blocks(self) -> int:
        """``reduce_max_blocks`` with the op's default filled in."""
        if self.reduce_max_blocks is not None:
            return self.reduce_max_blocks
        return _bulk_rs_max_blocks() if self.method is OverlapMethod.BULK_RS else 0

    @property
    def pulls(self) -> bool:
        """``pull_shards`` with the default filled in (``None``: False)."""
        return bool(self.pull_shards)

    @property
    def keeps_gathered(self) -> bool:
        """``keep_gathered`` with the default filled in (``None``: False)."""
        return bool(self.keep_gathered)

    @property
    def piece_count(self) -> int:
        """``pieces`` with the op's default filled in (a ``BULK_RS`` of any TP size:
        :class:`UbConfig` fills in its TP size's)."""
        if self.pieces is not None:
            return self.pieces
        return _bulk_rs_defaults(None)[1] if self.method is OverlapMethod.BULK_RS else 1

    @property
    def sm_margin(self) -> int:
        """``gemm_sm_margin`` with the op's default filled in (as :attr:`piece_count`)."""
        return _bulk_rs_defaults(None)[0] if self.gemm_sm_margin is None else self.gemm_sm_margin

    @property
    def settings(self) -> str:
        """The settings that apply to the method, defaults filled in (``"-"``: none), as
        :meth:`Userbuffers.describe` lists them: e.g. ``"subchunks=2 pull"``."""
        m = self.method
        if m is OverlapMethod.RING_AG:
            order = "pull" if self.pulls else "staggered" if self.staggered_puts else "all"
            parts = [f"pieces={self.piece_count}", order]
            if self.keeps_gathered:
                parts.append("keep_gathered")
        elif m is OverlapMethod.PIPELINE_RS:
            parts = [f"pieces={self.piece_count}", f"max_blocks={self.max_blocks}"]
        elif m is OverlapMethod.RING_RS:
            parts = [f"subchunks={self.ring_subchunks}", "pull" if self.pulls else "push"]
        elif m is OverlapMethod.BULK_RS:
            parts = [
                f"pieces={self.piece_count}",
                f"max_blocks={self.max_blocks}",
                f"sm_margin={self.sm_margin}",
            ]
        else:  # BULK_AG (its put_split is the buffer's) and NONE
            parts = []
        return " ".join(parts) or "-"


# The defaults of ReduceScatterBesideGemm (overlap.ops.bulk; NOTE [bulk_rs defaults]).
def _bulk_rs_defaults(tp: int | None) -> tuple[int, int]:
    from overlap.ops.bulk import bulk_rs_defaults

    return bulk_rs_defaults(tp)


def _bulk_rs_max_blocks() -> int:
    from overlap.ops.bulk import bulk_rs_max_blocks

    return bulk_rs_max_blocks()


def _check_int(field: str, value: object, lo: int, hi: int | None, optional: bool = False) -> None:
    if optional and value is None:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo
    if not ok or (hi is not None and value > hi):  # type: ignore[operator]
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{field}: {value!r} is not an int in {allowed}")


def _dtype_name(field: str, value: object, allowed: tuple[str, ...]) -> str:
    name = str(value).removeprefix("torch.")
    if name not in allowed:
        raise ConfigError(f"{field}: {value!r} is not one of {list(allowed)}")
    return name


@dataclasses.dataclass(frozen=True)
class UbConfig:
    """The userbuffers configuration of one TP group. Validated at construction.

    Attributes:
        tokens: ``T``, the global token count (sequence x micro-batch) of the largest call;
            must be divisible by the TP size (checked by :func:`initialize_ub`).
        hidden: ``H``, the hidden size.
        dtype: the activations' dtype: ``"bfloat16"``/``"float16"``/``"float32"`` or the
            torch dtype (stored as its name).
        fp8_dtype: the FP8 dtype of ``fp8`` GEMMs' inputs (``"float8_e4m3fn"`` or
            ``"float8_e5m2"``).
        timeout_s: deadline of every wait (``None``: ``OVERLAP_TIMEOUT_S``).
        gemms: per-GEMM settings; a missing name, or one whose ``method`` is ``None``, gets
            its default method (:func:`default_method`). After construction every standard
            name is present with a concrete method.
        tp: the TP size the defaults are chosen for (``None``: any; :func:`initialize_ub`
            fills in its group's size and refuses a config made for another).
    """

    tokens: int
    hidden: int
    dtype: Any = "bfloat16"
    fp8_dtype: Any = "float8_e4m3fn"
    timeout_s: float | None = None
    gemms: Mapping[str, GemmOverlapConfig] = dataclasses.field(default_factory=dict)
    tp: int | None = None

    def __post_init__(self) -> None:
        _check_int("UbConfig.tokens", self.tokens, 1, None)
        _check_int("UbConfig.hidden", self.hidden, 1, None)
        object.__setattr__(self, "dtype", _dtype_name("UbConfig.dtype", self.dtype, _DTYPES))
        object.__setattr__(
            self, "fp8_dtype", _dtype_name("UbConfig.fp8_dtype", self.fp8_dtype, _FP8_DTYPES)
        )
        if self.timeout_s is not None and not (
            isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0
        ):
            raise ConfigError(f"UbConfig.timeout_s: {self.timeout_s!r} must be > 0 or None")
        _check_int("UbConfig.tp", self.tp, 1, None, optional=True)
        if not isinstance(self.gemms, Mapping):
            raise ConfigError(f"UbConfig.gemms: expected a mapping, got {type(self.gemms)}")
        full: dict[str, GemmOverlapConfig] = {}
        for name, cfg in self.gemms.items():
            _check_name(name)
            if not isinstance(cfg, GemmOverlapConfig):
                raise ConfigError(
                    f"UbConfig.gemms[{name!r}]: expected a GemmOverlapConfig, got {cfg!r}"
                )
            full[name] = cfg
        for name in GEMM_NAMES:
            cfg = full.get(name, GemmOverlapConfig())
            if cfg.method is None:
                cfg = dataclasses.replace(cfg, method=_default_in(name, full, self.tp))
                if cfg.method is OverlapMethod.RING_RS and cfg.pull_shards is None:
                    cfg = dataclasses.replace(cfg, pull_shards=True)  # NOTE [ub tp 2]
            if cfg.method is OverlapMethod.RING_AG and self.tp == 2 and cfg.compute_lanes is None:
                cfg = dataclasses.replace(cfg, compute_lanes=1)  # NOTE [ub tp 2]
            if cfg.method is OverlapMethod.BULK_RS and self.tp is not None:
                margin, pieces = _bulk_rs_defaults(self.tp)  # NOTE [bulk_rs defaults]
                if cfg.gemm_sm_margin is None:
                    cfg = dataclasses.replace(cfg, gemm_sm_margin=margin)
                if cfg.pieces is None:
                    cfg = dataclasses.replace(cfg, pieces=pieces)
            if cfg.method not in _allowed(name):
                raise ConfigError(
                    f"UbConfig.gemms[{name!r}].method: {cfg.method.value!r} does not fit "
                    f"{name}'s communication; allowed: {[m.value for m in _allowed(name)]}"
                )
            full[name] = cfg
        for name in GEMM_NAMES:  # every method is known now
            cfg = full[name]
            if cfg.method is OverlapMethod.RING_AG and cfg.keep_gathered is None:
                keep = _keeps_gathered_by_default(name, full)
                full[name] = dataclasses.replace(cfg, keep_gathered=keep)
        object.__setattr__(self, "gemms", {n: full[n] for n in GEMM_NAMES})

    @classmethod
    def from_te_dict(
        cls, te_cfgs: Mapping[str, Mapping[str, Any]], *, tokens: int, hidden: int, **kwargs: Any
    ) -> UbConfig:
        """Convert a TransformerEngine ``ub_cfgs`` dict (``{"qkv_fprop": {"method":
        "ring_exchange", ...}, ...}``). Other :class:`UbConfig` fields come as keywords.

        Mapping of the values' keys:

        * ``method``: ``"ring_exchange"`` -> ``RING_AG`` on an all-gather GEMM name, and
          ``RING_RS`` on a reduce-scatter one; ``"pipeline"`` -> ``PIPELINE_RS``
          (reduce-scatter names only); ``"bulk"`` -> ``BULK_AG`` on fprop/dgrad, ``BULK_RS``
          on wgrad (NOTE [ub bulk]).
        * ``fp8_buf`` -> ``fp8``.
        * ``atomic_gemm``: only ``False`` (overlap has no atomic GEMM).
        * ``num_sm``, ``cga_size``, ``set_sm_margin``, ``num_splits``, ``use_ce``,
          ``aggregate``, ``pipeline_rs_overlap_first_gemm``: tune TE's SM-based
          communication kernels and have no equivalent (overlap's all-gather runs on the copy
          engines and its chunks are one per rank): one ``UserWarning`` names those given.
        * any other key, or an unknown GEMM name: :class:`ConfigError`.
        """
        if not isinstance(te_cfgs, Mapping):
            raise ConfigError(f"ub_cfgs: expected a dict, got {type(te_cfgs).__name__}")
        gemms: dict[str, GemmOverlapConfig] = {}
        ignored: dict[str, list[str]] = {}
        for name, entry in te_cfgs.items():
            _check_name(name)
            if not isinstance(entry, Mapping):
                raise ConfigError(f"ub_cfgs[{name!r}]: expected a dict, got {entry!r}")
            unknown = set(entry) - _TE_KEYS - _TE_NO_EQUIVALENT
            if unknown:
                raise ConfigError(
                    f"ub_cfgs[{name!r}]: unknown keys {sorted(unknown)}; known: "
                    f"{sorted(_TE_KEYS | _TE_NO_EQUIVALENT)}"
                )
            if entry.get("atomic_gemm", False):
                raise ConfigError(
                    f"ub_cfgs[{name!r}].atomic_gemm: True is not supported (overlap has no "
                    "atomic GEMM); allowed: False"
                )
            given = sorted(set(entry) & _TE_NO_EQUIVALENT)
            if given:
                ignored[name] = given
            method = _te_method(name, entry.get("method"))
            fp8 = entry.get("fp8_buf", False)
            if not isinstance(fp8, bool):
                raise ConfigError(f"ub_cfgs[{name!r}].fp8_buf: {fp8!r} must be True or False")
            gemms[name] = GemmOverlapConfig(method=method, fp8=fp8)
        if ignored:
            _warn(
                f"ub_cfgs keys without an equivalent in overlap (its all-gather uses the copy "
                f"engines, not SMs), not applied: {ignored}"
            )
        return cls(tokens=tokens, hidden=hidden, gemms=gemms, **kwargs)


_TE_KEYS = frozenset({"method", "fp8_buf", "atomic_gemm"})
_TE_NO_EQUIVALENT = frozenset(
    {
        "num_sm",
        "cga_size",
        "set_sm_margin",
        "num_splits",
        "use_ce",
        "aggregate",
        "pipeline_rs_overlap_first_gemm",
    }
)


def _warn(message: str) -> None:
    """A UserWarning attributed to the first caller outside this module (from_te_dict and
    initialize_ub both convert TE dicts)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _te_method(name: str, method: object) -> OverlapMethod | None:
    if method is None:
        return None
    direction = _direction(name)
    if method == "bulk":
        return OverlapMethod.BULK_RS if direction is None else OverlapMethod.BULK_AG
    if method in ("ring_exchange", "pipeline") and direction is not None:
        if method == "pipeline" and direction is OverlapMethod.RING_AG:
            raise ConfigError(
                f"ub_cfgs[{name!r}].method: 'pipeline' is a reduce-scatter overlap and "
                f"{name} all-gathers; allowed: ['ring_exchange', 'bulk']"
            )
        if method == "ring_exchange" and direction is OverlapMethod.PIPELINE_RS:
            return OverlapMethod.RING_RS
        return direction
    allowed = ["bulk"] if direction is None else ["ring_exchange", "pipeline", "bulk"]
    raise ConfigError(f"ub_cfgs[{name!r}].method: {method!r} is not one of {allowed}")


# ---- the handle ------------------------------------------------------------------------------


def _check_tp(config: UbConfig, tp: int) -> None:
    """What the ops need of the TP size: the tokens split evenly over the ranks; and a config
    whose defaults were chosen for a TP size was chosen for this one."""
    if config.tp is not None and config.tp != tp:
        raise ConfigError(
            f"UbConfig.tp: the config was made for TP size {config.tp} but the group has {tp} "
            "ranks (leave tp=None, or make it for this group)"
        )
    if config.tokens % tp:
        raise ConfigError(
            f"UbConfig.tokens: {config.tokens} is not divisible by the TP size {tp} "
            "(sequence parallelism splits the tokens evenly; pad them)"
        )


@dataclasses.dataclass(frozen=True)
class _BufferUse:
    """One shared buffer and the GEMM names that run on it."""

    kind: OverlapMethod
    dtype: str
    put_split: int
    nbytes: int
    allocated: int  # SymmetricBuffer.allocated_bytes: nbytes, or more (cuda rounds to 2 MiB)
    names: tuple[str, ...]


class Userbuffers:
    """The overlap ops of one TP group, built by :func:`initialize_ub`.

    Attributes:
        config: the validated :class:`UbConfig`.
        comm: the TP group's :class:`~overlap.comm.Communicator`.
        tp: the TP size.
    """

    def __init__(self, config: UbConfig, comm: Communicator) -> None:
        """COLLECTIVE over ``comm``'s group: create the shared buffers and the op objects.
        Takes ownership of ``comm`` (:meth:`destroy` destroys it)."""
        import torch

        self.config = config
        self.comm = comm
        self.tp = comm.group.size
        try:
            _check_tp(config, self.tp)
        except ConfigError:
            comm.destroy()
            raise
        # A config made for any TP size (tp None) gets this group's TP-dependent defaults
        # (NOTE [bulk_rs defaults]); its methods stay as it chose them.
        resolved = config if config.tp is not None else dataclasses.replace(config, tp=self.tp)
        self._gemms: Mapping[str, GemmOverlapConfig] = resolved.gemms
        dtype = getattr(torch, config.dtype)
        fp8_dtype = getattr(torch, config.fp8_dtype)
        self._ops: dict[str, UbOp] = {}
        self._uses: list[_BufferUse] = []
        groups: dict[tuple[OverlapMethod, str, int], list[str]] = {}
        for name, cfg in self._gemms.items():
            if not cfg.method.overlapped:  # type: ignore[union-attr]
                continue
            ag = cfg.method in (OverlapMethod.RING_AG, OverlapMethod.BULK_AG)
            buf_dtype = fp8_dtype if (ag and cfg.fp8) else dtype
            gemm_rs = cfg.method in _GEMM_RS
            split = 1 if gemm_rs else cfg.put_split
            kind = OverlapMethod.PIPELINE_RS if gemm_rs else cfg.method  # one GEMM+RS buffer
            key = (kind, str(buf_dtype).removeprefix("torch."), split)
            groups.setdefault(key, []).append(name)  # type: ignore[arg-type]
        try:
            for (kind, dtype_name, split), names in groups.items():
                buf_dtype = getattr(torch, dtype_name)
                nbytes = max(self._buffer_bytes(name, buf_dtype) for name in names)
                buffer = comm.create_buffer(nbytes, f"ub_{kind.value}_{dtype_name}_{split}")
                if kind is not OverlapMethod.PIPELINE_RS:
                    buffer.put_split = split
                use = _BufferUse(
                    kind, dtype_name, split, nbytes, buffer.allocated_bytes, tuple(names)
                )
                self._uses.append(use)
                for name in names:
                    self._ops[name] = self._make_op(name, buffer, buf_dtype)
        except BaseException:
            comm.destroy()
            raise
        self._destroyed = False

    def _buffer_bytes(self, name: str, buf_dtype: torch.dtype) -> int:
        """Bytes the op of ``name`` needs of its buffer (a GEMM+RS buffer is sized for the
        larger of its methods' needs, NOTE [gemm_rs_ring layout])."""
        method = self._gemms[name].method
        args = (self.tp, self.config.tokens, self.config.hidden, buf_dtype)
        if method is OverlapMethod.RING_RS:
            return _op_class(method).buffer_bytes(*args, method="ring")  # type: ignore[call-arg]
        return _op_class(method).buffer_bytes(*args)  # type: ignore[arg-type]

    def _make_op(self, name: str, buffer: SymmetricBuffer, buf_dtype: torch.dtype) -> UbOp:
        cfg = self._gemms[name]
        op_cls = _op_class(cfg.method)  # type: ignore[arg-type]
        args = (self.comm, self.config.tokens, self.config.hidden, buf_dtype)
        if cfg.method is OverlapMethod.RING_AG:
            return op_cls(
                *args,
                compute_lanes=cfg.lanes,
                staggered_puts=cfg.staggered_puts,
                pieces=cfg.piece_count,
                pull_shards=cfg.pulls,
                keep_gathered=cfg.keeps_gathered,
                name=name,
                buffer=buffer,
            )
        if cfg.method in _GEMM_RS:
            return op_cls(
                *args,
                compute_lanes=cfg.lanes,
                reduce_max_blocks=cfg.max_blocks,
                method="ring" if cfg.method is OverlapMethod.RING_RS else "pipelined",
                ring_subchunks=cfg.ring_subchunks,
                pieces=cfg.piece_count if cfg.method is OverlapMethod.PIPELINE_RS else 1,
                pull_shards=cfg.pulls and cfg.method is OverlapMethod.RING_RS,
                name=name,
                buffer=buffer,
            )
        if cfg.method is OverlapMethod.BULK_RS:
            return op_cls(
                *args,
                reduce_max_blocks=cfg.max_blocks,
                gemm_sm_margin=cfg.sm_margin,
                pieces=cfg.piece_count,
                name=name,
                buffer=buffer,
            )
        return op_cls(*args, name=name, buffer=buffer)

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def total_bytes(self) -> int:
        """Bytes of memory this rank holds for its symmetric buffers (the same on every rank):
        their sizes, each rounded up as the transport allocates it (cuda: to 2 MiB, NOTE
        [allocation granularity] in ``csrc/comm/cuda/cuda_memory.h``)."""
        return sum(u.allocated for u in self._uses)

    def is_overlapped(self, name: str) -> bool:
        """Whether ``name`` has an overlap op (False for the ``NONE`` method)."""
        _check_name(name)
        return name in self._ops

    def method(self, name: str) -> OverlapMethod:
        """The method GEMM ``name`` runs (``NONE`` when it is not overlapped)."""
        _check_name(name)
        return self._gemms[name].method  # type: ignore[return-value]

    def fp8(self, name: str) -> bool:
        """Whether GEMM ``name``'s op was built for FP8 inputs (its buffer sized for FP8
        shards)."""
        _check_name(name)
        return bool(self._gemms[name].fp8)

    def get(self, name: str) -> UbOp:
        """The op object of GEMM ``name`` (``"qkv_fprop"``...): an
        :class:`~overlap.ops.AllGatherGemm` (``RING_AG``), a
        :class:`~overlap.ops.GemmReduceScatter` (``PIPELINE_RS``, ``RING_RS``), an
        :class:`~overlap.ops.AllGatherBesideGemm` (``BULK_AG``) or a
        :class:`~overlap.ops.ReduceScatterBesideGemm` (``BULK_RS``).

        Raises:
            StateError: after :meth:`destroy`.
            ConfigError: an unknown name (the message lists the valid ones), or a name whose
                method is ``NONE``.
        """
        if self._destroyed:
            raise StateError(f"userbuffers: get({name!r}) after destroy")
        _check_name(name)
        if name not in self._ops:
            raise ConfigError(
                f"userbuffers: {name} is not overlapped (method none): run its GEMM (and "
                "collective, if any) separately"
            )
        return self._ops[name]

    def describe(self) -> str:
        """A table of every GEMM name's method, buffer and settings
        (:attr:`GemmOverlapConfig.settings`), then the buffers and the total bytes per rank."""
        buffer_of = {n: i for i, u in enumerate(self._uses) for n in u.names}
        lines = [
            f"userbuffers: tp={self.tp} tokens={self.config.tokens} hidden={self.config.hidden} "
            f"dtype={self.config.dtype} transport={self.comm.transport.value}",
            f"{'gemm':<11} {'method':<12} {'fp8':<5} {'lanes':<5} {'buffer':<14} settings",
        ]
        for name, cfg in self._gemms.items():
            method = cfg.method.value  # type: ignore[union-attr]
            if name in buffer_of:
                where = f"#{buffer_of[name]}"
                lanes = "-" if cfg.method.bulk else str(cfg.lanes)  # type: ignore[union-attr]
            else:
                where, lanes = "not overlapped", "-"
            settings = cfg.settings if name in buffer_of else "-"
            lines.append(
                f"{name:<11} {method:<12} {cfg.fp8!s:<5} {lanes:<5} {where:<14} {settings}"
            )
        for i, u in enumerate(self._uses):
            lines.append(
                f"buffer #{i}: {u.kind.value} {u.dtype} put_split={u.put_split} "
                f"{u.nbytes} bytes ({u.allocated} allocated), shared by {', '.join(u.names)}"
            )
        lines.append(f"total: {self.total_bytes} bytes per rank")
        return "\n".join(lines)

    def destroy(self) -> None:
        """Free every buffer and the communicator. Idempotent; not collective."""
        if self._destroyed:
            return
        self._destroyed = True
        self._ops.clear()
        self.comm.destroy()

    def __enter__(self) -> Userbuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _op_class(method: OverlapMethod) -> type[UbOp]:
    """The op class of an overlapped method."""
    from overlap.ops import (
        AllGatherBesideGemm,
        AllGatherGemm,
        GemmReduceScatter,
        ReduceScatterBesideGemm,
    )

    return {
        OverlapMethod.RING_AG: AllGatherGemm,
        OverlapMethod.PIPELINE_RS: GemmReduceScatter,
        OverlapMethod.RING_RS: GemmReduceScatter,
        OverlapMethod.BULK_AG: AllGatherBesideGemm,
        OverlapMethod.BULK_RS: ReduceScatterBesideGemm,
    }[method]


# ---- TP group resolution and the default registry --------------------------------------------


def _bootstrap(tp_group: Any, mesh_dim: int | str | None) -> Bootstrap:
    """A Bootstrap for a Bootstrap, a torch ProcessGroup, a DeviceMesh (dimension
    ``mesh_dim``), or an mpi4py communicator."""
    from overlap.comm import Bootstrap, MPIBootstrap, TorchBootstrap

    if isinstance(tp_group, Bootstrap):
        return tp_group
    if hasattr(tp_group, "get_group") and hasattr(tp_group, "mesh"):  # DeviceMesh
        if mesh_dim is None and tp_group.ndim != 1:
            raise ConfigError(
                f"tp_group: a {tp_group.ndim}-D DeviceMesh needs mesh_dim= (its TP dimension; "
                f"names: {tp_group.mesh_dim_names})"
            )
        return TorchBootstrap(tp_group.get_group(mesh_dim if mesh_dim is not None else 0))
    if mesh_dim is not None:
        raise ConfigError("mesh_dim= is only meaningful with a DeviceMesh tp_group")
    if hasattr(tp_group, "Get_rank") and hasattr(tp_group, "Split"):  # mpi4py
        return MPIBootstrap(tp_group)
    try:
        import torch.distributed as dist

        if isinstance(tp_group, dist.ProcessGroup):
            return TorchBootstrap(tp_group)
    except ImportError:
        pass
    raise ConfigError(
        f"tp_group: {type(tp_group).__name__} is not a torch ProcessGroup, a DeviceMesh, an "
        "mpi4py communicator or an overlap.comm.Bootstrap"
    )


# The default registry: at most one handle, under the key "default".
_REGISTRY: dict[str, Userbuffers] = {}


def initialize_ub(
    shape: tuple[int, int],
    tp_group: Any,
    dtype: Any = "bfloat16",
    *,
    use_fp8: bool = False,
    fp8_dtype: Any = "float8_e4m3fn",
    ub_cfgs: UbConfig | Mapping[str, Any] | None = None,
    transport: str | None = None,
    timeout_s: float | None = None,
    device: int | None = None,
    mesh_dim: int | str | None = None,
    register: bool = True,
) -> Userbuffers:
    """COLLECTIVE over the TP group: build the userbuffers of a transformer layer.

    Args:
        shape: ``(tokens, hidden)``: the global ``[T, H]`` of the largest call (``T``
            divisible by the TP size).
        tp_group: the TP group: a torch ProcessGroup, a DeviceMesh (with ``mesh_dim`` unless
            1-D), an mpi4py communicator or an :class:`overlap.comm.Bootstrap`.
        dtype: the activations' dtype (torch dtype or its name).
        use_fp8: every overlapped GEMM without its own entry in ``ub_cfgs`` takes FP8 inputs.
        fp8_dtype: the FP8 dtype of FP8 inputs.
        ub_cfgs: per-GEMM settings: a ``{name: GemmOverlapConfig}`` dict, a TE-style dict
            (converted by :meth:`UbConfig.from_te_dict`), or a whole :class:`UbConfig` (then
            ``shape``, ``dtype``, ``use_fp8``, ``fp8_dtype`` and ``timeout_s`` must match it or
            be left at their defaults).
        transport: ``"cuda"`` (default when a CUDA device and overlap's CUDA build are
            available) or ``"host"``.
        timeout_s: deadline of every wait (default ``OVERLAP_TIMEOUT_S``).
        device: this rank's CUDA device (cuda; default torch's current device).
        mesh_dim: the TP dimension of a DeviceMesh ``tp_group``.
        register: make the handle the default one of :func:`get_ub` / :func:`destroy_ub`.

    Returns:
        the :class:`Userbuffers` handle.

    Raises:
        ConfigError: an invalid configuration, on every rank before anything collective.
        StateError: ``register`` and a default handle already exists (call
            :func:`destroy_ub` first).
    """
    if register and _REGISTRY:
        raise StateError("initialize_ub: already initialised; call destroy_ub() first")
    bootstrap = _bootstrap(tp_group, mesh_dim)
    config = _make_config(
        shape,
        dtype=dtype,
        use_fp8=use_fp8,
        fp8_dtype=fp8_dtype,
        ub_cfgs=ub_cfgs,
        timeout_s=timeout_s,
        tp=bootstrap.size,
    )
    from overlap.comm import Communicator

    if transport is None:
        transport = "cuda" if _cuda_usable() else "host"
    _check_tp(config, bootstrap.size)  # before anything collective
    comm = Communicator(bootstrap, transport, timeout_s=config.timeout_s, device=device)
    handle = Userbuffers(config, comm)
    if register:
        _REGISTRY["default"] = handle
    return handle


def _cuda_usable() -> bool:
    from overlap._native import cuda_available

    try:
        import torch
    except ImportError:
        return False
    return bool(cuda_available() and torch.cuda.is_available())


def _make_config(
    shape: tuple[int, int],
    *,
    dtype: Any,
    use_fp8: bool,
    fp8_dtype: Any,
    ub_cfgs: UbConfig | Mapping[str, Any] | None,
    timeout_s: float | None,
    tp: int,
) -> UbConfig:
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2):
        raise ConfigError(f"shape: {shape!r} must be (tokens, hidden)")
    tokens, hidden = shape
    if isinstance(ub_cfgs, UbConfig):
        given = UbConfig(tokens, hidden, dtype, fp8_dtype, timeout_s)
        for field in ("tokens", "hidden", "dtype", "fp8_dtype", "timeout_s"):
            ours, theirs = getattr(ub_cfgs, field), getattr(given, field)
            default = {"dtype": "bfloat16", "fp8_dtype": "float8_e4m3fn", "timeout_s": None}
            if theirs != ours and (field not in default or theirs != default[field]):
                raise ConfigError(
                    f"initialize_ub: {field}={theirs!r} contradicts ub_cfgs.{field}={ours!r}"
                )
        if use_fp8:
            raise ConfigError("initialize_ub: use_fp8 with a UbConfig: set fp8 per GEMM in it")
        return ub_cfgs
    if not isinstance(use_fp8, bool):
        raise ConfigError(f"use_fp8: {use_fp8!r} must be True or False")
    entries = dict(ub_cfgs or {})
    if entries and not all(isinstance(v, GemmOverlapConfig) for v in entries.values()):
        base = UbConfig.from_te_dict(
            entries, tokens=tokens, hidden=hidden, dtype=dtype, fp8_dtype=fp8_dtype, tp=tp
        )
        entries = {n: base.gemms[n] for n in entries}
    gemms = {n: entries.get(n, GemmOverlapConfig(fp8=use_fp8)) for n in GEMM_NAMES}
    return UbConfig(tokens, hidden, dtype, fp8_dtype, timeout_s, gemms, tp)


def _default() -> Userbuffers:
    if not _REGISTRY:
        raise StateError("userbuffers are not initialised: call initialize_ub() first")
    return _REGISTRY["default"]


def get_ub(name: str) -> UbOp:
    """The default handle's op of GEMM ``name`` (:meth:`Userbuffers.get`).

    Raises:
        StateError: before :func:`initialize_ub` or after :func:`destroy_ub`.
    """
    return _default().get(name)


def destroy_ub() -> None:
    """Destroy the default handle (if any) and clear the registry. Idempotent."""
    handle = _REGISTRY.pop("default", None)
    if handle is not None:
        handle.destroy()

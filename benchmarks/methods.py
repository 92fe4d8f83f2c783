"""The methods the overlap benchmark times (:mod:`benchmarks.overlap_ops`): a small registry.

A *variant* is a named builder plus its keyword arguments. For each row of the suite, every
registered variant of the row's op that applies to it is built (collectively, on every rank
of the TP group), then all of them are timed in turn, in passes (NOTE [timing passes] in
common.py), then released; the JSON keeps the time of every variant and the table shows
the best one with its name (``method/kwargs``, e.g. ``pipeline/lanes2-split1``).

A builder gets a :class:`Case` (this rank's operands and the TP group's communicator) and its
kwargs, and returns a zero-argument callable that runs the op once on the case's operands,
writing into ``case.out``. Adding a method is a builder and one :func:`register` call, e.g.:

    def build_ring_rs(case: Case, *, lanes: int) -> Runner:
        op = case.keep(("ring", lanes), lambda: RingGemmRS(case.comm, case.m, case.n, ...))
        return lambda: op(case.a, case.w, out=case.out)

    register("gemm_rs", "ring", build_ring_rs, grid(lanes=(1, 2)))

``case.keep(key, make, destroy)`` builds an object once per row and shares it between the
variants that only differ by settings (one buffer per op object, not per variant); it is
destroyed when the row is done. NOTE [settings per call]: the variants sharing an object are
all built before any is timed, and timed in turn, so a runner applies its settings to the
shared object on every call, never once in the builder (whose settings the next builder
would overwrite). A builder that raises (on every rank, e.g. a
typed error for an unsupported dtype) makes that variant "n/a" with the reason; the sweep goes
on. ``--methods PATTERN[,PATTERN]`` (fnmatch on ``op:method/kwargs``) picks variants, and
``--import MODULE`` imports a module of more :func:`register` calls on every rank (methods
that live outside this file, e.g. in a branch under test).
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from overlap.comm import Communicator
from overlap.gemm import set_waiting_kernel
from overlap.ops import (
    AllGatherBesideGemm,
    AllGatherGemm,
    GemmReduceScatter,
    ReduceScatterBesideGemm,
)
from overlap.ops.bulk import bulk_rs_max_blocks
from overlap.quantization import QuantizedTensor
from overlap.ub import LAYERS, MethodConfig, OverlapMethod, UbConfig, plan_label

__all__ = [
    "BULK_OPS",
    "OPS",
    "Case",
    "Runner",
    "SideGemm",
    "Variant",
    "grid",
    "register",
    "registered",
    "select",
    "ub_default_variant",
    "ub_gemm_name",
]

OPS = ("ag_gemm", "gemm_rs", "bulk_ag", "bulk_rs")
BULK_OPS = ("bulk_ag", "bulk_rs")

Operand = torch.Tensor | QuantizedTensor
Runner = Callable[[], object]


@dataclass(frozen=True)
class SideGemm:
    """The GEMM a bulk op runs beside its collective: ``out = a @ b.T`` (TN, like a linear
    layer's; FP8 operands as per-tensor :class:`QuantizedTensor` s).

    Attributes:
        a: ``[m', k']``.
        b: ``[n', k']``.
        out: the preallocated bfloat16 ``[m', n']`` output.
    """

    a: Operand
    b: Operand
    out: torch.Tensor


@dataclass
class Case:
    """One row of the suite on this rank: what a builder gets.

    Attributes:
        op: ``"ag_gemm"`` (``Y[M, N] = AllGather(a)[M, K] @ w.T``), ``"gemm_rs"``
            (``out[M / tp, N] = ReduceScatter(a[M, K] @ w.T)``), ``"bulk_ag"`` (gather ``a``
            while ``side`` runs: the backward's dgrad beside the gather of wgrad's input) or
            ``"bulk_rs"`` (``out = ReduceScatter(a)`` while ``side`` runs: the backward's
            wgrad beside the reduce-scatter of dgrad's partial sums).
        comm: the TP group's communicator (``comm.group.size`` is the TP size).
        m: ``M``, the gathered rows (AG+GEMM, bulk_ag) / the rows of ``a`` (GEMM+RS, bulk_rs).
        k: ``K`` of this rank's GEMM (AG+GEMM: hidden; GEMM+RS: the local K shard); bulk: the
            collective's columns (hidden).
        n: ``N`` of this rank's GEMM (AG+GEMM: the local N shard; GEMM+RS: hidden); bulk: the
            layer's local N shard (``side`` is ``[M, n] @ [k, n].T`` for bulk_ag, ``[n, M] @
            [k, M].T`` for bulk_rs).
        a: AG+GEMM and bulk_ag: this rank's shard ``[M / tp, K]``; GEMM+RS: ``[M, K]``.
            bfloat16, or a per-tensor FP8 :class:`QuantizedTensor` (AG shards share one scale
            over the group). bulk_rs: the bfloat16 partial sums ``[M, K]``.
        w: the weight ``[N, K]``, of the same kind as ``a``; None for bulk ops.
        out: the preallocated bfloat16 output: ``[M, N]`` (AG+GEMM), ``[M / tp, N]`` (GEMM+RS),
            ``[M / tp, K]`` (bulk_rs); None for bulk_ag (the gathered input stays in the
            op's buffer).
        fp8: whether the GEMM operands (and bulk_ag's shard) are FP8.
        cuda: the cuda transport (else the host transport with tiny shapes).
        group: the TP group as a ``torch.distributed`` ProcessGroup (nccl on GPUs, gloo on
            the host), in the same rank order as ``comm``: for methods built on torch.
        side: bulk ops: the GEMM beside the collective; None otherwise.
    """

    op: str
    comm: Communicator
    m: int
    k: int
    n: int
    a: Operand
    w: Operand | None
    out: torch.Tensor | None
    fp8: bool
    cuda: bool
    group: Any = None
    side: SideGemm | None = None
    _kept: dict[Any, tuple[Any, Callable[[Any], None] | None]] = field(default_factory=dict)

    @property
    def tp(self) -> int:
        return self.comm.group.size

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype ``a`` travels in (an FP8 dtype for FP8 rows)."""
        return self.a.rowwise_data.dtype if isinstance(self.a, QuantizedTensor) else self.a.dtype

    def keep(
        self, key: Any, make: Callable[[], Any], destroy: Callable[[Any], None] | None = None
    ) -> Any:
        """``make()`` once per row and ``key`` (COLLECTIVE when ``make`` is); ``destroy(obj)``
        (default: ``obj.destroy()`` when it has one) runs when the row is done."""
        if key not in self._kept:
            obj = make()
            if destroy is None and callable(getattr(obj, "destroy", None)):
                destroy = type(obj).destroy
            self._kept[key] = (obj, destroy)
        return self._kept[key][0]

    def release(self) -> None:
        """Destroy what :meth:`keep` built, newest first."""
        while self._kept:
            _, (obj, destroy) = self._kept.popitem()
            if destroy is not None:
                destroy(obj)


@dataclass(frozen=True)
class Variant:
    """A named way to run one op: ``build(case, **kwargs)`` returns a :data:`Runner`.

    ``when(case, kwargs)`` says whether it applies to a row (default: always); e.g. settings
    that only mean something on the cuda transport."""

    op: str
    method: str
    kwargs: Mapping[str, Any]
    build: Callable[..., Runner]
    when: Callable[[Case, Mapping[str, Any]], bool] | None = None

    @property
    def name(self) -> str:
        """``method/kwargs``: ``pipeline/lanes2-split1-staggered`` (True flags by name, False
        flags left out), or the bare method without kwargs."""
        parts = []
        for key, value in self.kwargs.items():
            if value is True:
                parts.append(key)
            elif value is not False:
                parts.append(f"{key}{value}")
        return f"{self.method}/{'-'.join(parts)}" if parts else self.method

    @property
    def full_name(self) -> str:
        return f"{self.op}:{self.name}"

    def applies(self, case: Case) -> bool:
        return case.op == self.op and (self.when is None or bool(self.when(case, self.kwargs)))

    def make(self, case: Case) -> Runner:
        return self.build(case, **self.kwargs)


_REGISTRY: list[Variant] = []


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the given kwargs: ``grid(lanes=(1, 2), split=(1,))``."""
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]


def register(
    op: str,
    method: str,
    build: Callable[..., Runner],
    variants: Iterable[Mapping[str, Any]] = ({},),
    *,
    when: Callable[[Case, Mapping[str, Any]], bool] | None = None,
) -> list[Variant]:
    """Add ``method``'s variants (one per kwargs mapping) for ``op``; returns them.

    Raises:
        ValueError: unknown op, or a variant name that is already registered.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops: {OPS}")
    added = [Variant(op, method, dict(kw), build, when) for kw in variants]
    taken = {v.full_name for v in _REGISTRY}
    for v in added:
        if v.full_name in taken:
            raise ValueError(f"variant {v.full_name} is already registered")
        taken.add(v.full_name)
    _REGISTRY.extend(added)
    return added


def unregister(variants: Iterable[Variant]) -> None:
    """Remove ``variants`` (as returned by :func:`register`)."""
    gone = {id(v) for v in variants}
    _REGISTRY[:] = [v for v in _REGISTRY if id(v) not in gone]


def registered() -> list[Variant]:
    """All variants, in registration order."""
    return list(_REGISTRY)


def select(patterns: Sequence[str] = ()) -> list[Variant]:
    """The variants whose ``op:method/kwargs`` matches one of the fnmatch ``patterns`` (a
    pattern without ``:`` matches ``method/kwargs`` of either op); all without patterns.

    Raises:
        ValueError: a pattern matches no variant (a typo would silently time nothing).
    """
    if not patterns:
        return registered()
    chosen = []
    for p in patterns:
        hits = [v for v in _REGISTRY if fnmatch.fnmatchcase(v.full_name if ":" in p else v.name, p)]
        if not hits:
            names = ", ".join(v.full_name for v in _REGISTRY)
            raise ValueError(f"--methods pattern {p!r} matches no variant; variants: {names}")
        chosen += [v for v in hits if v not in chosen]
    return [v for v in _REGISTRY if v in chosen]  # registration order


# --- built-in methods ------------------------------------------------------------------------


def _cuda_setting(case: Case, kwargs: Mapping[str, Any]) -> bool:
    """Copies per peer (``put_split`` > 1) only exist on the cuda transport's copy engines."""
    return case.cuda or kwargs.get("split", 1) == 1


def _serial_differs(case: Case, kwargs: Mapping[str, Any]) -> bool:
    """Serial puts (one peer after another) and puts to all peers at once are one schedule
    with a single peer: at TP 2 only the serial variant runs."""
    return kwargs.get("serial", True) or case.comm.group.size > 2


def _bulk_rs_setting(case: Case, kwargs: Mapping[str, Any]) -> bool:
    """As :func:`_serial_differs`; the GEMM's SM margin only exists on cuda (the host runs
    margin 0 only)."""
    return _serial_differs(case, kwargs) and (case.cuda or kwargs.get("margin", 0) == 0)


def _ag_pipeline(
    case: Case, *, lanes: int, split: int, staggered: bool, pieces: int = 1, pull: bool = False
) -> Runner:
    """:class:`~overlap.ops.AllGatherGemm`: one op object per lane count; copies per peer
    (``put_split``), staggered pushes, pieces per peer shard and pulls are settings, applied by
    every call (NOTE [settings per call])."""
    op = case.keep(
        ("ag_pipeline", lanes),
        lambda: AllGatherGemm(case.comm, case.m, case.k, case.input_dtype, compute_lanes=lanes),
    )

    def run() -> object:
        op.buffer.put_split = split
        op.staggered_puts = staggered
        op.pieces = pieces
        op.pull_shards = pull
        return op(case.a, case.w, out=case.out)

    return run


def _rs_pipeline(case: Case, *, lanes: int, split: int, pieces: int = 1) -> Runner:
    """:class:`~overlap.ops.GemmReduceScatter`, one op object per lane count (``put_split``
    and pieces applied by every call, as for AG+GEMM)."""
    op = case.keep(
        ("rs_pipeline", lanes),
        lambda: GemmReduceScatter(case.comm, case.m, case.n, torch.bfloat16, compute_lanes=lanes),
    )

    def run() -> object:
        op.buffer.put_split = split
        op.pieces = pieces
        return op(case.a, case.w, out=case.out)

    return run


register(
    "ag_gemm",
    "pipeline",
    _ag_pipeline,
    grid(lanes=(1, 2), split=(1, 2), staggered=(False, True)),
    when=_cuda_setting,
)
# Pieces (NOTE [ag_gemm pieces]) for the comm-bound shapes: with staggered pushes only, whose
# first peer shard lands soonest.
register(
    "ag_gemm",
    "pipeline",
    _ag_pipeline,
    grid(lanes=(1, 2), split=(1,), staggered=(True,), pieces=(2, 4)),
)


# Pulls after device-side handshakes (NOTE [ag_gemm pulls], NOTE [handshakes]).
def _ag_pull(case: Case, *, lanes: int, pieces: int = 1) -> Runner:
    """:class:`~overlap.ops.AllGatherGemm` with ``pull_shards`` (NOTE [ag_gemm pulls]), on the
    pipeline variants' op object (put_split and staggered pushes do not apply); each peer's
    shard in ``pieces`` consecutive pulls, each followed by its GEMMs."""
    return _ag_pipeline(case, lanes=lanes, split=1, staggered=True, pieces=pieces, pull=True)


register("ag_gemm", "pull", _ag_pull, grid(lanes=(1, 2)))
# Pieces: the last chunk's GEMM, which follows the last pull, is then half as long.
register("ag_gemm", "pull", _ag_pull, grid(lanes=(1, 2), pieces=(2,)))


def _ag_fused(case: Case, *, pieces: int = 1, kernel: str = "") -> Runner:
    """:class:`~overlap.ops.AllGatherGemm` with ``fused_gemm`` (NOTE [fused ag_gemm]): the pulls
    and ONE waiting GEMM (its own op object: the setting is the op's). ``kernel``: the waiting
    kernel's override around each call (:func:`overlap.gemm.set_waiting_kernel`; "" measured,
    "untuned" the rule the measured choice replaced, NOTE [waiting gemm choice])."""
    op = case.keep(
        ("ag_fused",),
        lambda: AllGatherGemm(
            case.comm, case.m, case.k, case.input_dtype, pull_shards=True, fused_gemm=True
        ),
    )

    def run() -> object:
        op.pieces = pieces
        return op(case.a, case.w, out=case.out)

    if not kernel:
        return run

    def forced() -> object:
        previous = set_waiting_kernel(kernel)
        try:
            return run()
        finally:
            set_waiting_kernel(previous)

    return forced


def _fused_runs(case: Case, kwargs: Mapping[str, Any]) -> bool:
    """The waiting GEMM multiplies bfloat16 (NOTE [waiting gemm]); on cuda, builds with it."""
    from overlap._native import native

    built = not case.cuda or bool(native().gemm.waiting_gemm_built())
    return not case.fp8 and built


register("ag_gemm", "fused", _ag_fused, grid(pieces=(1, 2)), when=_fused_runs)
# The untuned kernel rule, for the A/B of NOTE [waiting gemm choice].
register("ag_gemm", "fused", _ag_fused, grid(pieces=(1,), kernel=("untuned",)), when=_fused_runs)
register("gemm_rs", "pipeline", _rs_pipeline, grid(lanes=(1, 2), split=(1, 2)), when=_cuda_setting)
# Pieces (NOTE [gemm_rs pieces]) for the comm-bound shapes: two, whose reductions run beside
# the GEMMs of the second round (4 pieces, and a bounded reduction grid, measured slower on
# every row on 4xH200).
register("gemm_rs", "pipeline", _rs_pipeline, grid(lanes=(1, 2), split=(1,), pieces=(2,)))


def _rs_ring(case: Case, *, lanes: int, subchunks: int, pull: bool = False) -> Runner:
    """:class:`~overlap.ops.GemmReduceScatter` with ``method="ring"``: running sums travel the
    ring and are added by the GEMMs' beta = 1 epilogue (NOTE in ``gemm_rs_ring.cpp``), pushed
    on or pulled by the next rank (``pull_shards``, a setting: NOTE [gemm_rs_ring pulls])."""
    op = case.keep(
        ("rs_ring", lanes, subchunks),
        lambda: GemmReduceScatter(
            case.comm,
            case.m,
            case.n,
            torch.bfloat16,
            compute_lanes=lanes,
            method="ring",
            ring_subchunks=subchunks,
        ),
    )

    def run() -> object:
        op.pull_shards = pull
        return op(case.a, case.w, out=case.out)

    return run


register("gemm_rs", "ring", _rs_ring, grid(lanes=(1, 2), subchunks=(2, 4), pull=(False, True)))


def _bulk_ag(case: Case, *, serial: bool) -> Runner:
    """:class:`~overlap.ops.AllGatherBesideGemm`: the shard gathered by copy engines while the
    side GEMM runs; serial puts (peers one after another) or all peers at once, a setting."""
    op = case.keep(
        ("bulk_ag",), lambda: AllGatherBesideGemm(case.comm, case.m, case.k, case.input_dtype)
    )
    side = case.side

    def run() -> object:
        op.buffer.serial_puts = serial
        return op(case.a, side.a, side.b, out=side.out, transb=True)

    return run


def _bulk_rs(case: Case, *, serial: bool, margin: int, pieces: int = 1) -> Runner:
    """:class:`~overlap.ops.ReduceScatterBesideGemm`: partial sums pushed by copy engines and
    reduced by a bounded kernel (64 blocks) while the side GEMM runs on the SMs it leaves
    (``gemm_sm_margin``), in ``pieces`` pieces each reduced once landed (NOTE [bulk_rs
    pieces]); serial puts, the margin and the pieces are settings."""
    op = case.keep(
        ("bulk_rs",),
        lambda: ReduceScatterBesideGemm(case.comm, case.m, case.k, torch.bfloat16),
    )
    side = case.side

    def run() -> object:
        op.buffer.serial_puts = serial
        op.gemm_sm_margin = margin
        op.pieces = pieces
        return op(case.a, side.a, side.b, out=case.out, gemm_out=side.out, transb=True)

    return run


register("bulk_ag", "bulk", _bulk_ag, grid(serial=(True, False)), when=_serial_differs)
register(
    "bulk_rs",
    "bulk",
    _bulk_rs,
    grid(serial=(True, False), margin=(0, 4, 8, 16), pieces=(1, 2, 4)),
    when=_bulk_rs_setting,
)


# --- what initialize_ub runs by default ------------------------------------------------------
#
# NOTE [default variant]: T_ours is the best of every registered variant of a row, which is
# what an expert who tunes the methods per GEMM gets; a user of initialize_ub() gets the
# default method of each GEMM name (overlap.ub.default_method and the core's defaults for
# the TP size). ub_default_variant() names the registered variant that
# runs exactly that configuration, so that the benchmark reports it beside the best one
# (T_default, default/floor). It is derived from UbConfig, never written down twice: a change
# of a default moves the column with it, and a default that no registered variant runs gives
# None (a unit test keeps every op's default registered).

_UB_PASS = {"ag_gemm": "fprop", "gemm_rs": "fprop", "bulk_ag": "dgrad", "bulk_rs": "wgrad"}


def ub_gemm_name(op: str, shape: str) -> str:
    """The standard GEMM name (``overlap.ub.GEMM_NAMES``) whose overlap a row of ``op`` on
    ``shape`` stands for: the AG+GEMM and GEMM+RS rows are the fprop of their layer, bulk_ag
    rows the dgrad and bulk_rs rows the wgrad (NOTE [ub bulk]); TE's shapes (``te8192``,
    ``te4096``) stand for qkv (AG+GEMM, bulk) or proj (GEMM+RS).

    Raises:
        ValueError: unknown op.
    """
    if op not in _UB_PASS:
        raise ValueError(f"unknown op {op!r}; ops: {OPS}")
    layer = shape if shape in LAYERS else ("proj" if op == "gemm_rs" else "qkv")
    return f"{layer}_{_UB_PASS[op]}"


_OP_METHODS = {
    "ag_gemm": (OverlapMethod.RING_AG,),
    "gemm_rs": (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS),
    "bulk_ag": (OverlapMethod.BULK_AG,),
    "bulk_rs": (OverlapMethod.BULK_RS,),
}


def _default_kwargs(op: str, cfg: MethodConfig) -> tuple[str, dict[str, Any]] | None:
    """(method, kwargs) of the variant of ``op`` that runs ``cfg`` (a :class:`UbConfig` entry:
    the config of its method, every knob concrete), as the registrations above give them;
    None when ``cfg`` is another op's method, or a setting the builders leave at the op's
    default."""
    m = cfg.method
    if m not in _OP_METHODS[op]:
        return None
    piece_count = getattr(cfg, "pieces", 1)
    pieces = {"pieces": piece_count} if piece_count > 1 else {}
    split = getattr(cfg, "put_split", 1)  # a GEMM+RS buffer keeps its own
    # what the builders leave at the op's default must be that default
    builders_express = {
        OverlapMethod.RING_AG: True,
        OverlapMethod.PIPELINE_RS: getattr(cfg, "reduce_max_blocks", 0) == 0,
        OverlapMethod.RING_RS: getattr(cfg, "reduce_max_blocks", 0) == 0,
        OverlapMethod.BULK_AG: split == 1,  # serial: the buffers' default
        OverlapMethod.BULK_RS: split == 1
        and getattr(cfg, "reduce_max_blocks", None) == bulk_rs_max_blocks(),
    }
    if not builders_express[m]:
        return None
    lanes = getattr(cfg, "compute_lanes", None)
    if m is OverlapMethod.RING_AG and cfg.fused_gemm:  # type: ignore[union-attr]
        found = "fused", {"pieces": piece_count}
    elif m is OverlapMethod.RING_AG and cfg.pull_shards:  # type: ignore[union-attr]
        found = "pull", {"lanes": lanes, **pieces}
    elif m is OverlapMethod.RING_AG:
        staggered = cfg.staggered_puts  # type: ignore[union-attr]
        found = "pipeline", {"lanes": lanes, "split": split, "staggered": staggered, **pieces}
    elif m is OverlapMethod.PIPELINE_RS:
        found = "pipeline", {"lanes": lanes, "split": split, **pieces}
    elif m is OverlapMethod.RING_RS:
        subchunks, pull = cfg.ring_subchunks, cfg.pull_shards  # type: ignore[union-attr]
        found = "ring", {"lanes": lanes, "subchunks": subchunks, "pull": pull}
    elif m is OverlapMethod.BULK_AG:
        found = "bulk", {"serial": True}
    else:  # BULK_RS
        margin = cfg.gemm_sm_margin  # type: ignore[union-attr]
        found = "bulk", {"serial": True, "margin": margin, "pieces": piece_count}
    return found


def ub_default_variant(op: str, shape: str, tp: int) -> str | None:
    """The name (``method/kwargs``) of the registered variant of ``op`` that runs what
    :func:`~overlap.initialize_ub` configures by default at TP size ``tp`` for the GEMM name
    :func:`ub_gemm_name` gives (NOTE [default variant]); None where no registered variant
    runs it."""
    return _variant_running(op, UbConfig(tokens=tp, hidden=1, tp=tp).gemms[ub_gemm_name(op, shape)])


def ub_alternate_variants(op: str, shape: str, tp: int) -> dict[str, str]:
    """The registered variants that run the alternate settings a measured shape plan times for
    the GEMM name of ``op`` and ``shape`` at TP size ``tp`` (NOTE [plan alternates] in
    overlap/ub/config.py), by the plan's label; alternates no registered variant runs are left
    out."""
    cfg = UbConfig(tokens=tp, hidden=1, tp=tp)
    found = {
        plan_label(alt): _variant_running(op, alt)
        for alt in cfg.alternates(ub_gemm_name(op, shape))
    }
    return {label: name for label, name in found.items() if name is not None}


def _variant_running(op: str, cfg: MethodConfig) -> str | None:
    """The name of the registered variant of ``op`` that runs ``cfg`` (None: none does)."""
    found = _default_kwargs(op, cfg)
    if found is None:
        return None
    match = [v for v in _REGISTRY if (v.op, v.method, dict(v.kwargs)) == (op, *found)]
    return match[0].name if match else None

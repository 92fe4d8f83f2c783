"""The userbuffers handle of a TP group: ``initialize_ub`` / ``get_ub`` / ``destroy_ub``.

:func:`initialize_ub` resolves the TP group (:func:`overlap.comm.groups.as_bootstrap`), builds
the :class:`~overlap.ub.UbConfig` (validated before anything collective happens), the group's
communicator, the symmetric buffers and the overlap op objects of the standard GEMM names.
Every buffer is sized by ``T`` and ``H`` alone (the other GEMM dimension, ``3H / tp`` or
``ffn / tp``, is the weight's and is given at call time), so the layer's FFN and QKV widths
are not part of the configuration.

NOTE [ub buffer sharing]: the ops of one kind (all AG+GEMMs, all GEMM+RSs) of a layer run one
after another, never concurrently, so they share one window per (kind, buffer dtype,
put_split): every AG+GEMM of a bf16 layer runs on one window, every GEMM+RS (pipelined or
ring, sized for the larger need) on another. Since NOTE [userbuffer memory] the windows of
all kinds are windows of ONE symmetric buffer, overlapping wherever their contents never
outlive one another's. A gathered input (``AllGatherGemm.gathered_input``) is therefore only
defined until the next op of any GEMM name of the handle; never save it for backward
(docs/design.md §3, invariant 2). Reading it later raises
:class:`~overlap.errors.StaleBufferError` (one generation for the buffer and all its windows,
NOTE [buffer generation]); it never returns another op's data.

NOTE [userbuffer memory]:
Invariant: the handle holds one symmetric buffer (one allocation per rank) of the largest step's
need, and every op runs on a window of it (NOTE [buffer windows] in
``csrc/comm/symmetric_buffer.h``) sized by what that op holds (its layout, ``buffer_bytes``: the
gathered ``[T, H]`` plus FP8 scale slots; GEMM+RS ``2 tp - 1`` partial slots pipelined, ``tp`` for
the ring; bulk RS ``tp - 1``: no slot for a rank's own rows). Windows of different kinds share
bytes, except a bulk all-gather's and a bulk reduce-scatter's, which are disjoint. Reason: in the
layers' schedule (docs/design.md §9.1) every communicating step is one custom op that reads what a
buffer keeps before the step ends (NOTE [layer custom ops]): column forward (AG+GEMM; the gathered
input dies with the op), row forward (GEMM+RS), row backward (AG+GEMM keeping dY, read by wgrad
right after, before any other op) and column backward, where the bulk all-gather's gathered input is
read by the wgrad GEMM that runs beside the bulk reduce-scatter: the one overlap of two kinds'
lifetimes. So the buffer needs max(bulk AG + bulk RS, GEMM+RS, AG+GEMM), a window sized for the
largest of its op and the op's alternate settings that a measured plan may run instead (NOTE [plan
alternates] in ``overlap/ub/config.py``: the GEMM+RS's two methods). With ``S = T * H * 2`` (a
gathered BF16 activation): BF16 ``max(S + S / 2, 3 S / 2) = 1.5 S`` at TP 2 (the ring's ``S``, the
pipelined alternate's ``3 S / 2``) and ``max(S + 3 S / 4, 7 S / 4) = 1.75 S`` at TP 4 (pipelined);
FP8 gathers ``S / 2`` (+ scale slots) beside BF16 partial sums: ``1.5 S`` at TP 2 (``S`` before the
alternates), ``1.75 S`` at TP 4. All are within ``2 S = 2 * T * H * 2``, against ``4 S`` to ``5 S``
with a buffer per kind. Safety: the windows share the root's op sequence, so buffer reuse stays safe
across kinds (invariant 8); one generation covers the buffer and all its windows, so a view kept
past any other op raises :class:`~overlap.errors.StaleBufferError` instead of reading overwritten
bytes; and a bulk op refuses a side GEMM operand inside its own window (NOTE [bulk independence]).
The cost: every op of the handle now follows every other in one op sequence, so an op that only
pushes (AG+GEMM) after one whose peers read this rank's region (GEMM+RS) waits for every
acknowledgement up front (NOTE [deferred acknowledgements]): the two share bytes, so that wait is
what makes the sharing safe. Nothing is left above the largest step's need but 256-byte alignment
and the cuda transport's 2 MiB rounding; less would need the largest step to hold less (FP8 partial
sums on the wire, a GEMM+RS that reduces in place).
Verdict: one allocation; windows share bytes across kinds except bulk AG / bulk RS.

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from overlap.comm.groups import as_bootstrap
from overlap.errors import ConfigError, StateError
from overlap.ub import te_dict
from overlap.ub.config import GEMM_ENTRIES, GemmOverlapConfig, MethodConfig, UbConfig, plan_label
from overlap.ub.names import GEMM_NAMES, GEMM_RS, OverlapMethod, check_name
from overlap.ub.plans import PlanPolicy, ShapePlans

if TYPE_CHECKING:
    import torch

    from overlap.comm import Communicator, SymmetricBuffer
    from overlap.ops import (
        AllGatherBesideGemm,
        AllGatherGemm,
        GemmReduceScatter,
        ReduceScatterBesideGemm,
    )

    UbOp = AllGatherGemm | GemmReduceScatter | AllGatherBesideGemm | ReduceScatterBesideGemm

__all__ = ["Userbuffers", "destroy_ub", "get_ub", "initialize_ub", "plan_buffer"]


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
    """One window of the handle's buffer and the GEMM names that run on it."""

    kind: OverlapMethod
    dtype: str
    put_split: int | None  # None in a plan: the buffer's default (GEMM+RS windows)
    offset: int  # of the window in the buffer (NOTE [userbuffer memory])
    nbytes: int
    names: tuple[str, ...]


# NOTE [userbuffer memory]: the pairs of kinds whose contents outlive one another's ops in the
# layers' schedule, so that their windows must not share bytes: a bulk all-gather's gathered
# input is read by the GEMM beside the next bulk reduce-scatter.
_DISJOINT_KINDS = frozenset({(OverlapMethod.BULK_AG, OverlapMethod.BULK_RS)})


def _kind_label(kind: OverlapMethod) -> str:
    """A window's kind as describe() names it: ``gemm_rs`` for either GEMM+RS method."""
    return "gemm_rs" if kind in GEMM_RS else kind.value


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def place_windows(
    needs: Mapping[tuple[OverlapMethod, str, int | None], int], align: int
) -> tuple[dict[tuple[OverlapMethod, str, int | None], int], int]:
    """The offset of each window in the handle's one buffer, and the buffer's size.

    ``needs`` maps a window's key (kind, dtype, put_split) to its bytes. Windows start at 0,
    except that a kind in a :data:`_DISJOINT_KINDS` pair with an earlier kind starts after
    every window of that kind (``align``-aligned), so the two never share a byte (NOTE
    [userbuffer memory]); the size is the largest end.
    """
    ends: dict[OverlapMethod, int] = {}
    for (kind, _, _), nbytes in needs.items():
        ends[kind] = max(ends.get(kind, 0), nbytes)
    starts: dict[OverlapMethod, int] = {}
    for kind in ends:
        after = [k for k in ends if (k, kind) in _DISJOINT_KINDS]
        starts[kind] = max((_round_up(ends[k], align) for k in after), default=0)
    offsets = {key: starts[key[0]] for key in needs}
    size = max((offsets[key] + nbytes for key, nbytes in needs.items()), default=0)
    return offsets, size


def plan_buffer(config: UbConfig, tp: int) -> tuple[list[_BufferUse], int]:
    """The windows of the handle's one buffer and its size in bytes per rank, for ``config``
    at TP size ``tp``: what :class:`Userbuffers` allocates (before the transport rounds it
    up), computed without a communicator (NOTE [userbuffer memory]).

    The GEMM names of one kind (AG+GEMM, GEMM+RS, bulk AG, bulk RS), buffer dtype and
    ``put_split`` share a window sized for the largest need among them (the op classes'
    ``buffer_bytes``); :func:`place_windows` places the windows.
    """
    import torch

    from overlap._native import native

    resolved = config.for_tp(tp)
    gemms = resolved.gemms
    dtype = getattr(torch, config.dtype)
    fp8_dtype = getattr(torch, config.fp8_dtype)
    groups: dict[tuple[OverlapMethod, str, int | None], list[str]] = {}
    for name, cfg in gemms.items():
        if not cfg.method.overlapped:
            continue
        ag = cfg.method in (OverlapMethod.RING_AG, OverlapMethod.BULK_AG)
        buf_dtype = fp8_dtype if (ag and cfg.fp8) else dtype
        split = getattr(cfg, "put_split", None)  # None: a GEMM+RS window keeps its own
        kind = OverlapMethod.PIPELINE_RS if cfg.method in GEMM_RS else cfg.method
        groups.setdefault((kind, str(buf_dtype).removeprefix("torch."), split), []).append(name)

    def op_bytes(name: str, buf_dtype: torch.dtype) -> int:
        # The op's and its alternates' (NOTE [plan alternates]): a plan may run any of them.
        args = (tp, config.tokens, config.hidden, buf_dtype)
        sizes = []
        for cfg in (gemms[name], *resolved.alternates(name)):
            kw = {"method": cfg.op_kwargs()["method"]} if cfg.method in GEMM_RS else {}
            sizes.append(int(_op_class(cfg.method).buffer_bytes(*args, **kw)))
        return max(sizes)

    needs = {
        key: max(op_bytes(n, getattr(torch, key[1])) for n in names)
        for key, names in groups.items()
    }
    offsets, size = place_windows(needs, int(native().comm.window_align))
    windows = [
        _BufferUse(key[0], key[1], key[2], offsets[key], needs[key], tuple(names))
        for key, names in groups.items()
    ]
    return windows, size


class Userbuffers:
    """The overlap ops of one TP group, built by :func:`initialize_ub`.

    Attributes:
        config: the validated :class:`~overlap.ub.UbConfig` it was given.
        comm: the TP group's :class:`~overlap.comm.Communicator`.
        tp: the TP size.
        plans: the :class:`~overlap.ub.ShapePlans` of its GEMM calls by shape: whether a
            layer's call of a given shape runs the overlap op or the sequential path (NOTE
            [shape plans]).
    """

    def __init__(
        self, config: UbConfig, comm: Communicator, plans: ShapePlans | None = None
    ) -> None:
        """COLLECTIVE over ``comm``'s group: create the buffer, its windows and the op objects.
        Takes ownership of ``comm`` (:meth:`destroy` destroys it). ``plans``: the per-shape
        plans the layers consult (NOTE [shape plans]; default: policy ``always``)."""
        import torch

        self.config = config
        self.comm = comm
        self.tp = comm.group.size
        self.plans = plans if plans is not None else ShapePlans()
        try:
            _check_tp(config, self.tp)
        except ConfigError:
            comm.destroy()
            raise
        # A config made for any TP size (tp None) gets this group's TP-dependent defaults
        # (NOTE [ub tp 2], NOTE [bulk_rs defaults]); its methods stay as it chose them.
        self._resolved = config.for_tp(self.tp)  # its gemms and alternates, resolved once
        self._gemms: Mapping[str, MethodConfig] = self._resolved.gemms
        self._ops: dict[str, UbOp] = {}
        self._windows: dict[str, tuple[SymmetricBuffer, torch.dtype]] = {}
        self._alternates: dict[str, dict[str, UbOp]] = {}  # NOTE [plan alternates]
        self._uses: list[_BufferUse] = []
        self._buffer: SymmetricBuffer | None = None
        try:
            windows, size = plan_buffer(config, self.tp)
            if windows:
                self._buffer = comm.create_buffer(size, "ub")
            for w in windows:
                suffix = "" if w.put_split is None else f"_{w.put_split}"
                window = self._buffer.window(  # type: ignore[union-attr]
                    w.offset, w.nbytes, f"ub_{_kind_label(w.kind)}_{w.dtype}{suffix}"
                )
                if w.put_split is not None:
                    window.put_split = w.put_split
                self._uses.append(dataclasses.replace(w, put_split=window.put_split))
                for name in w.names:
                    self._windows[name] = (window, getattr(torch, w.dtype))
                    self._ops[name] = self._make_op(name, self._gemms[name], *self._windows[name])
        except BaseException:
            comm.destroy()
            raise
        self._destroyed = False

    def _make_op(
        self, name: str, cfg: MethodConfig, buffer: SymmetricBuffer, buf_dtype: torch.dtype
    ) -> UbOp:
        args = (self.comm, self.config.tokens, self.config.hidden, buf_dtype)
        return _op_class(cfg.method)(*args, **cfg.op_kwargs(), name=name, buffer=buffer)

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def buffer(self) -> SymmetricBuffer | None:
        """The one symmetric buffer every op runs on a window of (None when no GEMM is
        overlapped; NOTE [userbuffer memory])."""
        return self._buffer

    @property
    def total_bytes(self) -> int:
        """Bytes of memory this rank holds for its symmetric buffer (the same on every rank):
        its size, rounded up as the transport allocates it (cuda: to 2 MiB, NOTE
        [allocation granularity] in ``csrc/comm/cuda/cuda_memory.h``)."""
        return 0 if self._buffer is None else self._buffer.allocated_bytes

    @property
    def bound_bytes(self) -> int:
        """``2 * T * H * itemsize`` of the activations' dtype: what the buffer stays within
        (NOTE [userbuffer memory]), the reference :meth:`describe` reports it against."""
        import torch

        itemsize = getattr(torch, self.config.dtype).itemsize
        return 2 * self.config.tokens * self.config.hidden * itemsize

    def is_overlapped(self, name: str) -> bool:
        """Whether ``name`` has an overlap op (False for the ``NONE`` method)."""
        check_name(name)
        return name in self._ops

    def gemm_config(self, name: str) -> MethodConfig:
        """The config GEMM ``name`` runs with (:class:`~overlap.ub.RingAgConfig`, ...): its
        method's, every knob resolved for this group's TP size."""
        check_name(name)
        return self._gemms[name]

    def method(self, name: str) -> OverlapMethod:
        """The method GEMM ``name`` runs (``NONE`` when it is not overlapped)."""
        return self.gemm_config(name).method

    def fp8(self, name: str) -> bool:
        """Whether GEMM ``name``'s op was built for FP8 inputs (its buffer sized for FP8
        shards)."""
        return bool(self.gemm_config(name).fp8)

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
        check_name(name)
        if name not in self._ops:
            raise ConfigError(
                f"userbuffers: {name} is not overlapped (method none): run its GEMM (and "
                "collective, if any) separately"
            )
        return self._ops[name]

    def alternates(self, name: str) -> dict[str, UbOp]:
        """The op objects of GEMM ``name``'s alternate settings, by label (e.g.
        ``"pipeline_rs lanes=2 pieces=1 max_blocks=0"``): what a measured shape plan times
        beside :meth:`get` and the sequential path (NOTE [plan alternates] in
        ``overlap/ub/config.py``). Built at the first request, on the window of ``name``'s op
        (never run at the same time as it); empty where none applies.

        Raises:
            StateError / ConfigError: as :meth:`get`.
        """
        self.get(name)
        if name not in self._alternates:
            self._alternates[name] = {
                plan_label(cfg): self._make_op(name, cfg, *self._windows[name])
                for cfg in self._resolved.alternates(name)
            }
        return self._alternates[name]

    def describe(self) -> str:
        """A table of every GEMM name's method, window and settings (the per-method config's
        ``settings``), then the buffer, its windows (byte ranges: windows of different kinds
        share bytes, NOTE [userbuffer memory]), the total bytes per rank against
        ``2 * T * H * itemsize``, each name's alternate settings (NOTE [plan alternates]) and
        the shape plans made so far (what each GEMM shape the layers called runs, and why: NOTE
        [shape plans])."""
        window_of = {n: i for i, u in enumerate(self._uses) for n in u.names}
        lines = [
            f"userbuffers: tp={self.tp} tokens={self.config.tokens} hidden={self.config.hidden} "
            f"dtype={self.config.dtype} transport={self.comm.transport.value}",
            f"{'gemm':<11} {'method':<12} {'fp8':<5} {'lanes':<5} {'window':<14} settings",
        ]
        for name, cfg in self._gemms.items():
            method = cfg.method.value
            if name in window_of:
                where = f"#{window_of[name]}"
                lanes = str(getattr(cfg, "compute_lanes", "-"))
                settings = cfg.settings
            else:
                where, lanes, settings = "not overlapped", "-", "-"
            lines.append(
                f"{name:<11} {method:<12} {cfg.fp8!s:<5} {lanes:<5} {where:<14} {settings}"
            )
        if self._buffer is not None:
            lines.append(
                f"buffer: {self._buffer.nbytes} bytes ({self._buffer.allocated_bytes} "
                "allocated), one per rank; its windows:"
            )
        for i, u in enumerate(self._uses):
            lines.append(
                f"window #{i}: {_kind_label(u.kind)} {u.dtype} put_split={u.put_split} bytes "
                f"[{u.offset}, {u.offset + u.nbytes}), shared by {', '.join(u.names)}"
            )
        bound = self.bound_bytes
        lines.append(
            f"total: {self.total_bytes} bytes per rank ({self.total_bytes / bound:.2f} x "
            f"2*T*H*{bound // (2 * self.config.tokens * self.config.hidden)} = {bound})"
        )
        alternates = {n: [plan_label(c) for c in self._resolved.alternates(n)] for n in self._ops}
        lines.append("alternate settings a measured shape plan times besides each op:")
        lines += [f"  {n}: {'; '.join(labels)}" for n, labels in alternates.items() if labels]
        lines += self.plans.describe()
        return "\n".join(lines)

    def destroy(self) -> None:
        """Free every buffer and the communicator. Idempotent; not collective. A handle that
        is the default one (``register=True``) stops being it, so that :func:`initialize_ub`
        may make a new one."""
        if _REGISTRY.get("default") is self:
            del _REGISTRY["default"]
        if self._destroyed:
            return
        self._destroyed = True
        self._ops.clear()
        self._alternates.clear()
        self.comm.destroy()

    def __enter__(self) -> Userbuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _op_class(method: OverlapMethod) -> Any:
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


# ---- the default registry --------------------------------------------------------------------

# At most one handle, under the key "default".
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
    shape_plans: PlanPolicy | str | None = None,
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
        ub_cfgs: per-GEMM settings: a ``{name: GemmOverlapConfig}`` dict (or per-method
            configs), a TE-style dict (converted by :mod:`overlap.ub.te_dict`), or a whole
            :class:`~overlap.ub.UbConfig` (then ``shape``, ``dtype``, ``use_fp8``,
            ``fp8_dtype`` and ``timeout_s`` must match it or be left at their defaults).
        transport: ``"cuda"`` (default when a CUDA device and overlap's CUDA build are
            available) or ``"host"``.
        timeout_s: deadline of every wait (default ``OVERLAP_TIMEOUT_S``).
        device: this rank's CUDA device (cuda; default torch's current device).
        mesh_dim: the TP dimension of a DeviceMesh ``tp_group``.
        register: make the handle the default one of :func:`get_ub` / :func:`destroy_ub`.
        shape_plans: ``"measured"``: the first call of each GEMM shape times the op
            against the sequential path (NCCL + cuBLASLt) on every rank and the faster runs
            from then on (NOTE [shape plans]; every overlapped step of the layers);
            ``"always"``: the layers run every overlapped GEMM's op. Default
            (:meth:`PlanPolicy.default_for`): measured on the cuda transport, always on the
            host transport.

    Returns:
        the :class:`Userbuffers` handle, its defaults chosen for the group's TP size.

    Raises:
        ConfigError: an invalid configuration, on every rank before anything collective.
        StateError: ``register`` and a default handle already exists (call
            :func:`destroy_ub` first).
    """
    if register and _REGISTRY:
        raise StateError("initialize_ub: already initialised; call destroy_ub() first")
    if shape_plans is not None:
        PlanPolicy.of(shape_plans)  # a typed error before anything collective
    bootstrap = as_bootstrap(tp_group, mesh_dim)
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
    plans = ShapePlans(PlanPolicy.default_for(transport) if shape_plans is None else shape_plans)
    _check_tp(config, bootstrap.size)  # before anything collective
    comm = Communicator(bootstrap, transport, timeout_s=config.timeout_s, device=device)
    handle = Userbuffers(config, comm, plans)
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
        # Arguments left at UbConfig's defaults (initialize_ub's own) need not repeat it.
        unrepeated = {f.name: f.default for f in dataclasses.fields(UbConfig)}
        for field in ("tokens", "hidden", "dtype", "fp8_dtype", "timeout_s"):
            ours, theirs = getattr(ub_cfgs, field), getattr(given, field)
            if theirs != ours and theirs != unrepeated[field]:
                raise ConfigError(
                    f"initialize_ub: {field}={theirs!r} contradicts ub_cfgs.{field}={ours!r}"
                )
        if use_fp8:
            raise ConfigError("initialize_ub: use_fp8 with a UbConfig: set fp8 per GEMM in it")
        return ub_cfgs
    if not isinstance(use_fp8, bool):
        raise ConfigError(f"use_fp8: {use_fp8!r} must be True or False")
    if ub_cfgs is not None and not isinstance(ub_cfgs, Mapping):
        raise ConfigError(f"ub_cfgs: expected a dict or a UbConfig, got {type(ub_cfgs).__name__}")
    entries = dict(ub_cfgs or {})
    if entries and not all(isinstance(v, GEMM_ENTRIES) for v in entries.values()):
        entries = {n: GemmOverlapConfig(**kw) for n, kw in te_dict.convert(entries, tp).items()}
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

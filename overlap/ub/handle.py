"""The userbuffers handle of a TP group: ``initialize_ub`` / ``get_ub`` / ``destroy_ub``.

:func:`initialize_ub` resolves the TP group (:func:`overlap.comm.groups.as_bootstrap`), builds
the :class:`~overlap.ub.UbConfig` (validated before anything collective happens), the group's
communicator, the symmetric buffers and the overlap op objects of the standard GEMM names.
Every buffer is sized by ``T`` and ``H`` alone (the other GEMM dimension, ``3H / tp`` or
``ffn / tp``, is the weight's and is given at call time), so the layer's FFN and QKV widths
are not part of the configuration.

NOTE [ub buffer sharing]: the ops of one kind (all AG+GEMMs, all GEMM+RSs) of a layer run one
after another, never concurrently, so they share one buffer per (kind, buffer dtype,
put_split): every AG+GEMM of a bf16 layer runs on one buffer, every GEMM+RS (pipelined or
ring, sized for the larger need) on another. A gathered input
(``AllGatherGemm.gathered_input``) is therefore only defined until the next op of any GEMM
name of that kind; never save it for backward (docs/design.md §3, invariant 2).

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
from overlap.ub.config import GEMM_ENTRIES, GemmOverlapConfig, MethodConfig, UbConfig
from overlap.ub.names import GEMM_NAMES, GEMM_RS, OverlapMethod, check_name

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

__all__ = ["Userbuffers", "destroy_ub", "get_ub", "initialize_ub"]


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
        config: the validated :class:`~overlap.ub.UbConfig` it was given.
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
        # (NOTE [ub tp 2], NOTE [bulk_rs defaults]); its methods stay as it chose them.
        self._gemms: Mapping[str, MethodConfig] = config.for_tp(self.tp).gemms
        dtype = getattr(torch, config.dtype)
        fp8_dtype = getattr(torch, config.fp8_dtype)
        self._ops: dict[str, UbOp] = {}
        self._uses: list[_BufferUse] = []
        groups: dict[tuple[OverlapMethod, str, int | None], list[str]] = {}
        for name, cfg in self._gemms.items():
            if not cfg.method.overlapped:
                continue
            ag = cfg.method in (OverlapMethod.RING_AG, OverlapMethod.BULK_AG)
            buf_dtype = fp8_dtype if (ag and cfg.fp8) else dtype
            split = getattr(cfg, "put_split", None)  # None: a GEMM+RS buffer keeps its own
            kind = OverlapMethod.PIPELINE_RS if cfg.method in GEMM_RS else cfg.method
            key = (kind, str(buf_dtype).removeprefix("torch."), split)
            groups.setdefault(key, []).append(name)
        try:
            for (kind, dtype_name, split), names in groups.items():
                buf_dtype = getattr(torch, dtype_name)
                nbytes = max(self._buffer_bytes(name, buf_dtype) for name in names)
                suffix = "" if split is None else f"_{split}"
                buffer = comm.create_buffer(nbytes, f"ub_{kind.value}_{dtype_name}{suffix}")
                if split is not None:
                    buffer.put_split = split
                use = _BufferUse(
                    kind, dtype_name, buffer.put_split, nbytes, buffer.allocated_bytes, tuple(names)
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
        cfg = self._gemms[name]
        args = (self.tp, self.config.tokens, self.config.hidden, buf_dtype)
        if cfg.method in GEMM_RS:
            method = cfg.op_kwargs()["method"]
            return _op_class(cfg.method).buffer_bytes(*args, method=method)  # type: ignore[call-arg]
        return _op_class(cfg.method).buffer_bytes(*args)

    def _make_op(self, name: str, buffer: SymmetricBuffer, buf_dtype: torch.dtype) -> UbOp:
        cfg = self._gemms[name]
        args = (self.comm, self.config.tokens, self.config.hidden, buf_dtype)
        return _op_class(cfg.method)(*args, **cfg.op_kwargs(), name=name, buffer=buffer)

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

    def describe(self) -> str:
        """A table of every GEMM name's method, buffer and settings (the per-method config's
        ``settings``), then the buffers and the total bytes per rank."""
        buffer_of = {n: i for i, u in enumerate(self._uses) for n in u.names}
        lines = [
            f"userbuffers: tp={self.tp} tokens={self.config.tokens} hidden={self.config.hidden} "
            f"dtype={self.config.dtype} transport={self.comm.transport.value}",
            f"{'gemm':<11} {'method':<12} {'fp8':<5} {'lanes':<5} {'buffer':<14} settings",
        ]
        for name, cfg in self._gemms.items():
            method = cfg.method.value
            if name in buffer_of:
                where = f"#{buffer_of[name]}"
                lanes = str(getattr(cfg, "compute_lanes", "-"))
                settings = cfg.settings
            else:
                where, lanes, settings = "not overlapped", "-", "-"
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

    Returns:
        the :class:`Userbuffers` handle, its defaults chosen for the group's TP size.

    Raises:
        ConfigError: an invalid configuration, on every rank before anything collective.
        StateError: ``register`` and a default handle already exists (call
            :func:`destroy_ub` first).
    """
    if register and _REGISTRY:
        raise StateError("initialize_ub: already initialised; call destroy_ub() first")
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

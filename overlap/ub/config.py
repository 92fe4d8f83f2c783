"""The typed userbuffers configuration: what a user asks of each GEMM name, and what it runs.

* :class:`GemmOverlapConfig`: the settings a user gives one GEMM name: a method and any
  method's knobs, each ``None`` for "the default" (validated at construction);
* one config per method, every knob concrete: :class:`RingAgConfig`
  (:class:`~overlap.ops.AllGatherGemm`), :class:`PipelineRsConfig` and :class:`RingRsConfig`
  (:class:`~overlap.ops.GemmReduceScatter`), :class:`BulkAgConfig`, :class:`BulkRsConfig`
  and :class:`NoOverlapConfig`. Their defaults are the C++ core's (NOTE [overlap defaults] in
  ``csrc/comm/overlap/overlap_ops.h``): a field left out takes the core's default at any TP
  size, and :meth:`RingAgConfig.at_tp` (each class has it) takes a TP size's own;
* :class:`UbConfig`: the configuration of one TP group, every standard GEMM name resolved to
  the config of its method.

Nothing here writes a default down: the methods' defaults come from
:mod:`overlap.ub.names`, the knobs' from the core (``tests/unit/test_defaults.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from overlap._native import native
from overlap.dtypes import FP8_DTYPES, HIGH_PRECISION_DTYPES, dtype_name
from overlap.errors import ConfigError
from overlap.ub import te_dict
from overlap.ub.names import (
    GEMM_NAMES,
    OverlapMethod,
    allowed_methods,
    check_name,
    keeps_gathered_by_default,
    method_in,
)

__all__ = [
    "GEMM_ENTRIES",
    "METHOD_CONFIGS",
    "BulkAgConfig",
    "BulkRsConfig",
    "GemmOverlapConfig",
    "MethodConfig",
    "NoOverlapConfig",
    "PipelineRsConfig",
    "RingAgConfig",
    "RingRsConfig",
    "UbConfig",
    "method_config_class",
    "plan_label",
]


# ---- the core's limits and defaults ----------------------------------------------------------

# The lower bound of each integer knob, and the name of the core's upper bound (None: none).
_INT_KNOBS: dict[str, tuple[int, str | None]] = {
    "compute_lanes": (1, "MAX_COMPUTE_LANES"),
    "put_split": (1, "MAX_PUT_SPLIT"),
    "pieces": (1, "MAX_PIECES"),
    "ring_subchunks": (1, "MAX_RING_SUBCHUNKS"),
    "reduce_max_blocks": (0, None),
    "gemm_sm_margin": (0, None),
}
_BOOL_KNOBS = ("staggered_puts", "pull_shards", "keep_gathered", "fused_gemm")


def _core_default(core: str | None, knob: str, tp: int | None) -> Any:
    """The core's default of ``knob`` for the op ``core`` (``"ag_gemm"``, ``"gemm_rs"``,
    ``"gemm_rs_ring"``, ``"bulk_rs"``) at TP size ``tp`` (None: any size); a buffer's
    ``put_split`` (``core`` None) is the symmetric buffer's."""
    ops = native().comm_ops
    if core is None:
        return int(ops.DEFAULT_PUT_SPLIT)
    return getattr(getattr(ops, f"{core}_defaults")(0 if tp is None else int(tp)), knob)


def _core_field(core: str | None, knob: str) -> Any:
    """A dataclass field whose default is the core's at any TP size."""
    return dataclasses.field(default_factory=lambda: _core_default(core, knob, None))


def _check_int(field: str, value: object, lo: int, hi: int | None, optional: bool = False) -> None:
    if optional and value is None:
        return
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo
    if not ok or (hi is not None and value > hi):  # type: ignore[operator]
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{field}: {value!r} is not an int in {allowed}")


def _check_knob(owner: str, knob: str, value: object, optional: bool) -> None:
    """A knob's type and range (the core's limits); ``None`` passes where ``optional``."""
    if knob in _INT_KNOBS:
        lo, limit = _INT_KNOBS[knob]
        hi = (
            None
            if limit is None or (optional and value is None)
            else getattr(native().comm_ops, limit)
        )
        _check_int(f"{owner}.{knob}", value, lo, hi, optional)
    elif not isinstance(value, bool) and not (optional and value is None):
        raise ConfigError(f"{owner}.{knob}: {value!r} must be True or False")


# ---- one config per method -------------------------------------------------------------------


class _MethodConfig:
    """What every per-method config has: its method, the core op its defaults come from, its
    knobs (the dataclass fields but ``fp8``) and ``fp8``."""

    method: ClassVar[OverlapMethod]
    _CORE: ClassVar[str | None] = None
    fp8: bool

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for knob in self.knobs():
            _check_knob(owner, knob, getattr(self, knob), optional=False)
        if not isinstance(self.fp8, bool):
            raise ConfigError(f"{owner}.fp8: {self.fp8!r} must be True or False")

    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        """The method's tuning knobs (its fields but ``fp8``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "fp8")  # type: ignore[arg-type]

    @classmethod
    def at_tp(cls, tp: int | None, **given: Any) -> Any:
        """The config with the knobs ``given`` (``None``: not given) and the core's defaults
        at TP size ``tp`` (None: any size) for the others."""
        values = {k: v for k, v in given.items() if v is not None}
        for knob in cls.knobs():
            if knob not in values:
                core = None if knob == "put_split" else cls._CORE
                values[knob] = _core_default(core, knob, tp)
        return cls(**values)

    @property
    def settings(self) -> str:
        """The settings that apply to the method, as :meth:`Userbuffers.describe` lists them
        (``"-"``: none), e.g. ``"subchunks=2 pull"``."""
        return "-"

    def op_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the method's op class that carry this config."""
        return {k: getattr(self, k) for k in self.knobs() if k != "put_split"}


@dataclasses.dataclass(frozen=True)
class RingAgConfig(_MethodConfig):
    """``RING_AG``: an :class:`~overlap.ops.AllGatherGemm` (its arguments of the same names;
    ``put_split`` is its buffer's, NOTE [put split])."""

    method: ClassVar[OverlapMethod] = OverlapMethod.RING_AG
    _CORE: ClassVar[str | None] = "ag_gemm"
    compute_lanes: int = _core_field("ag_gemm", "compute_lanes")
    staggered_puts: bool = _core_field("ag_gemm", "staggered_puts")
    pull_shards: bool = _core_field("ag_gemm", "pull_shards")
    pieces: int = _core_field("ag_gemm", "pieces")
    keep_gathered: bool = _core_field("ag_gemm", "keep_gathered")
    fused_gemm: bool = _core_field("ag_gemm", "fused_gemm")
    put_split: int = _core_field(None, "put_split")
    fp8: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fused_gemm and not self.pull_shards:
            raise ConfigError(
                "RingAgConfig.fused_gemm: the waiting GEMM runs on the pulls; set "
                "pull_shards=True as well (NOTE [fused ag_gemm])"
            )

    @property
    def settings(self) -> str:
        order = "pull" if self.pull_shards else "staggered" if self.staggered_puts else "all"
        parts = [f"pieces={self.pieces}", order]
        if self.fused_gemm:
            parts.append("fused")
        if self.keep_gathered:
            parts.append("keep_gathered")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class PipelineRsConfig(_MethodConfig):
    """``PIPELINE_RS``: a :class:`~overlap.ops.GemmReduceScatter` of the pipelined method."""

    method: ClassVar[OverlapMethod] = OverlapMethod.PIPELINE_RS
    _CORE: ClassVar[str | None] = "gemm_rs"
    compute_lanes: int = _core_field("gemm_rs", "compute_lanes")
    reduce_max_blocks: int = _core_field("gemm_rs", "reduce_max_blocks")
    pieces: int = _core_field("gemm_rs", "pieces")
    fp8: bool = False

    @property
    def settings(self) -> str:
        return f"pieces={self.pieces} max_blocks={self.reduce_max_blocks}"

    def op_kwargs(self) -> dict[str, Any]:
        from overlap.ops import RsMethod

        return {**super().op_kwargs(), "method": RsMethod.PIPELINED}


@dataclasses.dataclass(frozen=True)
class RingRsConfig(_MethodConfig):
    """``RING_RS``: a :class:`~overlap.ops.GemmReduceScatter` of the ring method."""

    method: ClassVar[OverlapMethod] = OverlapMethod.RING_RS
    _CORE: ClassVar[str | None] = "gemm_rs_ring"
    compute_lanes: int = _core_field("gemm_rs_ring", "compute_lanes")
    reduce_max_blocks: int = _core_field("gemm_rs_ring", "reduce_max_blocks")
    ring_subchunks: int = _core_field("gemm_rs_ring", "ring_subchunks")
    pull_shards: bool = _core_field("gemm_rs_ring", "pull_shards")
    fp8: bool = False

    @property
    def settings(self) -> str:
        return f"subchunks={self.ring_subchunks} {'pull' if self.pull_shards else 'push'}"

    def op_kwargs(self) -> dict[str, Any]:
        from overlap.ops import RsMethod

        return {**super().op_kwargs(), "method": RsMethod.RING}


@dataclasses.dataclass(frozen=True)
class BulkAgConfig(_MethodConfig):
    """``BULK_AG``: an :class:`~overlap.ops.AllGatherBesideGemm` (``put_split``: its
    buffer's)."""

    method: ClassVar[OverlapMethod] = OverlapMethod.BULK_AG
    put_split: int = _core_field(None, "put_split")
    fp8: bool = False


@dataclasses.dataclass(frozen=True)
class BulkRsConfig(_MethodConfig):
    """``BULK_RS``: a :class:`~overlap.ops.ReduceScatterBesideGemm` (``put_split``: its
    buffer's)."""

    method: ClassVar[OverlapMethod] = OverlapMethod.BULK_RS
    _CORE: ClassVar[str | None] = "bulk_rs"
    reduce_max_blocks: int = _core_field("bulk_rs", "reduce_max_blocks")
    gemm_sm_margin: int = _core_field("bulk_rs", "gemm_sm_margin")
    pieces: int = _core_field("bulk_rs", "pieces")
    put_split: int = _core_field(None, "put_split")
    fp8: bool = False

    @property
    def settings(self) -> str:
        return (
            f"pieces={self.pieces} max_blocks={self.reduce_max_blocks} "
            f"sm_margin={self.gemm_sm_margin}"
        )


@dataclasses.dataclass(frozen=True)
class NoOverlapConfig(_MethodConfig):
    """``NONE``: no op; the GEMM (and its collective, if any) runs on its own."""

    method: ClassVar[OverlapMethod] = OverlapMethod.NONE
    fp8: bool = False


MethodConfig = (
    RingAgConfig | PipelineRsConfig | RingRsConfig | BulkAgConfig | BulkRsConfig | NoOverlapConfig
)
METHOD_CONFIGS: tuple[type, ...] = (
    RingAgConfig,
    PipelineRsConfig,
    RingRsConfig,
    BulkAgConfig,
    BulkRsConfig,
    NoOverlapConfig,
)


def method_config_class(method: OverlapMethod) -> type[Any]:
    """The per-method config class of ``method``."""
    return next(c for c in METHOD_CONFIGS if c.method is method)


# ---- what a user gives one GEMM name ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GemmOverlapConfig:
    """How one GEMM name is overlapped, as a user gives it: a method and the knobs of any
    method, each ``None`` for the default. Validated at construction (:class:`ConfigError`,
    against the core's limits); :class:`UbConfig` resolves it into the config of its method
    (:meth:`resolve`), where the knobs of other methods are ignored.

    Attributes:
        method: the overlap method (``None``: the GEMM name's default,
            :func:`~overlap.ub.default_method`).
        compute_lanes: streams the chunk GEMMs alternate over (``RING_AG``, ``PIPELINE_RS``,
            ``RING_RS``; 1 to the core's ``MAX_COMPUTE_LANES``).
        put_split: copies carrying one shard to one peer (``RING_AG``, ``BULK_AG``,
            ``BULK_RS``; 1 to ``MAX_PUT_SPLIT``; a property of the shared buffer, so names
            with different values get different buffers).
        staggered_puts: push the shard to one peer after the other (``RING_AG``).
        pull_shards: the peers pull what they need instead of it being pushed to them
            (``RING_AG``: each rank's shard, after two device-side handshakes, NOTE [ag_gemm
            pulls], ``put_split`` and ``staggered_puts`` then do not apply; ``RING_RS``: the
            running sums, NOTE [gemm_rs_ring pulls]). A ``RING_RS`` that :class:`UbConfig`
            chooses by default takes the core's choice (NOTE [ub tp 2]).
        reduce_max_blocks: bound on the reduction kernel's grid, 0 = fill the GPU
            (``PIPELINE_RS``, ``BULK_RS``; ``RING_RS``: its FP8 output cast).
        fp8: the GEMM's input travels in FP8 (``RING_AG`` / ``BULK_AG``: the buffer holds FP8
            shards and their scale_inv; ``PIPELINE_RS`` / ``BULK_RS``: the partial sums still
            travel in the layer's dtype, so the buffer is the same).
        gemm_sm_margin: ``BULK_RS`` only: SMs the side GEMM leaves to the reduction when the
            call gives no ``sm_count``.
        ring_subchunks: sub-chunks each ring hop is pipelined in (``RING_RS`` only; 1 to
            ``MAX_RING_SUBCHUNKS``; NOTE [gemm_rs_ring schedule]).
        pieces: pieces each chunk is split into (1 to ``MAX_PIECES``; ``RING_AG``: each peer's
            shard travels and is multiplied in pieces, NOTE [ag_gemm pieces];
            ``PIPELINE_RS``: the chunks are computed, pulled and summed in rounds, NOTE
            [gemm_rs pieces]; ``BULK_RS``: the partial sums travel and are summed in pieces,
            each as soon as it has landed, NOTE [bulk_rs pieces]).
        keep_gathered: ``RING_AG`` only: every call leaves the whole gathered input in the
            buffer for ``gathered_input()`` (a call may still override it). ``None``: the
            name's default (NOTE [ub gathered inputs]).
        fused_gemm: ``RING_AG`` with ``pull_shards`` only: one waiting GEMM kernel consumes
            the shards as they land (NOTE [fused ag_gemm]; bfloat16, Hopper, a build with
            CUTLASS's headers).

    A knob left ``None`` takes the core's default for the TP size (``AgGemmConfig``...,
    NOTE [overlap defaults] in ``csrc/comm/overlap/overlap_ops.h``); the resolved values are
    in :attr:`UbConfig.gemms` and :meth:`Userbuffers.describe`.
    """

    method: OverlapMethod | None = None
    compute_lanes: int | None = None
    put_split: int | None = None
    staggered_puts: bool | None = None
    pull_shards: bool | None = None
    reduce_max_blocks: int | None = None
    fp8: bool = False
    gemm_sm_margin: int | None = None
    ring_subchunks: int | None = None
    pieces: int | None = None
    keep_gathered: bool | None = None
    fused_gemm: bool | None = None

    def __post_init__(self) -> None:
        if self.method is not None and not isinstance(self.method, OverlapMethod):
            try:
                object.__setattr__(self, "method", OverlapMethod(self.method))
            except ValueError:
                raise ConfigError(
                    f"GemmOverlapConfig.method: {self.method!r} is not one of "
                    f"{[m.value for m in OverlapMethod]}"
                ) from None
        for knob in (*_INT_KNOBS, *_BOOL_KNOBS):
            _check_knob("GemmOverlapConfig", knob, getattr(self, knob), optional=True)
        if not isinstance(self.fp8, bool):
            raise ConfigError(f"GemmOverlapConfig.fp8: {self.fp8!r} must be True or False")

    def resolve(
        self,
        method: OverlapMethod,
        tp: int | None,
        *,
        keep_gathered: bool | None = None,
        pull_shards: bool | None = None,
    ) -> MethodConfig:
        """The config of ``method`` (this config's, or the one chosen for it) at TP size
        ``tp`` (None: any): every knob of the method as given here, else ``keep_gathered`` /
        ``pull_shards`` where those are given (the GEMM name's defaults), else the core's
        default at ``tp``. Knobs of other methods are ignored."""
        cls = method_config_class(method)
        fallback = {"keep_gathered": keep_gathered, "pull_shards": pull_shards}
        values = {}
        for knob in cls.knobs():
            value = getattr(self, knob)
            values[knob] = fallback.get(knob) if value is None else value
        return cls.at_tp(tp, fp8=self.fp8, **values)  # type: ignore[no-any-return]


# ---- the configuration of a TP group ---------------------------------------------------------

Entry = GemmOverlapConfig | MethodConfig
#: The types a :attr:`UbConfig.gemms` entry may have.
GEMM_ENTRIES: tuple[type, ...] = (GemmOverlapConfig, *METHOD_CONFIGS)


@dataclasses.dataclass(frozen=True)
class UbConfig:
    """The userbuffers configuration of one TP group. Validated at construction.

    Attributes:
        tokens: ``T``, the global token count (sequence x micro-batch) of the largest call;
            must be divisible by the TP size (checked by :func:`~overlap.initialize_ub`).
        hidden: ``H``, the hidden size.
        dtype: the activations' dtype: ``"bfloat16"``/``"float16"``/``"float32"`` or the
            torch dtype (stored as its name).
        fp8_dtype: the FP8 dtype of ``fp8`` GEMMs' inputs (``"float8_e4m3fn"`` or
            ``"float8_e5m2"``).
        timeout_s: deadline of every wait (``None``: ``OVERLAP_TIMEOUT_S``).
        gemms: per-GEMM settings: a :class:`GemmOverlapConfig` (resolved here) or a per-method
            config (taken as it is). After construction every standard name maps to the
            config of its method (:class:`RingAgConfig`, ...), every knob concrete: a missing
            name, or one whose ``method`` is ``None``, gets its default method
            (:func:`~overlap.ub.default_method`), a knob left ``None`` the core's default at
            ``tp``.
        tp: the TP size the defaults are chosen for (``None``: any size; ``initialize_ub``
            fills in its group's size and refuses a config made for another, and a config
            made for any size runs with its group's defaults: :meth:`for_tp`).
    """

    tokens: int
    hidden: int
    dtype: Any = "bfloat16"
    fp8_dtype: Any = "float8_e4m3fn"
    timeout_s: float | None = None
    gemms: Mapping[str, Entry] = dataclasses.field(default_factory=dict)
    tp: int | None = None
    # What for_tp() resolves again: the entries as given, with the methods chosen for them.
    _entries: Mapping[str, Entry] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # The names whose method the user gave (NOTE [plan alternates] varies the others').
    _user_methods: frozenset[str] = dataclasses.field(
        default=frozenset(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        _check_int("UbConfig.tokens", self.tokens, 1, None)
        _check_int("UbConfig.hidden", self.hidden, 1, None)
        object.__setattr__(
            self, "dtype", _dtype("UbConfig.dtype", self.dtype, HIGH_PRECISION_DTYPES)
        )
        object.__setattr__(
            self, "fp8_dtype", _dtype("UbConfig.fp8_dtype", self.fp8_dtype, FP8_DTYPES)
        )
        if self.timeout_s is not None and not (
            isinstance(self.timeout_s, (int, float))
            and not isinstance(self.timeout_s, bool)
            and self.timeout_s > 0
        ):
            raise ConfigError(f"UbConfig.timeout_s: {self.timeout_s!r} must be > 0 or None")
        _check_int("UbConfig.tp", self.tp, 1, None, optional=True)
        if not isinstance(self.gemms, Mapping):
            raise ConfigError(f"UbConfig.gemms: expected a mapping, got {type(self.gemms)}")
        given: dict[str, Entry] = {}
        for name, cfg in self.gemms.items():
            check_name(name)
            if not isinstance(cfg, GEMM_ENTRIES):
                raise ConfigError(
                    f"UbConfig.gemms[{name!r}]: expected a GemmOverlapConfig, got {cfg!r}"
                )
            given[name] = cfg
        chosen = {n: c.method for n, c in given.items() if c.method is not None}
        methods: dict[str, OverlapMethod] = {}
        for name in GEMM_NAMES:
            method = chosen.get(name)
            if method is None:
                method = method_in(name, chosen, self.tp)
            if method not in allowed_methods(name):
                raise ConfigError(
                    f"UbConfig.gemms[{name!r}].method: {method.value!r} does not fit "
                    f"{name}'s communication; allowed: "
                    f"{[m.value for m in allowed_methods(name)]}"
                )
            methods[name] = method
        entries: dict[str, Entry] = {}
        resolved: dict[str, MethodConfig] = {}
        for name in GEMM_NAMES:
            cfg = given.get(name, GemmOverlapConfig())
            if isinstance(cfg, GemmOverlapConfig):
                method = methods[name]
                pulls = None
                if name not in chosen and method is OverlapMethod.RING_RS:
                    # NOTE [ub tp 2]: the ring the core chooses comes with its pull choice.
                    pulls = bool(native().comm_ops.gemm_rs_default(_size(self.tp)).pull_shards)
                keep = keeps_gathered_by_default(name, methods)
                resolved[name] = cfg.resolve(method, self.tp, keep_gathered=keep, pull_shards=pulls)
                if cfg.pull_shards is None and pulls is not None:
                    cfg = dataclasses.replace(cfg, pull_shards=pulls)
                cfg = dataclasses.replace(cfg, method=method)
            else:
                resolved[name] = cfg  # type: ignore[assignment]
            entries[name] = cfg
        object.__setattr__(self, "gemms", resolved)
        object.__setattr__(self, "_entries", entries)
        object.__setattr__(self, "_user_methods", frozenset(chosen))

    def alternates(self, name: str) -> tuple[MethodConfig, ...]:
        """The other settings of GEMM ``name``'s op that a measured shape plan times beside
        :attr:`gemms` ``[name]`` and the sequential path (NOTE [plan alternates]): every knob
        and method the user gave stays; empty for a name given as a per-method config, for
        the bulk methods and for ``NONE``."""
        check_name(name)
        return _alternates(
            self._entries[name], name in self._user_methods, self.gemms[name], self.tp
        )

    def for_tp(self, tp: int) -> UbConfig:
        """This config for a group of ``tp`` ranks: itself when it was made for a TP size
        (``initialize_ub`` refuses another), else the same methods with ``tp``'s defaults for
        every knob that was not given (NOTE [ub tp 2], NOTE [bulk_rs defaults])."""
        if self.tp is not None:
            return self
        config = UbConfig(
            self.tokens, self.hidden, self.dtype, self.fp8_dtype, self.timeout_s, self._entries, tp
        )
        object.__setattr__(config, "_user_methods", self._user_methods)  # entries carry them all
        return config

    @classmethod
    def from_te_dict(
        cls, te_cfgs: Mapping[str, Mapping[str, Any]], *, tokens: int, hidden: int, **kwargs: Any
    ) -> UbConfig:
        """Convert a TransformerEngine ``ub_cfgs`` dict (``{"qkv_fprop": {"method":
        "ring_exchange", ...}, ...}``, TE's own default entries included); other
        :class:`UbConfig` fields come as keywords. :mod:`overlap.ub.te_dict` has the mapping
        of TE's keys (keys without an equivalent are warned about, wrong ones refused)."""
        entries = te_dict.convert(te_cfgs, kwargs.get("tp"))
        gemms = {name: GemmOverlapConfig(**kw) for name, kw in entries.items()}
        return cls(tokens=tokens, hidden=hidden, gemms=gemms, **kwargs)


# NOTE [plan alternates]: one setting of an op does not win on every shape (the broad suite, 4xH200
# TP 4: two compute lanes were the fastest AG+GEMM setting on 80 of 112 rows and one lane on 32; the
# pipelined GEMM+RS with one lane on 62, the pulled ring on 32, two lanes on 18), so a measured plan
# (NOTE [shape plans]) times, beside the op as configured and the sequential path, the settings
# below, and each shape runs the fastest. They vary only what the user left to the defaults: an
# AG+GEMM's compute lanes (1 or 2; pushes only: pulls have their own schedule); a GEMM+RS's method
# (the other one at its defaults: the ring with pulls, or the pipelined method with the TP size's
# lanes) and, where the pipelined method is the configured one, its lanes (1 or 2). Not the
# pipelined method's second lane where it is the alternate (TP 2, where the ring is the default):
# there it won few rows and its time varied most (two lanes over one, TP 2, two runs of the broad
# suite and one of the full suite: median 1.04-1.11, 90th percentile 1.22-1.31, faster by 2% on 13
# of 236 rows), so the plan picked it on near-ties and lost up to 15% against the ring. Every
# alternate fits the op's window: the lanes do not size a buffer, and a GEMM+RS window is sized for
# the largest of its op and alternates (NOTE [userbuffer memory]). Verdict: measure a few settings
# per shape, never a grid (each costs a few calls at a shape's first call). Measured:
# docs/performance-log.md [plan alternates].
ALTERNATE_LANES = (1, 2)


def _alternates(
    entry: Entry, method_given: bool, cfg: MethodConfig, tp: int | None
) -> tuple[MethodConfig, ...]:
    """NOTE [plan alternates] of a name resolved to ``cfg`` from its entry (the user's
    knobs; ``method_given``: its method was the user's too)."""
    if not isinstance(entry, GemmOverlapConfig):
        return ()  # a per-method config: every knob is the user's
    g = entry
    lanes = ALTERNATE_LANES if g.compute_lanes is None else (g.compute_lanes,)
    found: list[MethodConfig] = []
    if isinstance(cfg, RingAgConfig) and not cfg.pull_shards:
        found = [dataclasses.replace(cfg, compute_lanes=n) for n in lanes]
    elif isinstance(cfg, (PipelineRsConfig, RingRsConfig)):
        both = (OverlapMethod.PIPELINE_RS, OverlapMethod.RING_RS)
        for method in (cfg.method,) if method_given else both:
            if method is OverlapMethod.RING_RS:
                pulls = True if g.pull_shards is None else g.pull_shards
                found.append(g.resolve(method, tp, pull_shards=pulls))
            elif method is cfg.method:  # the pipelined method configured: its lane counts
                base = g.resolve(method, tp)
                found += [dataclasses.replace(base, compute_lanes=n) for n in lanes]
            else:  # the other method: at its defaults
                found.append(g.resolve(method, tp))
    unique: list[MethodConfig] = []
    for alt in found:
        if alt != cfg and alt not in unique:
            unique.append(alt)
    return tuple(unique)


def plan_label(cfg: MethodConfig) -> str:
    """How a shape plan names a setting of an op (NOTE [plan alternates]): its method, lanes
    and settings, e.g. ``"ring_rs lanes=1 subchunks=2 pull"``."""
    lanes = getattr(cfg, "compute_lanes", None)
    return " ".join(
        part
        for part in (cfg.method.value, "" if lanes is None else f"lanes={lanes}", cfg.settings)
        if part and part != "-"
    )


def _size(tp: int | None) -> int:
    """The core's group-size argument: ``tp``, or 0 for any size."""
    return 0 if tp is None else int(tp)


def _dtype(field: str, value: object, allowed: tuple[str, ...]) -> str:
    name = dtype_name(value)
    if name not in allowed:
        raise ConfigError(f"{field}: {value!r} is not one of {list(allowed)}")
    return name

"""Row-major GEMM over cuBLASLt (CUDA tensors) with a float64 host reference (CPU tensors).

:func:`gemm` computes, for ``op(X) = X.T if trans else X``::

    v = alpha * op(a) @ op(b) + beta * out[rows] + bias       # rows = row_offset .. row_offset+m
    v = gelu_tanh(v)                                           # when gelu=True
    out[rows] = v              (float32 / bfloat16 / float16 outputs, rounded to nearest even)
    out[rows] = fp8(v * out_scale), out_amax = max |v|        (FP8 outputs)

with ``op(a)`` of shape ``[m, k]`` and ``op(b)`` of shape ``[k, n]``. A linear layer's forward
``y = x @ w.T`` is ``gemm(x, w, transb=True)``. GELU is the tanh approximation, which is what
cuBLASLt's epilogue computes (``torch.nn.functional.gelu(v, approximate="tanh")``).

Inputs are both bfloat16, both float16, both float32, or both FP8 (``float8_e4m3fn`` /
``float8_e5m2``, not e5m2 x e5m2). FP8 operands carry a float32 ``scale_inv`` (the data is
``float(q) * scale_inv``) with a :class:`~overlap.dtypes.ScalingMode`:

- ``TENSOR`` (the default for FP8): one element;
- ``BLOCK_1X128``: ``[rows, ceil(cols / 128)]`` for data stored ``[rows, cols]``
  (activations and gradients, as :func:`~overlap.quantization.quantize_block_1x128` writes);
- ``BLOCK_128X128``: ``[ceil(rows / 128), ceil(cols / 128)]`` (weights).

Block scaling needs both operands block-scaled (not both 128x128), K-contiguous
(``transa=False, transb=True``), the split accumulator, and a bfloat16/float32 output; it runs
on Hopper only. MXFP8 operands are refused with
:class:`~overlap.errors.UnsupportedHardwareError`: dequantize them and run a BF16 GEMM. On
Hopper (sm_90) every FP8 GEMM needs K-contiguous operands (pass the columnwise data).

Every pointer must be 16-byte aligned and every row stride a multiple of 16 bytes; FP8 needs
K a multiple of 16. Violations raise :class:`~overlap.errors.InvalidArgumentError` before any
GPU work, naming the argument; calls that are valid but have no kernel raise
:class:`~overlap.errors.UnsupportedHardwareError`. The C++ header ``csrc/gemm/gemm.h`` has
the full rules. CUDA calls are enqueued on ``stream`` (default: the current stream) without
synchronising the host.

Autotuning (NOTE [gemm autotune] in ``csrc/gemm/cuda/autotune.h``): the first CUDA GEMM of
each key (shape, dtypes, layouts, epilogue, scaling, SM target, leading dimensions, pointer
alignment) times cuBLASLt's top ``max_candidates`` heuristic algorithms on a private stream,
writing scratch memory only, and caches the fastest for the process (near-ties go to the
heuristic's first); that first call is slower (up to a few hundred ms for the largest shapes)
and synchronises with the tuning stream. Later calls of the key reuse the choice. Tuning never
happens while the stream is capturing a CUDA graph (the heuristic's first is used, and tuned
by the next eager call), and results differ from untuned ones only by the algorithm choice.
It is on by default with 8 candidates; ``OVERLAP_GEMM_AUTOTUNE=0`` or
:func:`set_autotune_config` turn it off. :func:`autotune` pre-tunes a list of problems at
start-up, so that no GEMM of a pipelined overlap schedule tunes mid-flight.

One file: :func:`gemm`, the tuning controls and :func:`autotune` wrap one core module
(``overlap._C``'s GEMM) with shared scaling and stream helpers, under the one contract this
docstring states.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from overlap._native import native
from overlap.dtypes import ScalingMode, is_fp8
from overlap.errors import ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    import torch

__all__ = [
    "AutotuneConfig",
    "GemmProblem",
    "TuneResult",
    "autotune",
    "clear_gemm_cache",
    "gemm",
    "gemm_cache_stats",
    "get_autotune_config",
    "release_gemm_resources",
    "set_autotune_config",
    "set_waiting_kernel",
    "waiting_kernel_choices",
    "waiting_kernels",
]


def _scaling(fp8: bool, mode: ScalingMode | None, name: str) -> ScalingMode | None:
    """An operand's scaling: the one given, else ``TENSOR`` for FP8 data (None: not scaled)."""
    if mode is None:
        return ScalingMode.TENSOR if fp8 else None
    if not isinstance(mode, ScalingMode):
        raise InvalidArgumentError(
            f"gemm: {name} must be an overlap.dtypes.ScalingMode, got {mode!r}"
        )
    return mode


@functools.cache
def _native_scaling() -> dict[ScalingMode | None, Any]:
    """Each scaling as the binding's ``ScalingMode`` (the enum that crosses it)."""
    e = native().gemm.ScalingMode
    return {
        None: e.NONE,
        ScalingMode.TENSOR: e.TENSOR,
        ScalingMode.BLOCK_1X128: e.BLOCK_1X128,
        ScalingMode.BLOCK_128X128: e.BLOCK_128X128,
        ScalingMode.MXFP8_ROWWISE: e.MXFP8,
        ScalingMode.MXFP8_COLUMNWISE: e.MXFP8,
    }


# NOTE [gemm host path]: a GEMM shorter than its host cost is launch-bound, so the per-call
# path is kept lean. Host us per call on the 4xH200 machine's host (512^3, the GPU kept busy
# behind a spin, median of 5 x 200 calls; a dev probe run on builds before and after):
#
#   overlap.gemm bf16 / FP8 (before)             28.3 / 29.3
#   overlap.gemm bf16 / FP8 (now)                16.7 / 18.6
#   torch.mm(out=) bf16 / torch._scaled_mm FP8   12.6-13.8 / 16.9-18.0
#
# Of the 16.7 us: cublasLtMatmul's own launch 6.7; the rest of the C++ path ~1.2 (matmul
# descriptor 0.1, four layouts 0.1, scratch from the stream-ordered pool 0.7, capture and
# device queries 0.2: not worth caching); the binding's tensor conversion ~5; this wrapper ~3.
# What was cut: torch.cuda.current_stream() (~3 us: a Stream and a device object per call;
# torch's raw-handle getter takes 0.1), two calls with 20 keyword arguments (now positional:
# gemm -> _gemm -> the binding, whose parameter order is this file's contract), and the output
# view when every row of out was written.


def _stream_handle(stream: object, a: torch.Tensor) -> int:
    """The raw handle of the stream a CUDA GEMM is enqueued on (0 for CPU tensors).

    The current stream comes from torch's raw-handle getter where the build has one: it skips
    making a ``torch.cuda.Stream`` and a ``torch.device`` object per call (NOTE [gemm host
    path])."""
    import torch

    if not a.is_cuda:
        return 0
    if stream is None:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(a.get_device())
        return torch.cuda.current_stream(a.device).cuda_stream
    if isinstance(stream, torch.cuda.Stream):
        return stream.cuda_stream
    if isinstance(stream, int):
        return stream
    raise InvalidArgumentError(
        f"gemm: stream must be a torch.cuda.Stream, a raw handle (int) or None, "
        f"got {type(stream).__name__}"
    )


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    transa: bool = False,
    transb: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    row_offset: int = 0,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    a_scaling: ScalingMode | None = None,
    b_scaling: ScalingMode | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    sm_count: int = 0,
    stream: torch.cuda.Stream | int | None = None,
) -> torch.Tensor:
    """``out[row_offset:row_offset+m] = epilogue(alpha op(a) @ op(b) + beta out + bias)``.

    Args:
        a: 2-D ``[m, k]`` (or ``[k, m]`` with ``transa``), unit column stride (row slices of
            larger buffers are fine); cpu or cuda.
        b: 2-D ``[k, n]`` (or ``[n, k]`` with ``transb``); same device and kind of dtype as a.
        transa, transb: use the transpose of the stored matrix.
        out: 2-D ``[rows, n]`` buffer with unit column stride; rows
            ``row_offset .. row_offset + m`` are written, the others are left untouched.
            Allocated as ``[m, n]`` when None.
        out_dtype: dtype of an allocated out: defaults to a's dtype (bfloat16 for FP8
            inputs). Must match ``out.dtype`` when both are given.
        row_offset: first row of out written.
        alpha: scale of the product.
        beta: ``!= 0`` accumulates into out (e.g. wgrad into a float32 main_grad with
            ``beta=1``); needs out; not for FP8 outputs.
        bias: ``[n]``: out's dtype for bf16/fp16/fp32 inputs; bfloat16 for FP8 inputs (float16
            when out is float16, either for FP8 outputs).
        gelu: apply tanh-approximated GELU after the bias.
        a_scale_inv, b_scale_inv: float32 scales of FP8 operands (layouts above).
        a_scaling, b_scaling: :class:`~overlap.dtypes.ScalingMode` of FP8 operands;
            ``TENSOR`` by default.
        out_scale: float32 ``[1]``, required for FP8 outputs: stored values are
            ``fp8(v * out_scale)``.
        out_amax: float32 ``[1]``, FP8 outputs only: receives ``max |v|`` (before out_scale).
        fast_accum: FP8 per-tensor only: skip the periodic float32 promotion of the tensor-core
            accumulator (faster, less accurate). Default: on for per-tensor FP8, off otherwise
            (block scaling requires it off).
        sm_count: CUDA only: the number of SMs the GEMM plans for, leaving the rest to
            concurrent communication kernels (0 = all).
        stream: CUDA stream (``torch.cuda.Stream`` or raw handle); default: a's current
            stream.

    Returns:
        The ``m`` rows of out that were written: a view of out, or out itself when that is all
        of it.

    The first CUDA call of a new key may autotune it (slower, once; see the module docstring
    and :func:`autotune`); the output is written once, by the chosen algorithm.
    """
    # NOTE [gemm host path]: positional all the way down (a Python call with 20 keyword
    # arguments costs more than the cuBLASLt launch of a small GEMM).
    return _gemm(
        a,
        b,
        transa,
        transb,
        out,
        out_dtype,
        row_offset,
        alpha,
        beta,
        bias,
        gelu,
        a_scale_inv,
        b_scale_inv,
        a_scaling,
        b_scaling,
        out_scale,
        out_amax,
        fast_accum,
        sm_count,
        stream,
        None,
    )[0]


def _gemm(  # noqa: PLR0917 (positional on purpose: NOTE [gemm host path])
    a: torch.Tensor,
    b: torch.Tensor,
    transa: bool = False,
    transb: bool = False,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    row_offset: int = 0,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    gelu: bool = False,
    a_scale_inv: torch.Tensor | None = None,
    b_scale_inv: torch.Tensor | None = None,
    a_scaling: ScalingMode | None = None,
    b_scaling: ScalingMode | None = None,
    out_scale: torch.Tensor | None = None,
    out_amax: torch.Tensor | None = None,
    fast_accum: bool | None = None,
    sm_count: int = 0,
    stream: torch.cuda.Stream | int | None = None,
    tune: AutotuneConfig | None = None,
) -> tuple[torch.Tensor, dict[str, Any] | None]:
    """:func:`gemm`; with ``tune``, the key is tuned first (whatever the process-wide
    switch says) and the record of the tuning is returned too."""
    import torch

    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise InvalidArgumentError(f"gemm: {name} must be a 2-D torch.Tensor, got {t!r:.80}")
    m = a.shape[1] if transa else a.shape[0]
    fp8 = is_fp8(a.dtype)
    if out is None:
        if beta != 0.0 or row_offset != 0:
            raise InvalidArgumentError(
                f"gemm: beta={beta} / row_offset={row_offset} refer to an existing output; "
                "pass out="
            )
        if out_dtype is None:
            out_dtype = torch.bfloat16 if fp8 else a.dtype
        n = b.shape[0] if transb else b.shape[1]
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    elif out_dtype is not None and out_dtype != out.dtype:
        raise InvalidArgumentError(
            f"gemm: out_dtype={out_dtype} but out is {out.dtype}; pass one of them"
        )
    a_mode = _scaling(fp8, a_scaling, "a_scaling")
    b_mode = _scaling(is_fp8(b.dtype), b_scaling, "b_scaling")
    if fast_accum is None:
        fast_accum = a_mode is ScalingMode.TENSOR and b_mode is ScalingMode.TENSOR
    modes = _native_scaling()
    # The core's argument order (csrc/bindings/gemm.cpp), positional: NOTE [gemm host path].
    record = native().gemm.gemm(
        a,
        b,
        out,
        transa,
        transb,
        a_scale_inv,
        b_scale_inv,
        modes[a_mode],
        modes[b_mode],
        alpha,
        beta,
        bias,
        gelu,
        out_scale,
        out_amax,
        fast_accum,
        sm_count,
        row_offset,
        _stream_handle(stream, a),
        0 if tune is None else tune.max_candidates,
        0 if tune is None else tune.rounds,
    )
    if row_offset == 0 and m == out.shape[0]:
        return out, record  # all of out was written: no view to make
    return out[row_offset : row_offset + m], record


def gemm_cache_stats(device: int | torch.device = 0) -> dict[str, int]:
    """Counters of the cuBLASLt algorithm cache of a device (all 0 before its first GEMM):
    ``hits`` (GEMMs served from the cache), ``misses`` (GEMMs that queried the heuristic, and
    tuned when autotuning is on), ``entries`` (keys cached), ``tuned`` (keys whose algorithm
    was chosen by timing)."""
    index = device if isinstance(device, int) else (device.index or 0)
    return dict(native().gemm.cache_stats(index))


def clear_gemm_cache() -> None:
    """Forget every cached cuBLASLt algorithm, tuned ones included (and reset the counters)."""
    native().gemm.clear_cache()


def release_gemm_resources() -> None:
    """Synchronise each device used for GEMMs and release its cuBLASLt handle, workspace
    pool and cache. Idempotent; the next GEMM recreates them."""
    native().gemm.release_resources()


# ---- autotuning ----------------------------------------------------------------------------


def _check_int(owner: str, name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{owner}: {name} must be an int in [{lo}, {hi}], got {value!r}")


@dataclasses.dataclass(frozen=True)
class AutotuneConfig:
    """Process-wide lazy autotuning of new GEMM keys (see the module docstring).

    Attributes:
        enabled: tune a key on its first GEMM; False: the heuristic's first algorithm.
        max_candidates: heuristic algorithms timed per key, 1..64 (1 = no tuning).
        rounds: timed samples of each candidate (after one warm-up and one calibration
            run), 1..100, each a burst of up to 8 back-to-back runs lasting about 0.2 ms; the
            median decides.
    """

    enabled: bool = True
    max_candidates: int = 8
    rounds: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"AutotuneConfig: enabled must be a bool, got {self.enabled!r}")
        limits = native().gemm  # the core's bounds (csrc/gemm/gemm.h)
        _check_int(
            "AutotuneConfig",
            "max_candidates",
            self.max_candidates,
            1,
            limits.MAX_AUTOTUNE_CANDIDATES,
        )
        _check_int("AutotuneConfig", "rounds", self.rounds, 1, limits.MAX_AUTOTUNE_ROUNDS)


def get_autotune_config() -> AutotuneConfig:
    """The process-wide autotuning configuration (initially from ``OVERLAP_GEMM_AUTOTUNE``)."""
    return AutotuneConfig(**native().gemm.get_autotune())


def set_autotune_config(config: AutotuneConfig) -> AutotuneConfig:
    """Set the process-wide autotuning configuration; returns the previous one.

    Applies to keys tuned from now on: cached choices stay (:func:`clear_gemm_cache` drops
    them). Keys cached untuned (while tuning was off) are tuned by their next GEMM once it is
    on again.

    Raises:
        ConfigError: ``config`` is not an :class:`AutotuneConfig`.
    """
    if not isinstance(config, AutotuneConfig):
        raise ConfigError(
            f"set_autotune_config: expected an overlap.gemm.AutotuneConfig, got {config!r:.80}"
        )
    previous = get_autotune_config()
    native().gemm.set_autotune(
        enabled=config.enabled, max_candidates=config.max_candidates, rounds=config.rounds
    )
    return previous


def waiting_kernels() -> tuple[str, ...]:
    """The fused AG+GEMM's waiting-kernel candidates, in the tuner's order.

    Tile shape and cluster (NOTE [waiting gemm tiles] in
    ``csrc/gemm/cuda/waiting_gemm.cu``); empty in a build without the kernel
    (``native().gemm.waiting_gemm_built()``).
    """
    return tuple(native().gemm.waiting_gemm_candidates())


def waiting_kernel_choices() -> list[dict[str, Any]]:
    """The waiting kernel this process chose for each problem it ran (NOTE [waiting gemm choice]).

    Each entry: ``problem`` (groups, rows x n, k, SMs, the last group's expected arrival),
    ``kernel`` (a name of :func:`waiting_kernels`), ``tuned`` (False: the untuned rule, ``note``
    says why), ``estimate_ms`` (max of the whole problem's time and the last arrival plus the
    last group's time), ``candidates``, ``all_ms`` and ``last_ms`` per candidate (negative: it
    could not run; ``last_ms`` 0: not timed, the problem being GEMM-bound), ``note``.
    """
    return [dict(c) for c in native().gemm.waiting_gemm_choices()]


def set_waiting_kernel(name: str) -> str:
    """Override the waiting kernel's measured choice process-wide; returns the previous override.

    For tests and A/B benchmarks: ``""`` measures each new problem once (the default),
    ``"untuned"`` takes the untuned rule (64 x 128 tiles up to 256 rows a shard, else 256 x
    128), any name of :func:`waiting_kernels` runs that kernel.

    Raises:
        ConfigError: ``name`` is none of these.
    """
    if not isinstance(name, str):
        raise ConfigError(f"set_waiting_kernel: name must be a str, got {name!r:.80}")
    return str(native().gemm.set_waiting_gemm_kernel(name))


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """One GEMM key to pre-tune: the arguments of :func:`gemm` that decide the algorithm.

    The tensors :func:`autotune` makes for it are contiguous and 256-byte aligned (like
    torch's allocations and the row chunks of the overlap ops for the shapes of docs/design.md
    §6), so the key matches a :func:`gemm` call with contiguous tensors of these shapes.

    Attributes:
        m, n, k: ``op(a)`` is ``[m, k]``, ``op(b)`` is ``[k, n]``, the output ``[m, n]``.
        dtype: dtype of a (and of b unless ``b_dtype``); default bfloat16.
        b_dtype: dtype of b when it differs (FP8 e4m3 x e5m2).
        out_dtype: as :func:`gemm`: default a's dtype (bfloat16 for FP8 inputs).
        transa, transb: as :func:`gemm` (a linear layer's forward: ``transb=True``).
        a_scaling, b_scaling: FP8 scaling modes (default ``TENSOR``).
        bias_dtype: dtype of a bias, or None for no bias.
        gelu: GELU epilogue.
        accumulate: ``beta=1`` into an existing output (non-FP8 outputs).
        out_amax: FP8 outputs: with an amax.
        fast_accum: as :func:`gemm` (None: on for per-tensor FP8).
        sm_count: SM target as :func:`gemm` (0 = all SMs).
    """

    m: int
    n: int
    k: int
    dtype: torch.dtype | None = None
    b_dtype: torch.dtype | None = None
    out_dtype: torch.dtype | None = None
    transa: bool = False
    transb: bool = False
    a_scaling: ScalingMode | None = None
    b_scaling: ScalingMode | None = None
    bias_dtype: torch.dtype | None = None
    gelu: bool = False
    accumulate: bool = False
    out_amax: bool = False
    fast_accum: bool | None = None
    sm_count: int = 0

    def __post_init__(self) -> None:
        import torch

        for name in ("m", "n", "k"):
            _check_int("GemmProblem", name, getattr(self, name), 1, 2**31 - 1)
        _check_int("GemmProblem", "sm_count", self.sm_count, 0, 2**31 - 1)
        if self.dtype is None:
            object.__setattr__(self, "dtype", torch.bfloat16)
        for name in ("dtype", "b_dtype", "out_dtype", "bias_dtype"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.dtype):
                raise ConfigError(f"GemmProblem: {name} must be a torch.dtype, got {value!r}")
        for name in ("transa", "transb", "gelu", "accumulate", "out_amax"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"GemmProblem: {name} must be a bool, got {getattr(self, name)!r}"
                )
        if self.fast_accum is not None and not isinstance(self.fast_accum, bool):
            raise ConfigError(
                f"GemmProblem: fast_accum must be a bool or None, got {self.fast_accum!r}"
            )
        for name in ("a_scaling", "b_scaling"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, ScalingMode):
                raise ConfigError(
                    f"GemmProblem: {name} must be an overlap.dtypes.ScalingMode, got {value!r}"
                )

    @classmethod
    def linear(cls, tokens: int, in_features: int, out_features: int, **kwargs: Any) -> GemmProblem:
        """A linear layer's forward ``y [tokens, out] = x [tokens, in] @ w [out, in]^T``."""
        return cls(tokens, out_features, in_features, transb=True, **kwargs)


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What :func:`autotune` did for one problem.

    Attributes:
        problem: the problem.
        status: ``"tuned"`` (timed now), ``"cached"`` (the key was already tuned: its stored
            timings), or ``"untuned"`` (see ``note``: the heuristic's first is used).
        chosen: index, in the heuristic's order, of the algorithm now cached.
        times_ms: median milliseconds of each candidate in the heuristic's order (None: it
            could not run); empty when untuned.
        note: why a problem is untuned, or which candidates could not run.
    """

    problem: GemmProblem
    status: Literal["tuned", "cached", "untuned"]
    chosen: int
    times_ms: tuple[float | None, ...]
    note: str

    @property
    def speedup(self) -> float | None:
        """The heuristic's first time over the chosen one's (>= 1), when both ran."""
        if not self.times_ms or self.times_ms[0] is None or self.times_ms[self.chosen] is None:
            return None
        return self.times_ms[0] / self.times_ms[self.chosen]


def _problem_tensors(p: GemmProblem, device: torch.device) -> dict[str, Any]:
    """Random inputs (and an output) of p's shapes on device, as gemm() keywords."""
    import torch

    def matrix(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        x = torch.randn(rows, cols, device=device)
        return (x if is_fp8(dtype) else x * 0.1).to(dtype)

    def scale_inv(data: torch.Tensor, mode: ScalingMode | None) -> torch.Tensor | None:
        if not is_fp8(data.dtype):
            return None
        rows, cols = data.shape
        if mode in (None, ScalingMode.TENSOR):
            shape = (1,)
        elif mode == ScalingMode.BLOCK_1X128:
            shape = (rows, -(-cols // 128))
        elif mode == ScalingMode.BLOCK_128X128:
            shape = (-(-rows // 128), -(-cols // 128))
        else:
            shape = (1,)  # MXFP8: the GEMM refuses it, naming the fallback
        return torch.rand(shape, device=device) * 0.01 + 0.005

    b_dtype = p.b_dtype or p.dtype
    a = matrix(*((p.k, p.m) if p.transa else (p.m, p.k)), p.dtype)
    b = matrix(*((p.n, p.k) if p.transb else (p.k, p.n)), b_dtype)
    out_dtype = p.out_dtype or (torch.bfloat16 if is_fp8(p.dtype) else p.dtype)
    out = (
        matrix(p.m, p.n, out_dtype)
        if p.accumulate
        else torch.empty(p.m, p.n, dtype=out_dtype, device=device)
    )
    kw: dict[str, Any] = {
        "transa": p.transa,
        "transb": p.transb,
        "out": out,
        "beta": 1.0 if p.accumulate else 0.0,
        "gelu": p.gelu,
        "a_scaling": p.a_scaling,
        "b_scaling": p.b_scaling,
        "a_scale_inv": scale_inv(a, p.a_scaling),
        "b_scale_inv": scale_inv(b, p.b_scaling),
        "fast_accum": p.fast_accum,
        "sm_count": p.sm_count,
    }
    if p.bias_dtype is not None:
        kw["bias"] = (torch.randn(p.n, device=device) * 0.1).to(p.bias_dtype)
    if is_fp8(out_dtype):
        kw["out_scale"] = torch.ones(1, device=device)
        if p.out_amax:
            kw["out_amax"] = torch.zeros(1, device=device)
    return {"a": a, "b": b, **kw}


def autotune(
    problems: Iterable[GemmProblem],
    *,
    device: int | torch.device | None = None,
    max_candidates: int | None = None,
    rounds: int | None = None,
) -> list[TuneResult]:
    """Pre-tune GEMM keys, e.g. at start-up before the first pipelined overlap op.

    Each problem runs once on random inputs of its shapes; its key is tuned whatever the
    process-wide switch says (keys already tuned are reported as ``"cached"``; call
    :func:`clear_gemm_cache` first to re-tune). Later :func:`gemm` calls and overlap-op GEMMs
    of the same keys hit the cache. Synchronises the current stream of the device before each
    problem, so that the timings see a quiet stream; work queued on other streams competes
    with them. Must not be called while a stream of the device is capturing a CUDA graph.

    Args:
        problems: the keys to tune.
        device: CUDA device (default: the current one).
        max_candidates, rounds: override the process-wide :class:`AutotuneConfig` values.

    Returns:
        One :class:`TuneResult` per problem, in order.

    Raises:
        ConfigError: a problem or override is invalid.
        InvalidArgumentError / UnsupportedHardwareError: a problem is not a valid GEMM on
            this device (as :func:`gemm` would raise).
        UnsupportedHardwareError: no CUDA device.
    """
    import torch

    from overlap._native import require_cuda

    problems = list(problems)
    for p in problems:
        if not isinstance(p, GemmProblem):
            raise ConfigError(f"autotune: expected overlap.gemm.GemmProblem items, got {p!r:.80}")
    current = get_autotune_config()
    config = AutotuneConfig(
        enabled=True,
        max_candidates=current.max_candidates if max_candidates is None else max_candidates,
        rounds=current.rounds if rounds is None else rounds,
    )
    if device is None:
        require_cuda("overlap.gemm.autotune")
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if dev.type != "cuda":
            raise InvalidArgumentError(f"autotune: device must be a CUDA device, got {device!r}")
        require_cuda("overlap.gemm.autotune")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    results = []
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        for p in problems:
            t = _problem_tensors(p, dev)
            stream.synchronize()
            _, record = _gemm(t.pop("a"), t.pop("b"), **t, stream=stream, tune=config)
            times = tuple(None if ms < 0 else ms for ms in record["times_ms"])
            results.append(TuneResult(p, record["status"], record["chosen"], times, record["note"]))
            del t
    return results

"""AG -> GEMM: a sequence-parallel input gathered while the GEMM consumes it.

``Y[M, N] = AllGather(x_shard)[M, K] @ weight[N, K].T`` over a TP group of size ``tp``, with
``M = tp * m`` (every rank gives ``m`` rows). Each peer's shard is pushed into this rank's
symmetric buffer by the copy engines while earlier chunks are multiplied; the GEMM of chunk
``j`` (rank ``j``'s rows) starts as soon as that chunk's flag says it has landed, and writes
rows ``[j m, (j + 1) m)`` of ``Y`` directly. Several weights that read the same input (Q, K
and V, or gate and up) share one gather: ``op(x_shard, [w_q, w_k, w_v])`` multiplies each
landed chunk by every weight and returns one output per weight. NOTE [ag_gemm schedule] in
``csrc/comm/overlap/ag_gemm.cpp`` has the stream timeline.

Stream contract (NOTE [stream contract] in :mod:`overlap.comm.communicator`): on the cuda
transport the op waits for work already issued on the current stream of the input's device,
runs on it (its compute and copy lanes fork from it and join back) and returns without
synchronising the host. The host transport runs it synchronously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError, StateError
from overlap.ops._gathered import CallRecord, GatherState, gathered_input, gathered_scale_invs
from overlap.ops._operands import (
    Operand,
    call_key,
    check_flag,
    check_given_buffer,
    check_lanes,
    check_op_dtype,
    check_pair,
    check_pieces,
    check_sizes,
    default_fast_accum,
    is_fp8,
    op_device,
    split_as,
    split_of,
    split_operand,
    stream_getter,
    stream_of,
    travels_as,
    tuning,
    weight_transposed,
)
from overlap.quantization import QuantizedTensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from overlap.comm import Communicator, SymmetricBuffer

__all__ = ["AllGatherGemm"]

_OP = "ag_gemm"


class AllGatherGemm:
    """``Y = AllGather(x_shard) @ weight.T`` with the all-gather hidden behind the GEMM.

    Args:
        comm: the TP group's communicator (host or cuda transport).
        max_tokens: the largest gathered row count ``M = tp * m`` a call may use.
        in_features: ``K``, the shard's columns.
        dtype: the dtype the shard travels in: bfloat16/float16/float32, or an FP8 dtype for
            per-tensor FP8 shards (given as :class:`~overlap.quantization.QuantizedTensor`).
        compute_lanes: streams the chunk GEMMs alternate over (1 to the core's
            ``MAX_COMPUTE_LANES``); with 2, a chunk's GEMM starts as soon as it has landed, even
            while the previous chunk's GEMM runs.
        staggered_puts: push the shard to one peer after the other instead of to all at once:
            the first peer chunk lands sooner (NOTE [ag_gemm schedule]). Same result. Where
            the gather takes about as long as the GEMM, all at once was much slower; with TP = 2
            (one peer) both are the same (docs/performance-log.md [ag_gemm op defaults]).
        pieces: pieces each peer's shard travels and is multiplied in (1 to ``MAX_PIECES``;
            NOTE [ag_gemm pieces]): a piece's GEMM starts once it has landed, so where the
            gather takes about as long as the GEMM the op ends sooner; smaller GEMMs are less
            efficient, so GEMM-bound shapes want 1. Every rank must use the same value. Same
            result.
        pull_shards: each rank copies its shard into its own slot of the buffer and the peers
            pull it (NOTE [ag_gemm pulls]): the ranks meet twice in one-block handshake
            kernels on the caller's stream (before the copy, and once every shard and FP8
            scale_inv is in place), then one copy-engine lane pulls the peers' shards, rank
            r+1's first, each chunk's GEMMs following its pull; ``staggered_puts`` and
            ``put_split`` do not apply. A few percent slower than the pushes on the AG rows of
            the suite (docs/performance-log.md [ag_gemm op defaults]). Every rank must use the
            same value (a collective mismatch otherwise). Same result.
        keep_gathered: the calls' default for their ``keep_gathered`` (whether the whole
            gathered input stays in the buffer for :meth:`gathered_input`).
        fused_gemm: with ``pull_shards`` only: ONE waiting GEMM kernel multiplies every chunk,
            each as soon as its pull has landed (NOTE [fused ag_gemm]): no GEMM launch, wait
            or join per chunk; ``compute_lanes`` does not apply. bfloat16 input, weights and
            output, ``weight_layout="nk"``, no bias or GELU, one ``alpha``; on CUDA, Hopper
            and a build with CUTLASS's headers (``native().gemm.waiting_gemm_built()``).
            Anything else raises :class:`UnsupportedHardwareError` before any communication.
            Ranks may differ in this setting. Same result up to the GEMM's rounding.

        A tuning argument left ``None`` takes the op's default at any TP size, defined in the
        C++ core (``AgGemmConfig`` in ``csrc/comm/overlap/overlap_ops.h``, NOTE [overlap
        defaults]; :func:`~overlap.initialize_ub` takes its TP size's, NOTE [ub tp 2]): 2
        compute lanes, staggered pushes, one piece, no pulls, the gathered input not kept, no
        fused GEMM.
        name: the buffer's name (error messages).
        buffer: optional symmetric buffer of ``comm`` to run on instead of creating one (at
            least :meth:`buffer_bytes` bytes; see NOTE [shared op buffers]).

    Construction is COLLECTIVE over the group (it creates the op's symmetric buffer). The
    object owns the buffer it created: :meth:`destroy` frees it.

    NOTE [shared op buffers]: ops that never run concurrently (e.g. the AG+GEMMs of one
    transformer layer, which run one after another) may share one buffer given as
    ``buffer=``. The op then does not own it (:meth:`destroy` leaves it alone), and the
    buffer's contents (:meth:`gathered_input`) are only defined until the next op of ANY
    object on that buffer.
    """

    @staticmethod
    def buffer_bytes(tp: int, max_tokens: int, in_features: int, dtype: torch.dtype) -> int:
        """Bytes per rank of the buffer an op of these arguments needs."""

        itemsize = dtype.itemsize
        shard_bytes = -(-int(max_tokens) // tp) * int(in_features) * itemsize
        _, nbytes = native().comm_ops.ag_gemm_layout(tp, shard_bytes, is_fp8(dtype))
        return int(nbytes)

    def __init__(
        self,
        comm: Communicator,
        max_tokens: int,
        in_features: int,
        dtype: torch.dtype,
        *,
        compute_lanes: int | None = None,
        staggered_puts: bool | None = None,
        pieces: int | None = None,
        pull_shards: bool | None = None,
        keep_gathered: bool | None = None,
        fused_gemm: bool | None = None,
        name: str = "ag_gemm",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_OP, tp, max_tokens, ("in_features", in_features))
        check_op_dtype(_OP, "dtype", dtype, fp8=True)
        d = tuning().ag_gemm_defaults(0)  # the op's defaults at any size (NOTE [ub tp 2])
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.in_features = int(in_features)
        self.dtype = dtype
        self.compute_lanes = check_lanes(
            _OP, d.compute_lanes if compute_lanes is None else compute_lanes
        )
        self.staggered_puts = check_flag(
            _OP, "staggered_puts", d.staggered_puts if staggered_puts is None else staggered_puts
        )
        self.pieces = check_pieces(_OP, d.pieces if pieces is None else pieces)
        self.pull_shards = check_flag(
            _OP, "pull_shards", d.pull_shards if pull_shards is None else pull_shards
        )
        self.keep_gathered = check_flag(
            _OP, "keep_gathered", d.keep_gathered if keep_gathered is None else keep_gathered
        )
        self.fused_gemm = check_flag(
            _OP, "fused_gemm", d.fused_gemm if fused_gemm is None else fused_gemm
        )
        if self.fused_gemm and not self.pull_shards:
            raise InvalidArgumentError(
                f"{_OP}: fused_gemm runs on the pulls; set pull_shards=True as well"
            )
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.in_features, dtype)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_OP, self.buffer, tp, nbytes)
        self._calls = CallRecord()  # the last call's gather (and whether it kept it whole)
        self._plan: _AgPlan | None = None  # the last checked call's plan (NOTE [op plans])
        self._stream = stream_getter(self.device)
        self._cuda = self.device.type == "cuda"

    def __call__(
        self,
        x_shard: Operand,
        weight: Operand | Sequence[Operand],
        *,
        bias: torch.Tensor | Sequence[torch.Tensor | None] | None = None,
        gelu: bool = False,
        alpha: float = 1.0,
        out: torch.Tensor | Sequence[torch.Tensor] | None = None,
        out_dtype: torch.dtype | None = None,
        fast_accum: bool | None = None,
        sm_count: int = 0,
        keep_gathered: bool | None = None,
        weight_layout: str = "nk",
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """COLLECTIVE: ``Y = epilogue(alpha * AllGather(x_shard) @ weight.T + bias)``.

        ``weight`` may be a list or tuple of weights (Q, K and V, or gate and up: GEMMs that
        read the same input): the input is gathered once, each landed chunk is multiplied by
        every weight, and one output per weight is returned (NOTE [ag_gemm schedule]).

        Args:
            x_shard: this rank's ``[m, K]`` rows (contiguous), of the op's ``dtype``; FP8 as
                a :class:`QuantizedTensor` with rowwise per-tensor data (E4M3 or E5M2 on an
                op of either FP8 dtype): its scale_inv travels with it and chunk ``j``'s GEMM
                uses rank ``j``'s scale_inv.
                ``m`` may be any count (not a multiple of 128) with ``tp * m <= max_tokens``;
                every rank passes the same ``m``.
            weight: ``[N, K]`` (a linear layer's weight; unit column stride), the input's
                dtype, or per-tensor FP8 with an FP8 input; or a non-empty list/tuple of such
                weights ``[N_w, K]`` (each FP8 one with its own scale_inv). With
                ``weight_layout="kn"``: ``[K, N]``, multiplied as it is.
            bias: optional ``[N]`` (cuBLASLt's rules: out's dtype, bf16 for FP8 inputs); with
                several weights, a list/tuple of one optional bias per weight.
            gelu: tanh-approximated GELU after the bias (every weight's output).
            alpha: scale of the product (every weight's).
            out: optional contiguous ``[tp * m, N]`` output (poisoned or not: every row is
                written); with several weights, a list/tuple of one ``[tp * m, N_w]`` per
                weight.
            out_dtype: dtype of the allocated outputs (default: the input's, bfloat16 for
                FP8). FP8 outputs are not supported.
            fast_accum: FP8 only (default on, as :func:`overlap.gemm.gemm`).
            sm_count: SMs the chunk GEMMs plan for (0 = all).
            keep_gathered: also leave the whole gathered input ``[tp * m, K]`` in the buffer
                for :meth:`gathered_input` (e.g. for a wgrad that does not re-gather; None:
                the op's ``keep_gathered``). It costs this rank's shard
                copied into its own slot beside the pushes, which share the copy engines with
                it: up to 8% of the op where the gather is about as long as the GEMM (NOTE
                [ag_gemm own slot]). With ``pull_shards`` the buffer always holds it. Each
                rank decides for itself.
            weight_layout: ``"nk"`` (default: ``Y = X W^T``) or ``"kn"`` (``Y = X W``, e.g. a
                dgrad ``dX = dY W`` with the layer's own ``[N, K]`` weight; high precision
                only on Hopper). Every weight of the call has this layout.

        Returns:
            ``out`` ``[tp * m, N]``, or a tuple of one output per weight when ``weight`` is a
            list/tuple. With ``keep_gathered`` (or ``pull_shards``), the gathered input stays
            in the buffer until the next call: :meth:`gathered_input`.

        Raises:
            InvalidArgumentError / UnsupportedHardwareError: before any communication (every
                weight, bias and output is checked first), with the buffer left usable.
            CommTimeoutError: a peer did not take part in time (cuda: raised by the next op
                or ``comm.synchronize()``).
        """
        keep = self.keep_gathered if keep_gathered is None else bool(keep_gathered)
        several = isinstance(weight, (list, tuple))
        weights = list(weight) if several else [weight]  # type: ignore[list-item]
        biases = _per_weight("bias", bias, several, len(weights))
        outs = _per_weight("out", out, several, len(weights))
        key = call_key(
            (x_shard, *weights, *biases, *outs),
            (several, gelu, alpha, out_dtype, fast_accum, sm_count, weight_layout, self.tp,
             self.dtype, self.in_features, self.max_tokens),
        )  # fmt: skip
        plan = self._plan
        if plan is not None and plan.key == key:  # the fast path (NOTE [op plans])
            import torch

            a, a_scale_inv = split_as(x_shard, plan.splits[0])
            bs, b_scale_invs = [], []
            for w, how in zip(weights, plan.splits[1:], strict=True):
                b, b_scale_inv = split_as(w, how)
                bs.append(b)
                b_scale_invs.append(b_scale_inv)
            for i, shape in plan.allocs:
                outs[i] = torch.empty(shape, dtype=plan.alloc_dtype, device=self.device)
            return self._issue(
                plan, a=a, a_scale_inv=a_scale_inv, bs=bs, b_scale_invs=b_scale_invs, outs=outs,
                biases=biases, several=several, gelu=gelu, alpha=alpha, fast_accum=fast_accum,
                sm_count=sm_count, keep=keep, stream=self._stream(),
            )  # fmt: skip
        return self._call_checked(
            key, x_shard, weights, biases=biases, outs=outs, several=several, gelu=gelu,
            alpha=alpha, out_dtype=out_dtype, fast_accum=fast_accum, sm_count=sm_count,
            keep=keep, weight_layout=weight_layout,
        )  # fmt: skip

    def _issue(
        self,
        plan: _AgPlan,
        *,
        a: torch.Tensor,
        a_scale_inv: torch.Tensor | None,
        bs: list[torch.Tensor],
        b_scale_invs: list,
        outs: list,
        biases: list,
        several: bool,
        gelu: bool,
        alpha: float,
        fast_accum: bool | None,
        sm_count: int,
        keep: bool,
        stream: int,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The native op and its CallRecord entry, as both paths issue it (NOTE [op plans]):
        ``plan`` gives what the checks derived, the call everything else."""
        native().comm_ops.ag_gemm(
            self.buffer._core,
            a,
            bs,
            outs,
            transb=plan.transb,
            a_scale_inv=a_scale_inv,
            b_scale_inv=b_scale_invs,
            bias=biases,
            gelu=gelu,
            alpha=float(alpha),
            fast_accum=default_fast_accum(fast_accum, plan.fp8),
            sm_count=int(sm_count),
            compute_lanes=self.compute_lanes,
            staggered_puts=self.staggered_puts,
            pieces=self.pieces,
            pull_shards=self.pull_shards,
            keep_gathered=keep,
            fused_gemm=self.fused_gemm,
            stream=stream,
        )
        self._calls.note(self.buffer, plan.last_gather, keep or self.pull_shards, self._cuda)
        return tuple(outs) if several else outs[0]

    def _call_checked(
        self,
        key: tuple | None,
        x_shard: Operand,
        weights: list[Operand],
        *,
        biases: list,
        outs: list,
        several: bool,
        gelu: bool,
        alpha: float,
        out_dtype: torch.dtype | None,
        fast_accum: bool | None,
        sm_count: int,
        keep: bool,
        weight_layout: str,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The slow path: every check, then the op; records the call's plan (NOTE [op
        plans]) once the native op has accepted it."""
        import torch

        if not weights:
            raise InvalidArgumentError(f"{_OP}: weight is an empty list")
        transb = weight_transposed(_OP, weight_layout)
        a, a_scale_inv = split_operand(_OP, "the input", x_shard)
        m, k = a.shape
        if (
            not travels_as(a.dtype, self.dtype)
            or k != self.in_features
            or m * self.tp > self.max_tokens
        ):
            raise InvalidArgumentError(
                f"{_OP}: x_shard {a.dtype}[{m}, {k}] does not fit this op: dtype "
                f"{self.dtype}, K = {self.in_features}, tp * m <= {self.max_tokens} (tp = "
                f"{self.tp})"
            )
        if not a.is_contiguous():
            raise InvalidArgumentError(f"{_OP}: x_shard must be contiguous")
        alloc_dtype = out_dtype or (torch.bfloat16 if is_fp8(a.dtype) else a.dtype)
        bs, b_scale_invs, allocs = [], [], []
        for i, w in enumerate(weights):
            op = f"{_OP} (weight {i})" if several else _OP
            b, b_scale_inv = split_operand(op, "the weight", w)
            check_pair(op, a, b, self.device)
            k_axis = 1 if transb else 0
            if b.shape[k_axis] != k:
                want = f"[N, {k}]" if transb else f"[{k}, N]"
                raise InvalidArgumentError(
                    f"{op}: weight {tuple(b.shape)} must be {want} (K = x_shard's columns; "
                    f"weight_layout={weight_layout!r})"
                )
            shape = (self.tp * m, b.shape[1 - k_axis])
            o = outs[i]
            if o is None:
                allocs.append((i, shape))
            elif tuple(o.shape) != shape or (out_dtype is not None and o.dtype != out_dtype):
                raise InvalidArgumentError(
                    f"{op}: out must be [{shape[0]}, {shape[1]}]"
                    + (f" of {out_dtype}" if out_dtype is not None else "")
                    + f", got {o.dtype}{list(o.shape)}"
                )
            bs.append(b)
            b_scale_invs.append(b_scale_inv)
        for i, shape in allocs:
            outs[i] = torch.empty(shape, dtype=alloc_dtype, device=self.device)
        fmt = x_shard.rowwise_format if isinstance(x_shard, QuantizedTensor) else None
        hp_dtype = x_shard.dtype if isinstance(x_shard, QuantizedTensor) else a.dtype
        plan = _AgPlan(
            key=key,
            splits=[split_of(t) for t in (x_shard, *weights)],
            allocs=allocs,
            alloc_dtype=alloc_dtype,
            transb=transb,
            fp8=is_fp8(a.dtype),
            last_gather=(m, hp_dtype, fmt),
        )
        result = self._issue(
            plan, a=a, a_scale_inv=a_scale_inv, bs=bs, b_scale_invs=b_scale_invs, outs=outs,
            biases=biases, several=several, gelu=gelu,
            alpha=alpha, fast_accum=fast_accum, sm_count=sm_count, keep=keep,
            stream=stream_of(self.device),
        )  # fmt: skip
        if key is not None:
            self._plan = plan
        return result

    def gathered_input(self, *, check_scales: bool = True) -> torch.Tensor | QuantizedTensor:
        """The input gathered by the last call: ``[tp * m, K]``, a view of the buffer (FP8:
        a :class:`QuantizedTensor` with the one scale_inv every rank's shard must share).

        Valid until the next op on this object (docs/design.md §3, invariant 2: never save it for
        backward; copy it, or save the shard and re-gather). On cuda, read it on the stream
        of the call (or after it); the FP8 scale check reads the scales on the host
        (``check_scales=False`` skips it, for shards quantized with a shared amax).

        Raises:
            StateError: before the first call, after a call without ``keep_gathered`` (push
                mode: this rank's own slot was not written), or FP8 shards whose scale_invs
                differ (:meth:`gathered_scale_invs` has them).
        """
        return gathered_input(self._gather_state(), check_scales=check_scales)

    def gathered_scale_invs(self) -> torch.Tensor:
        """FP8: the float32 ``[tp]`` scale_invs of the last call's shards, from the buffer
        (the last call must have kept the gathered input, as for :meth:`gathered_input`)."""
        return gathered_scale_invs(self._gather_state())

    def _gather_state(self) -> GatherState:
        last, generation, kept = self._calls.current(self.buffer)
        if last is not None and not kept:
            raise StateError(
                f"{_OP}: the last call did not keep the gathered input (its own slot was not "
                "written); pass keep_gathered=True to the call whose gathered input you need "
                "(or construct the op with keep_gathered=True)"
            )
        return GatherState(
            _OP, self.buffer, self.tp, self.dtype, self.in_features, last, generation
        )

    def destroy(self) -> None:
        """Free the buffer if the op created it (not a ``buffer=`` given to it). Idempotent;
        not collective."""
        if self._owns_buffer:
            self.buffer.destroy()


@dataclass(frozen=True)
class _AgPlan:
    """What a checked call of :class:`AllGatherGemm` derived, for the calls of its key (NOTE
    [op plans]); it holds no tensor."""

    key: tuple | None
    splits: list  # the Split of the input, then of every weight
    allocs: list  # (weight index, shape) of every output the op allocates
    alloc_dtype: torch.dtype
    transb: bool  # of the weight layout
    fp8: bool  # FP8 operands: fast_accum's default
    last_gather: tuple  # CallRecord's LastGather of such a call


def _per_weight(what: str, value: object, several: bool, count: int) -> list:
    """``value`` as a list of one entry per weight: itself for a single weight; with several
    weights, ``None`` (none for every weight) or a list/tuple of ``count`` entries."""
    if not several:
        return [value]
    if value is None:
        return [None] * count
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise InvalidArgumentError(
            f"{_OP}: with {count} weights, {what} must be None or a list/tuple of {count} "
            f"entries (one per weight), got {type(value).__name__}"
            + (f" of {len(value)}" if isinstance(value, (list, tuple)) else "")
        )
    return list(value)

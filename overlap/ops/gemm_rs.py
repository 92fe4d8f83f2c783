"""GEMM -> RS: a row-parallel layer's partial sums reduce-scattered while they are computed.

``Y_shard[M / tp, N] = ReduceScatter(x[M, K_shard] @ weight_shard[N, K_shard].T)`` over a TP
group of size ``tp``: rank ``r`` keeps rows ``[r M/tp, (r + 1) M/tp)`` of the sum over ranks.
Two methods (:class:`RsMethod`), the same result up to rounding:

* ``"pipelined"`` (the default): each rank computes its partial sums chunk by chunk (the rows
  destined to rank ``r+1`` first, its own last), straight into its symmetric buffer, and
  signals each chunk to its rank, whose copy engines pull it while the next chunk is computed;
  each rank then sums its chunk of all ranks in rank order with fp32 accumulation (the same
  result on every rank, whichever rank computed it). NOTE [gemm_rs schedule] in
  ``csrc/comm/overlap/gemm_rs.cpp`` has the timeline. With ``pieces`` > 1 the chunks are
  computed in rounds of one piece each, every piece pulled and summed while later rounds are
  computed (NOTE [gemm_rs pieces]): for shapes whose reduce-scatter takes about as long as the
  GEMM.
* ``"ring"``: each chunk's running sum travels the ring (rank ``c+1`` to ``c+2`` ... to its
  owner ``c``); every rank adds its partial with the GEMM's own ``beta = 1`` epilogue (fp32
  inside the GEMM) and pushes the sum on by copy engine (or, with ``pull_shards``, the next
  rank pulls it), in sub-chunks so that the transfers hide behind the GEMMs. No reduction
  kernel (FP8 outputs: one cast of the final chunk). The running sum is rounded to the partial
  dtype at every hop, so results differ from the pipelined method's in the last bits (NOTE
  [gemm_rs_ring numerics] in ``csrc/comm/overlap/gemm_rs_ring.cpp``, which also has the
  timeline).

Stream contract: as :class:`~overlap.ops.AllGatherGemm` (the current stream of the input's
device; no host synchronisation on cuda; synchronous on the host transport).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError
from overlap.ops._operands import (
    Operand,
    call_key,
    check_count,
    check_flag,
    check_given_buffer,
    check_lanes,
    check_op_dtype,
    check_pieces,
    check_sizes,
    default_fast_accum,
    is_fp8,
    op_device,
    prepare,
    split_as,
    split_of,
    stream_getter,
    stream_of,
    tuning,
    weight_transposed,
)

if TYPE_CHECKING:
    import torch

    from overlap.comm import Communicator, SymmetricBuffer

__all__ = ["GemmReduceScatter", "RsMethod", "partial_dtype"]

_OP = "gemm_rs"


class RsMethod(str, enum.Enum):
    """How :class:`GemmReduceScatter` moves and sums the partial sums (the core's
    ``RsMethod``, which crosses the binding as its enum, member for member)."""

    PIPELINED = "pipelined"  # chunks pulled by their rank, summed by one reduction kernel
    RING = "ring"  # running sums travel the ring, summed by the GEMMs' beta = 1 epilogue

    @property
    def native(self) -> object:
        """The binding's ``RsMethod`` member of the same name (remembered: every call reads
        it)."""
        member = _NATIVE_METHODS.get(self._value_)
        if member is None:
            member = _NATIVE_METHODS[self._value_] = getattr(tuning().RsMethod, self.name)
        return member

    @classmethod
    def of_native(cls, value: object) -> RsMethod:
        """The member of a binding ``RsMethod`` value."""
        return cls[value.name]  # type: ignore[attr-defined]


_NATIVE_METHODS: dict[str, object] = {}  # RsMethod value -> the binding's member


def rs_method(value: RsMethod | str | None) -> RsMethod:
    """``value`` as an :class:`RsMethod` (its value string is accepted; None: the default
    method of any TP size, ``gemm_rs_default(0)`` of the core)."""
    if value is None:
        return RsMethod.of_native(tuning().gemm_rs_default(0).method)
    try:
        return RsMethod(value)
    except ValueError:
        raise InvalidArgumentError(
            f"{_OP}: method must be one of {[m.value for m in RsMethod]}, got {value!r}"
        ) from None


def partial_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The dtype partial sums travel in: the output's, bfloat16 for an FP8 output."""
    import torch

    return torch.bfloat16 if is_fp8(out_dtype) else out_dtype


class GemmReduceScatter:
    """``Y_shard = ReduceScatter(x @ weight.T)`` with the reduce-scatter hidden behind the GEMM.

    Args:
        comm: the TP group's communicator (host or cuda transport).
        max_tokens: the largest ``M`` (rows of ``x``) a call may use.
        out_features: ``N``.
        out_dtype: bfloat16/float16/float32, or an FP8 dtype (the sum is cast with a scale
            given at the call; partial sums travel in bfloat16).
        compute_lanes: streams the chunk GEMMs alternate over (1 to the core's
            ``MAX_COMPUTE_LANES``; 1 finishes each chunk, and thus each transfer, earliest).
        reduce_max_blocks: bound on the reduction kernel's grid (0: fill the GPU; the ring
            method's FP8 cast only).
        method: ``"pipelined"`` or ``"ring"`` (:class:`RsMethod`).
        ring_subchunks: ``"ring"`` only: sub-chunks each hop is pipelined in (1 to
            ``MAX_RING_SUBCHUNKS``; NOTE [gemm_rs_ring schedule]; 2: a chunk's transfer hides
            behind a GEMM as long as it is no slower than that GEMM).
        pieces: ``"pipelined"`` only: rounds the chunks are computed, pulled and summed in (1
            to ``MAX_PIECES``; NOTE [gemm_rs pieces]): the pulls start sooner and the
            reductions of all but the last round run beside the GEMMs, for GEMMs 1/pieces as
            tall. One piece was the fastest on NVSwitch for every shape measured; more pieces
            are meant for links that a single peer's pull cannot fill (docs/performance-log.md
            [gemm_rs op defaults]).
        pull_shards: ``"ring"`` only: each rank leaves its running sums in its own buffer
            and the next rank pulls them (NOTE [gemm_rs_ring pulls]), instead of pushing them
            to it: the fastest method on most TP 2 GEMM+RS rows of the suite, the FP8 rows
            with the smallest GEMMs among them (docs/performance-log.md [gemm_rs op
            defaults]). The pipelined method always pulls.

        A tuning argument left ``None`` takes the op's default, defined in the C++ core
        (``GemmRsConfig`` / ``GemmRsRingConfig`` / ``GemmRsDefault`` in
        ``csrc/comm/overlap/overlap_ops.h``, NOTE [overlap defaults]): the pipelined method, one
        compute lane, the reduction filling the GPU, one piece; the ring in 2 sub-chunks,
        pushed.
        name: the buffer's name (error messages).
        buffer: optional symmetric buffer of ``comm`` to run on instead of creating one (at
            least :meth:`buffer_bytes` bytes; NOTE [shared op buffers] in
            :mod:`overlap.ops.ag_gemm`).

    Construction is COLLECTIVE (it creates the op's symmetric buffer); :meth:`destroy`
    frees the buffer it created (never a given one).
    """

    @staticmethod
    def buffer_bytes(
        tp: int,
        max_tokens: int,
        out_features: int,
        out_dtype: torch.dtype,
        method: RsMethod | str | None = None,
    ) -> int:
        """Bytes per rank of the buffer an op of these arguments needs (the ring method ``tp``
        partial slots, the pipelined one ``2 tp - 1``: NOTE [gemm_rs layout])."""

        itemsize = partial_dtype(out_dtype).itemsize
        partial_bytes = (int(max_tokens) // tp) * int(out_features) * itemsize
        ops = native().comm_ops
        layout = (
            ops.gemm_rs_ring_layout if rs_method(method) is RsMethod.RING else ops.gemm_rs_layout
        )
        _, _, nbytes = layout(tp, partial_bytes)
        return int(nbytes)

    def __init__(
        self,
        comm: Communicator,
        max_tokens: int,
        out_features: int,
        out_dtype: torch.dtype,
        *,
        compute_lanes: int | None = None,
        reduce_max_blocks: int | None = None,
        method: RsMethod | str | None = None,
        ring_subchunks: int | None = None,
        pieces: int | None = None,
        pull_shards: bool | None = None,
        name: str = "gemm_rs",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_OP, tp, max_tokens, ("out_features", out_features))
        self.method = rs_method(method)
        ring = self.method is RsMethod.RING
        t = tuning()
        # The op's defaults at any size; the method's own apply (NOTE [overlap defaults]).
        d = t.gemm_rs_ring_defaults(0) if ring else t.gemm_rs_defaults(0)
        ring_d = t.gemm_rs_ring_defaults(0)
        self.ring_subchunks = check_count(
            _OP,
            "ring_subchunks",
            ring_d.ring_subchunks if ring_subchunks is None else ring_subchunks,
            1,
            t.MAX_RING_SUBCHUNKS,
        )
        if pieces is not None and ring and check_pieces(_OP, pieces) != 1:
            raise InvalidArgumentError(
                f"{_OP}: pieces apply to the pipelined method; the ring method pipelines its "
                f"hops with ring_subchunks (got pieces={pieces})"
            )
        self.pieces = check_pieces(_OP, t.gemm_rs_defaults(0).pieces if pieces is None else pieces)
        self.pull_shards = check_flag(
            _OP, "pull_shards", ring_d.pull_shards if pull_shards is None else pull_shards
        )
        if self.pull_shards and not ring:
            raise InvalidArgumentError(
                f"{_OP}: pull_shards applies to the ring method (the pipelined method always pulls)"
            )
        check_op_dtype(_OP, "out_dtype", out_dtype, fp8=True)
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.out_features = int(out_features)
        self.out_dtype = out_dtype
        self.compute_lanes = check_lanes(
            _OP, d.compute_lanes if compute_lanes is None else compute_lanes
        )
        self.reduce_max_blocks = check_count(
            _OP,
            "reduce_max_blocks",
            d.reduce_max_blocks if reduce_max_blocks is None else reduce_max_blocks,
            0,
        )
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.out_features, out_dtype, self.method)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_OP, self.buffer, tp, nbytes)
        self._plan: _RsPlan | None = None  # the last checked call's plan (NOTE [op plans])
        self._stream = stream_getter(self.device)

    def __call__(
        self,
        x: Operand,
        weight: Operand,
        *,
        alpha: float = 1.0,
        out: torch.Tensor | None = None,
        out_scale: torch.Tensor | None = None,
        out_amax: torch.Tensor | None = None,
        out_scale_inv: torch.Tensor | None = None,
        fast_accum: bool | None = None,
        sm_count: int = 0,
        weight_layout: str = "nk",
    ) -> torch.Tensor:
        """COLLECTIVE: this rank's rows of ``sum over ranks (alpha * x @ weight.T)``.

        Every rank must use the same method (and ``ring_subchunks`` / ``pieces`` /
        ``pull_shards``) on a buffer: a mismatch is reported as a collective mismatch
        (``StateError``) where the op records catch it.

        Args:
            x: ``[M, K_shard]`` (unit column stride), bfloat16/float16/float32 or a per-tensor
                FP8 :class:`~overlap.quantization.QuantizedTensor`. ``M`` must be a multiple of
                the TP size (not necessarily of 128) and ``<= max_tokens``; the same on every
                rank.
            weight: ``[N, K_shard]``, the input's dtype (or per-tensor FP8 with an FP8 input).
            alpha: scale of the product.
            out: optional contiguous ``[M / tp, N]`` of the op's ``out_dtype``.
            out_scale: FP8 outputs only, required: float32 ``[1]``; ``out = fp8(sum * scale)``.
            out_amax: FP8 outputs only, optional float32 ``[1]``: receives ``max |sum|``.
            out_scale_inv: FP8 outputs only, optional float32 ``[1]``: receives ``1 / scale``.
            fast_accum: FP8 inputs only (default on, as :func:`overlap.gemm.gemm`).
            sm_count: SMs the chunk GEMMs plan for (0 = all).
            weight_layout: ``"nk"`` (default, ``weight`` is ``[N, K_shard]``) or ``"kn"``
                (``weight`` is ``[K_shard, N]``, multiplied as it is: ``x @ weight``; high
                precision only on Hopper).

        Returns:
            ``out`` ``[M / tp, N]``.

        Raises:
            InvalidArgumentError / UnsupportedHardwareError: before any communication, with
                the buffer left usable (e.g. ``M`` not a multiple of the TP size).
            CommTimeoutError: a peer did not take part in time.
        """
        key = call_key(
            (x, weight, out, out_scale, out_amax, out_scale_inv),
            (alpha, fast_accum, sm_count, weight_layout, self.tp, self.max_tokens,
             self.out_features, self.out_dtype),
        )  # fmt: skip
        plan = self._plan
        if plan is not None and plan.key == key:  # the fast path (NOTE [op plans])
            a, a_scale_inv = split_as(x, plan.splits[0])
            b, b_scale_inv = split_as(weight, plan.splits[1])
            if out is None:
                import torch

                out = torch.empty(plan.shape, dtype=self.out_dtype, device=self.device)
            return self._issue(
                plan, a=a, a_scale_inv=a_scale_inv, b=b, b_scale_inv=b_scale_inv, out=out,
                out_scale=out_scale, out_amax=out_amax, out_scale_inv=out_scale_inv,
                alpha=alpha, fast_accum=fast_accum, sm_count=sm_count, stream=self._stream(),
            )  # fmt: skip
        return self._call_checked(
            key, x, weight, alpha=alpha, out=out, out_scale=out_scale, out_amax=out_amax,
            out_scale_inv=out_scale_inv, fast_accum=fast_accum, sm_count=sm_count,
            weight_layout=weight_layout,
        )  # fmt: skip

    def _call_checked(
        self,
        key: tuple | None,
        x: Operand,
        weight: Operand,
        *,
        alpha: float,
        out: torch.Tensor | None,
        out_scale: torch.Tensor | None,
        out_amax: torch.Tensor | None,
        out_scale_inv: torch.Tensor | None,
        fast_accum: bool | None,
        sm_count: int,
        weight_layout: str,
    ) -> torch.Tensor:
        """The slow path: every check, then the op; records the call's plan (NOTE [op
        plans]) once the native op has accepted it."""
        import torch

        transb = weight_transposed(_OP, weight_layout)
        a, a_scale_inv, b, b_scale_inv = prepare(_OP, x, weight, self.device)
        rows, k = a.shape
        if rows % self.tp or rows > self.max_tokens or rows == 0:
            raise InvalidArgumentError(
                f"{_OP}: x has {rows} rows (tokens); they must be a positive multiple of the "
                f"TP size {self.tp} and <= max_tokens ({self.max_tokens}); pad the tokens"
            )
        want = (self.out_features, k) if transb else (k, self.out_features)
        if tuple(b.shape) != want:
            raise InvalidArgumentError(
                f"{_OP}: weight {tuple(b.shape)} must be [{want[0]}, {want[1]}] "
                f"(weight_layout={weight_layout!r})"
            )
        shape = (rows // self.tp, self.out_features)
        if out is None:
            out = torch.empty(shape, dtype=self.out_dtype, device=self.device)
        elif tuple(out.shape) != shape or out.dtype != self.out_dtype:
            raise InvalidArgumentError(
                f"{_OP}: out must be {self.out_dtype}[{shape[0]}, {shape[1]}], got "
                f"{out.dtype}{list(out.shape)}"
            )
        if is_fp8(self.out_dtype) and out_scale is None:
            raise InvalidArgumentError(f"{_OP}: an FP8 output needs out_scale")
        plan = _RsPlan(
            key=key,
            splits=(split_of(x), split_of(weight)),
            shape=shape,
            transb=transb,
            fp8=is_fp8(a.dtype),
        )
        self._issue(
            plan, a=a, a_scale_inv=a_scale_inv, b=b, b_scale_inv=b_scale_inv, out=out,
            out_scale=out_scale, out_amax=out_amax, out_scale_inv=out_scale_inv, alpha=alpha,
            fast_accum=fast_accum, sm_count=sm_count, stream=stream_of(self.device),
        )  # fmt: skip
        if key is not None:
            self._plan = plan
        return out

    def _issue(
        self,
        plan: _RsPlan,
        *,
        a: torch.Tensor,
        a_scale_inv: torch.Tensor | None,
        b: torch.Tensor,
        b_scale_inv: torch.Tensor | None,
        out: torch.Tensor,
        out_scale: torch.Tensor | None,
        out_amax: torch.Tensor | None,
        out_scale_inv: torch.Tensor | None,
        alpha: float,
        fast_accum: bool | None,
        sm_count: int,
        stream: int,
    ) -> torch.Tensor:
        """The native op, as both paths issue it (NOTE [op plans]): ``plan`` gives what the
        checks derived, the call and the op's tuning everything else."""
        native().comm_ops.gemm_rs(
            self.buffer._core,
            a,
            b,
            out,
            transb=plan.transb,
            a_scale_inv=a_scale_inv,
            b_scale_inv=b_scale_inv,
            out_scale=out_scale,
            out_amax=out_amax,
            out_scale_inv=out_scale_inv,
            alpha=float(alpha),
            fast_accum=default_fast_accum(fast_accum, plan.fp8),
            sm_count=int(sm_count),
            method=self.method.native,
            compute_lanes=self.compute_lanes,
            reduce_max_blocks=self.reduce_max_blocks,
            stream=stream,
            **self._method_knobs(),
        )
        return out

    def _method_knobs(self) -> dict[str, object]:
        """The method's own tuning, as the native call takes it (the other method's knobs are
        refused there)."""
        if self.method is RsMethod.RING:
            return {"ring_subchunks": self.ring_subchunks, "pull_shards": self.pull_shards}
        return {"pieces": self.pieces}

    def destroy(self) -> None:
        """Free the buffer if the op created it (not a ``buffer=`` given to it). Idempotent;
        not collective."""
        if self._owns_buffer:
            self.buffer.destroy()


@dataclass(frozen=True)
class _RsPlan:
    """What a checked call of :class:`GemmReduceScatter` derived, for the calls of its key
    (NOTE [op plans]); it holds no tensor."""

    key: tuple | None
    splits: tuple  # the Split of the input and of the weight
    shape: tuple[int, int]  # of the output the op allocates
    transb: bool  # of the weight layout
    fp8: bool  # FP8 operands: fast_accum's default

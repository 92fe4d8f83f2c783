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
from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError
from overlap.ops._operands import (
    HIGH_PRECISION,
    Operand,
    check_given_buffer,
    check_pieces,
    check_sizes,
    gemm_kwargs,
    is_fp8,
    op_device,
    prepare,
    weight_transposed,
)

if TYPE_CHECKING:
    import torch

    from overlap.comm import Communicator, SymmetricBuffer

__all__ = ["GemmReduceScatter", "RsMethod", "partial_dtype"]

_OP = "gemm_rs"

MAX_RING_SUBCHUNKS = 4  # kMaxRingSubchunks in csrc/comm/overlap/overlap_ops.h


class RsMethod(str, enum.Enum):
    """How :class:`GemmReduceScatter` moves and sums the partial sums."""

    PIPELINED = "pipelined"  # chunks pulled by their rank, summed by one reduction kernel
    RING = "ring"  # running sums travel the ring, summed by the GEMMs' beta = 1 epilogue


def rs_method(value: RsMethod | str) -> RsMethod:
    """``value`` as an :class:`RsMethod` (its value string is accepted)."""
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
        compute_lanes: streams the chunk GEMMs alternate over (1-4; 1 finishes each chunk,
            and thus each transfer, earliest).
        reduce_max_blocks: bound on the reduction kernel's grid (0: fill the GPU; the ring
            method's FP8 cast only).
        method: ``"pipelined"`` (default) or ``"ring"`` (:class:`RsMethod`).
        ring_subchunks: ``"ring"`` only: sub-chunks each hop is pipelined in, 1..4 (NOTE
            [gemm_rs_ring schedule]; 2: a chunk's transfer hides behind a GEMM as long as
            it is no slower than that GEMM).
        pieces: ``"pipelined"`` only: rounds the chunks are computed, pulled and summed in,
            1..4 (NOTE [gemm_rs pieces]): the pulls start sooner and the reductions of all but
            the last round run beside the GEMMs, for GEMMs 1/pieces as tall. 1, the default,
            was the fastest on 4xH200 (NVSwitch) for every shape measured; more pieces are
            meant for links that a single peer's pull cannot fill.
        pull_shards: ``"ring"`` only: each rank leaves its running sums in its own buffer
            and the next rank pulls them (NOTE [gemm_rs_ring pulls]), instead of pushing them
            to it. On 2xH200 this was the fastest method on 6 to 9 of the 12 TP 2 GEMM+RS
            rows of the benchmark suite in four runs, the FP8 rows with the smallest GEMMs
            among them every time (e.g. FP8 ``[8192, 4096] x [4096, 4096]``: 0.243 -> 0.221
            ms); default False. The pipelined method always pulls.
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
        method: RsMethod | str = RsMethod.PIPELINED,
    ) -> int:
        """Bytes per rank of the buffer an op of these arguments needs (the ring method needs
        half of what the pipelined one does)."""

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
        compute_lanes: int = 1,
        reduce_max_blocks: int = 0,
        method: RsMethod | str = RsMethod.PIPELINED,
        ring_subchunks: int = 2,
        pieces: int = 1,
        pull_shards: bool = False,
        name: str = "gemm_rs",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_OP, tp, max_tokens, ("out_features", out_features), compute_lanes)
        self.method = rs_method(method)
        if isinstance(ring_subchunks, bool) or ring_subchunks not in range(
            1, MAX_RING_SUBCHUNKS + 1
        ):
            raise InvalidArgumentError(
                f"{_OP}: ring_subchunks must be 1..{MAX_RING_SUBCHUNKS}, got {ring_subchunks!r}"
            )
        self.ring_subchunks = int(ring_subchunks)
        self.pieces = check_pieces(_OP, pieces)
        if self.pieces != 1 and self.method is RsMethod.RING:
            raise InvalidArgumentError(
                f"{_OP}: pieces apply to the pipelined method; the ring method pipelines its "
                f"hops with ring_subchunks (got pieces={pieces})"
            )
        if not isinstance(pull_shards, bool):
            raise InvalidArgumentError(f"{_OP}: pull_shards must be True or False")
        if pull_shards and self.method is not RsMethod.RING:
            raise InvalidArgumentError(
                f"{_OP}: pull_shards applies to the ring method (the pipelined method always pulls)"
            )
        self.pull_shards = pull_shards
        if str(out_dtype) not in HIGH_PRECISION and not is_fp8(out_dtype):
            raise InvalidArgumentError(
                f"{_OP}: out_dtype must be bfloat16, float16, float32 or FP8, got {out_dtype}"
            )
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.out_features = int(out_features)
        self.out_dtype = out_dtype
        self.compute_lanes = int(compute_lanes)
        self.reduce_max_blocks = int(reduce_max_blocks)
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.out_features, out_dtype, self.method)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_OP, self.buffer, tp, nbytes)

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
        native().comm_ops.gemm_rs(
            self.buffer._core,
            a,
            b,
            out,
            out_scale=out_scale,
            out_amax=out_amax,
            out_scale_inv=out_scale_inv,
            reduce_max_blocks=self.reduce_max_blocks,
            method=self.method.value,
            ring_subchunks=self.ring_subchunks,
            pieces=self.pieces,
            pull_shards=self.pull_shards,
            **gemm_kwargs(
                a,
                (a_scale_inv, b_scale_inv),
                alpha=alpha,
                fast_accum=fast_accum,
                sm_count=sm_count,
                compute_lanes=self.compute_lanes,
                device=self.device,
                transb=transb,
            ),
        )
        return out

    def destroy(self) -> None:
        """Free the buffer if the op created it (not a ``buffer=`` given to it). Idempotent;
        not collective."""
        if self._owns_buffer:
            self.buffer.destroy()

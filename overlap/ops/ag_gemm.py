"""AG -> GEMM: a sequence-parallel input gathered while the GEMM consumes it.

``Y[M, N] = AllGather(x_shard)[M, K] @ weight[N, K].T`` over a TP group of size ``tp``, with
``M = tp * m`` (every rank gives ``m`` rows). Each peer's shard is pushed into this rank's
symmetric buffer by the copy engines while earlier chunks are multiplied; the GEMM of chunk
``j`` (rank ``j``'s rows) starts as soon as that chunk's flag says it has landed, and writes
rows ``[j m, (j + 1) m)`` of ``Y`` directly. NOTE [ag_gemm schedule] in
``csrc/comm/overlap/ag_gemm.cpp`` has the stream timeline.

Stream contract (NOTE [stream contract] in :mod:`overlap.comm.communicator`): on the cuda
transport the op waits for work already issued on the current stream of the input's device,
runs on it (its compute and copy lanes fork from it and join back) and returns without
synchronising the host. The host transport runs it synchronously.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import InvalidArgumentError, StateError
from overlap.ops._operands import (
    Operand,
    check_given_buffer,
    check_sizes,
    gemm_kwargs,
    is_fp8,
    op_device,
    prepare,
)
from overlap.quantization import DirectionFormat, QuantizedTensor

if TYPE_CHECKING:
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
        compute_lanes: streams the chunk GEMMs alternate over (1-4); with 2, a chunk's GEMM
            starts as soon as it has landed, even while the previous chunk's GEMM runs.
        staggered_puts: push the shard to one peer after the other instead of to all at once
            (the first peer chunk lands sooner; NOTE [ag_gemm schedule]). Same result.
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
        compute_lanes: int = 2,
        staggered_puts: bool = False,
        name: str = "ag_gemm",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_OP, tp, max_tokens, ("in_features", in_features), compute_lanes)
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.in_features = int(in_features)
        self.dtype = dtype
        self.compute_lanes = int(compute_lanes)
        self.staggered_puts = bool(staggered_puts)
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.in_features, dtype)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_OP, self.buffer, tp, nbytes)
        self._last: tuple[int, torch.dtype, DirectionFormat | None] | None = None

    def __call__(
        self,
        x_shard: Operand,
        weight: Operand,
        *,
        bias: torch.Tensor | None = None,
        gelu: bool = False,
        alpha: float = 1.0,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        fast_accum: bool | None = None,
        sm_count: int = 0,
    ) -> torch.Tensor:
        """COLLECTIVE: ``Y = epilogue(alpha * AllGather(x_shard) @ weight.T + bias)``.

        Args:
            x_shard: this rank's ``[m, K]`` rows (contiguous), of the op's ``dtype``; FP8 as
                a :class:`QuantizedTensor` with rowwise per-tensor data: its scale_inv
                travels with it and chunk ``j``'s GEMM uses rank ``j``'s scale_inv.
                ``m`` may be any count (not a multiple of 128) with ``tp * m <= max_tokens``;
                every rank passes the same ``m``.
            weight: ``[N, K]`` (a linear layer's weight; unit column stride), the input's
                dtype, or per-tensor FP8 with an FP8 input.
            bias: optional ``[N]`` (cuBLASLt's rules: out's dtype, bf16 for FP8 inputs).
            gelu: tanh-approximated GELU after the bias.
            alpha: scale of the product.
            out: optional contiguous ``[tp * m, N]`` output (poisoned or not: every row is
                written).
            out_dtype: dtype of an allocated output (default: the input's, bfloat16 for FP8).
                FP8 outputs are not supported.
            fast_accum: FP8 only (default on, as :func:`overlap.gemm.gemm`).
            sm_count: SMs the chunk GEMMs plan for (0 = all).

        Returns:
            ``out`` ``[tp * m, N]``. The gathered input stays in the buffer until the next
            call: :meth:`gathered_input`.

        Raises:
            InvalidArgumentError / UnsupportedHardwareError: before any communication, with
                the buffer left usable.
            CommTimeoutError: a peer did not take part in time (cuda: raised by the next op
                or ``comm.synchronize()``).
        """
        import torch

        a, a_scale_inv, b, b_scale_inv = prepare(_OP, x_shard, weight, self.device)
        m, k = a.shape
        if a.dtype != self.dtype or k != self.in_features or m * self.tp > self.max_tokens:
            raise InvalidArgumentError(
                f"{_OP}: x_shard {a.dtype}[{m}, {k}] does not fit this op: dtype "
                f"{self.dtype}, K = {self.in_features}, tp * m <= {self.max_tokens} (tp = "
                f"{self.tp})"
            )
        if not a.is_contiguous():
            raise InvalidArgumentError(f"{_OP}: x_shard must be contiguous")
        if b.shape[1] != k:
            raise InvalidArgumentError(
                f"{_OP}: weight {tuple(b.shape)} must be [N, {k}] (K = x_shard's columns)"
            )
        n = b.shape[0]
        shape = (self.tp * m, n)
        if out is None:
            if out_dtype is None:
                out_dtype = torch.bfloat16 if is_fp8(a.dtype) else a.dtype
            out = torch.empty(shape, dtype=out_dtype, device=self.device)
        elif tuple(out.shape) != shape or (out_dtype is not None and out.dtype != out_dtype):
            raise InvalidArgumentError(
                f"{_OP}: out must be [{shape[0]}, {shape[1]}]"
                + (f" of {out_dtype}" if out_dtype is not None else "")
                + f", got {out.dtype}{list(out.shape)}"
            )
        native().comm_ops.ag_gemm(
            self.buffer._core,
            a,
            b,
            out,
            bias=bias,
            gelu=gelu,
            staggered_puts=self.staggered_puts,
            **gemm_kwargs(
                a,
                (a_scale_inv, b_scale_inv),
                alpha=alpha,
                fast_accum=fast_accum,
                sm_count=sm_count,
                compute_lanes=self.compute_lanes,
                device=self.device,
            ),
        )
        fmt = x_shard.rowwise_format if isinstance(x_shard, QuantizedTensor) else None
        hp_dtype = x_shard.dtype if isinstance(x_shard, QuantizedTensor) else a.dtype
        self._last = (m, hp_dtype, fmt)
        return out

    def gathered_input(self) -> torch.Tensor | QuantizedTensor:
        """The input gathered by the last call: ``[tp * m, K]``, a view of the buffer (FP8:
        a :class:`QuantizedTensor` whose rows of rank ``j`` are scaled by rank ``j``'s
        scale_inv, returned as ``scale_inv`` of ``[tp]`` elements only when they differ).

        Valid until the next op on this object (DESIGN.md invariant 2: never save it for
        backward; copy it, or save the shard and re-gather). On cuda, read it on the stream
        of the call (or after it); the FP8 scale check reads the scales on the host.
        """
        if self._last is None:
            raise StateError(f"{_OP}: gathered_input() before the first call")
        m, hp_dtype, fmt = self._last
        rows = self.tp * m
        data = self.buffer.view(self.dtype, (rows, self.in_features))
        if fmt is None:
            return data
        scales = self.gathered_scale_invs()
        if not bool((scales == scales[0]).all()):
            raise StateError(
                f"{_OP}: the ranks' shards have different scale_inv values "
                f"({scales.tolist()}); a gathered per-tensor FP8 tensor needs one (quantize with "
                "an amax reduced over the TP group, DESIGN.md invariant 3). Use "
                "gathered_scale_invs() to read them"
            )
        return QuantizedTensor(
            shape=(rows, self.in_features),
            dtype=hp_dtype,
            rowwise_format=fmt,
            columnwise_format=DirectionFormat(),
            rowwise_data=data,
            rowwise_scale_inv=scales[:1],
        )

    def gathered_scale_invs(self) -> torch.Tensor:
        """FP8: the float32 ``[tp]`` scale_invs of the last call's shards, from the buffer."""
        import torch

        if self._last is None or self._last[2] is None:
            raise StateError(f"{_OP}: no FP8 call yet")
        m = self._last[0]
        shard_bytes = m * self.in_features * self.dtype.itemsize
        scale_offset, _ = native().comm_ops.ag_gemm_layout(self.tp, shard_bytes, True)
        # One 16-byte slot per rank (NOTE [ag_gemm layout]): the scale_inv is its first float.
        return self.buffer.view(torch.float32, (self.tp, 4), offset=int(scale_offset))[:, 0]

    def destroy(self) -> None:
        """Free the buffer if the op created it (not a ``buffer=`` given to it). Idempotent;
        not collective."""
        if self._owns_buffer:
            self.buffer.destroy()

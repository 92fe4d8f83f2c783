"""Bulk overlap: one collective of one tensor beside one unrelated GEMM.

The backward pass of a sequence-parallel, column-parallel linear layer (qkv, fc1) has two
collectives that no GEMM consumes chunk by chunk, but that can each hide behind a GEMM that
does not need them:

* :class:`AllGatherBesideGemm`: gather the layer input ``[T / tp, K] -> [T, K]`` (which wgrad
  needs) while dgrad ``dX = dY @ W`` runs;
* :class:`ReduceScatterBesideGemm`: reduce-scatter dgrad's partial sums ``[T, K] ->
  [T / tp, K]`` while wgrad ``dW = dY.T @ X`` runs.

The collective and the GEMM share no memory (refused otherwise, before anything is issued:
NOTE [bulk independence] in ``csrc/comm/overlap/bulk.cpp``), so neither result depends on the
other's timing. On the cuda transport the all-gather uses the copy engines only (no SM); the
reduce-scatter's bytes travel by copy engine as well and its local reduction runs with a
bounded grid (``reduce_max_blocks``) while the GEMM plans for the remaining SMs
(``gemm_sm_margin``). The stream timelines are in ``bulk.cpp``.

The side GEMM is described as for :func:`overlap.gemm.gemm` (``a``, ``b``, ``transa``,
``transb``, ``alpha``, ``beta``, ``bias``, ``gelu``, FP8 ``out_scale``/``out_amax``,
``fast_accum``, ``sm_count``); FP8 operands are per-tensor scaled, given as a
:class:`~overlap.quantization.QuantizedTensor` (its rowwise data) or as an FP8 tensor with its
``a_scale_inv`` / ``b_scale_inv`` (e.g. columnwise data for wgrad on Hopper); its checks and
the native call's description of it live in :mod:`overlap.ops._side_gemm`. A call with the
signature of the op's last checked call skips the Python checks (NOTE [op plans] in
:mod:`overlap.ops._operands`).

Stream contract: as :class:`~overlap.ops.AllGatherGemm` (the current stream of the op's
device; lanes fork from it and join back; no host synchronisation on cuda; the host
transport runs the op synchronously).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from overlap._native import native
from overlap.errors import InvalidArgumentError
from overlap.ops._gathered import CallRecord, GatherState, gathered_input, gathered_scale_invs
from overlap.ops._operands import (
    Operand,
    Split,
    call_key,
    check_count,
    check_given_buffer,
    check_op_dtype,
    check_pieces,
    check_sizes,
    is_fp8,
    op_device,
    split_as,
    split_of,
    split_operand,
    stream_getter,
    stream_of,
    travels_as,
    tuning,
)
from overlap.ops._side_gemm import SIDE_TENSORS, SidePlan, plan_side_gemm, side_gemm, side_gemm_as
from overlap.quantization import QuantizedTensor

if TYPE_CHECKING:
    import torch

    from overlap.comm import Communicator, SymmetricBuffer

__all__ = [
    "AllGatherBesideGemm",
    "ReduceScatterBesideGemm",
    "bulk_rs_defaults",
    "bulk_rs_max_blocks",
    "side_gemm",
]

_AG = "bulk_all_gather"
_RS = "bulk_reduce_scatter"


def bulk_rs_defaults(tp: int | None) -> tuple[int, int]:
    """``(gemm_sm_margin, pieces)`` of a :class:`ReduceScatterBesideGemm` on ``tp`` ranks
    (``None``: any TP size): 8 SMs, with 4 pieces at TP 2 and 2 at other sizes. The values
    and their measurements live in the C++ core (``BulkRsConfig``, NOTE [bulk_rs defaults]
    in ``csrc/comm/overlap/defaults.cpp``), the one source the binding's defaults read too.
    """
    d = tuning().bulk_rs_defaults(0 if tp is None else int(tp))
    return int(d.gemm_sm_margin), int(d.pieces)


def bulk_rs_max_blocks() -> int:
    """The default bound on a :class:`ReduceScatterBesideGemm`'s reduction grid at any TP
    size: 64 blocks of 256 threads, 16 SMs' worth (NOTE [bulk_rs defaults])."""
    return int(tuning().bulk_rs_defaults(0).reduce_max_blocks)


class AllGatherBesideGemm:
    """Gather a sequence-parallel shard while an unrelated GEMM runs.

    Args:
        comm: the TP group's communicator (host or cuda transport).
        max_tokens: the largest gathered row count ``M = tp * m`` a call may use.
        in_features: ``K``, the shard's columns.
        dtype: the dtype the shard travels in: bfloat16/float16/float32, or an FP8 dtype for
            per-tensor FP8 shards (given as :class:`~overlap.quantization.QuantizedTensor`;
            their scale_inv travels in the buffer with the data, docs/design.md §3, invariant 1).
        name: the buffer's name (error messages).
        buffer: optional symmetric buffer of ``comm`` to run on (at least
            :meth:`buffer_bytes` bytes; NOTE [shared op buffers] in :mod:`overlap.ops.ag_gemm`).

    The buffer layout is :class:`~overlap.ops.AllGatherGemm`'s (NOTE [ag_gemm layout]), so the
    same :meth:`buffer_bytes` and the same ``buffer.put_split`` tuning apply. Construction is
    COLLECTIVE; :meth:`destroy` frees the buffer the object created (never a given one).
    """

    @staticmethod
    def buffer_bytes(tp: int, max_tokens: int, in_features: int, dtype: torch.dtype) -> int:
        """Bytes per rank of the buffer an op of these arguments needs."""
        shard_bytes = -(-int(max_tokens) // tp) * int(in_features) * dtype.itemsize
        _, nbytes = native().comm_ops.ag_gemm_layout(tp, shard_bytes, is_fp8(dtype))
        return int(nbytes)

    def __init__(
        self,
        comm: Communicator,
        max_tokens: int,
        in_features: int,
        dtype: torch.dtype,
        *,
        name: str = "bulk_ag",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_AG, tp, max_tokens, ("in_features", in_features))
        check_op_dtype(_AG, "dtype", dtype, fp8=True)
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.in_features = int(in_features)
        self.dtype = dtype
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.in_features, dtype)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_AG, self.buffer, tp, nbytes)
        self._calls = CallRecord()  # the last call's gather
        self._plan: _GatherPlan | None = None  # the last checked call's plan (NOTE [op plans])
        self._stream = stream_getter(self.device)
        self._cuda = self.device.type == "cuda"

    def __call__(
        self,
        x_shard: Operand,
        a: Operand,
        b: Operand,
        **gemm: Any,
    ) -> torch.Tensor:
        """COLLECTIVE: gather ``x_shard`` into the buffer while ``gemm(a, b, **gemm)`` runs.

        Args:
            x_shard: this rank's ``[m, K]`` rows (contiguous) of the op's ``dtype``; FP8 as a
                :class:`QuantizedTensor` with rowwise per-tensor data. Every rank passes the
                same ``m`` (any count with ``tp * m <= max_tokens``).
            a, b: the side GEMM's operands, ``op(a) [m', k']`` and ``op(b) [k', n']``: plain
                tensors, per-tensor FP8 ``QuantizedTensor`` s, or FP8 tensors with
                ``a_scale_inv`` / ``b_scale_inv``. They must not be views of this op's buffer.
            **gemm: the GEMM's keywords, as :func:`overlap.gemm.gemm`: ``transa``,
                ``transb``, ``out`` (``[m', n']``, contiguous), ``out_dtype``, ``alpha``,
                ``beta``, ``bias``, ``gelu``, ``a_scale_inv``, ``b_scale_inv``,
                ``out_scale`` / ``out_amax`` (FP8 out), ``fast_accum``, ``sm_count``.

        Returns:
            the GEMM's output ``[m', n']``. The gathered ``[tp * m, K]`` input stays in the
            buffer until the next op on it: :meth:`gathered_input`.

        Raises:
            InvalidArgumentError / UnsupportedHardwareError: before any communication, with
                the buffer left usable (including a GEMM that shares memory with the
                all-gather).
            CommTimeoutError: a peer did not take part in time (cuda: raised by the next op
                or ``comm.synchronize()``).
        """
        names = tuple(gemm)
        key = call_key(
            (x_shard, a, b, *[gemm[k] for k in names if k in SIDE_TENSORS]),
            (len(names), *names, *[gemm[k] for k in names if k not in SIDE_TENSORS], self.tp,
             self.dtype, self.in_features, self.max_tokens),
        )  # fmt: skip
        plan = self._plan
        if plan is not None and plan.key == key:  # the fast path (NOTE [op plans])
            data, scale_inv = split_as(x_shard, plan.split)
            g = side_gemm_as(plan.side, a, b, self.device, **gemm)
            return self._issue(plan, data, scale_inv, g, self._stream())
        data, scale_inv = split_operand(_AG, "x_shard", x_shard)
        m, k = data.shape
        if (
            not travels_as(data.dtype, self.dtype)
            or k != self.in_features
            or m * self.tp > self.max_tokens
        ):
            raise InvalidArgumentError(
                f"{_AG}: x_shard {data.dtype}[{m}, {k}] does not fit this op: dtype "
                f"{self.dtype}, K = {self.in_features}, tp * m <= {self.max_tokens} (tp = "
                f"{self.tp})"
            )
        if not data.is_contiguous():
            raise InvalidArgumentError(f"{_AG}: x_shard must be contiguous")
        if data.device != self.device:
            raise InvalidArgumentError(
                f"{_AG}: x_shard is on {data.device}, the op on {self.device}"
            )
        side = plan_side_gemm(_AG, a, b, self.device, **gemm)
        fmt = x_shard.rowwise_format if isinstance(x_shard, QuantizedTensor) else None
        plan = _GatherPlan(key, split_of(x_shard), side, (m, x_shard.dtype, fmt))
        out = self._issue(
            plan, data, scale_inv, side_gemm_as(side, a, b, self.device, **gemm),
            stream_of(self.device),
        )  # fmt: skip
        if key is not None:
            self._plan = plan
        return out

    def _issue(
        self,
        plan: _GatherPlan,
        data: torch.Tensor,
        scale_inv: torch.Tensor | None,
        g: dict[str, Any],
        stream: int,
    ) -> torch.Tensor:
        """The native op and its CallRecord entry, as both paths issue it (NOTE [op plans])."""
        native().comm_ops.all_gather_beside_gemm(
            self.buffer._core, data, g, shard_scale_inv=scale_inv, stream=stream
        )
        self._calls.note(self.buffer, plan.last_gather, True, self._cuda)
        return g["out"]

    def gathered_input(self, *, check_scales: bool = True) -> torch.Tensor | QuantizedTensor:
        """The input gathered by the last call: ``[tp * m, K]``, a view of the buffer (FP8: a
        :class:`QuantizedTensor` whose scale_inv is read from the buffer).

        Valid until the next op on the buffer (docs/design.md §3, invariant 2: never save it for
        backward). On cuda, read it on the stream of the call (or after it); the FP8 check
        that every rank's scale_inv is the same reads the scales on the host
        (``check_scales=False`` skips it, for shards quantized with a shared amax).

        Raises:
            StateError: before the first call, or FP8 shards whose scale_invs differ (quantize
                with an amax reduced over the TP group, docs/design.md §3, invariant 3;
                :meth:`gathered_scale_invs` has them).
        """
        return gathered_input(self._gather_state(), check_scales=check_scales)

    def gathered_scale_invs(self) -> torch.Tensor:
        """FP8: the float32 ``[tp]`` scale_invs of the last call's shards, from the buffer."""
        return gathered_scale_invs(self._gather_state())

    def _gather_state(self) -> GatherState:
        last, generation, _ = self._calls.current(self.buffer)
        return GatherState(
            _AG, self.buffer, self.tp, self.dtype, self.in_features, last, generation
        )

    def destroy(self) -> None:
        """Free the buffer if the op created it. Idempotent; not collective."""
        if self._owns_buffer:
            self.buffer.destroy()


class ReduceScatterBesideGemm:
    """Reduce-scatter partial sums while an unrelated GEMM runs.

    Args:
        comm: the TP group's communicator (host or cuda transport).
        max_tokens: the largest ``M`` (rows of the partial sums) a call may use.
        features: ``N``, the partial sums' columns.
        dtype: the partial sums' dtype (bfloat16/float16/float32); the output is this dtype or
            FP8 (chosen per call).
        reduce_max_blocks: bound on the reduction kernel's grid on cuda (256-thread blocks, 4
            per SM: 64 fills 16 SMs where free; 0 fills the GPU).
        gemm_sm_margin: SMs the side GEMM leaves free for the reduction when the call gives no
            ``sm_count`` (cuda; 0: the GEMM plans for the whole GPU).
        pieces: pieces the partial sums travel and are reduced in (1 to the core's
            ``MAX_PIECES``; NOTE [bulk_rs pieces] in ``bulk.cpp``): each piece is summed as
            soon as it has landed, beside the later pushes, instead of the whole output after
            the last byte, so the reduction needs fewer of the GEMM's SMs at a time. Every rank
            must pass the same value.
        name: the buffer's name (error messages).
        buffer: optional symmetric buffer of ``comm`` to run on (at least
            :meth:`buffer_bytes` bytes; NOTE [shared op buffers] in :mod:`overlap.ops.ag_gemm`).

    A tuning argument left ``None`` takes the op's default at its group's TP size, defined in
    the C++ core (``BulkRsConfig``, NOTE [bulk_rs defaults] in
    ``csrc/comm/overlap/defaults.cpp``; :func:`bulk_rs_defaults`): a grid of 64 blocks, 8 SMs
    left free, 4 pieces at TP 2 and 2 at other sizes.

    Construction is COLLECTIVE; :meth:`destroy` frees the buffer the object created.
    """

    @staticmethod
    def buffer_bytes(tp: int, max_tokens: int, features: int, dtype: torch.dtype) -> int:
        """Bytes per rank of the buffer an op of these arguments needs (NOTE [bulk_rs
        layout])."""
        partial_bytes = (int(max_tokens) // tp) * int(features) * dtype.itemsize
        _, nbytes = native().comm_ops.bulk_rs_layout(tp, partial_bytes)
        return int(nbytes)

    def __init__(
        self,
        comm: Communicator,
        max_tokens: int,
        features: int,
        dtype: torch.dtype,
        *,
        reduce_max_blocks: int | None = None,
        gemm_sm_margin: int | None = None,
        pieces: int | None = None,
        name: str = "bulk_rs",
        buffer: SymmetricBuffer | None = None,
    ) -> None:
        tp = comm.group.size
        check_sizes(_RS, tp, max_tokens, ("features", features))
        check_op_dtype(_RS, "dtype (of the partial sums)", dtype, fp8=False)
        d = tuning().bulk_rs_defaults(tp)  # its group's size (NOTE [bulk_rs defaults])
        self.tp = tp
        self.max_tokens = int(max_tokens)
        self.features = int(features)
        self.dtype = dtype
        self.reduce_max_blocks = check_count(
            _RS,
            "reduce_max_blocks",
            d.reduce_max_blocks if reduce_max_blocks is None else reduce_max_blocks,
            0,
        )
        self.gemm_sm_margin = check_count(
            _RS, "gemm_sm_margin", d.gemm_sm_margin if gemm_sm_margin is None else gemm_sm_margin, 0
        )
        self.pieces = check_pieces(_RS, d.pieces if pieces is None else pieces)
        self.device = op_device(comm)
        nbytes = self.buffer_bytes(tp, self.max_tokens, self.features, dtype)
        self._owns_buffer = buffer is None
        self.buffer = comm.create_buffer(nbytes, name) if buffer is None else buffer
        check_given_buffer(_RS, self.buffer, tp, nbytes)
        self._plan: _ScatterPlan | None = None  # the last checked call's plan (NOTE [op plans])
        self._stream = stream_getter(self.device)

    def __call__(
        self,
        x: torch.Tensor,
        a: Operand,
        b: Operand,
        *,
        out: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        out_scale: torch.Tensor | None = None,
        out_amax: torch.Tensor | None = None,
        out_scale_inv: torch.Tensor | None = None,
        gemm_out: torch.Tensor | None = None,
        gemm_out_dtype: torch.dtype | None = None,
        gemm_out_scale: torch.Tensor | None = None,
        gemm_out_amax: torch.Tensor | None = None,
        **gemm: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """COLLECTIVE: this rank's rows of ``sum over ranks (x)`` while ``gemm(a, b)`` runs.

        Args:
            x: the partial sums ``[M, N]`` (contiguous) of the op's ``dtype``; ``M`` a
                multiple of the TP size and ``<= max_tokens``, the same on every rank. Rank
                ``r`` receives rows ``[r M/tp, (r + 1) M/tp)``, summed in rank order with fp32
                accumulation.
            a, b: the side GEMM's operands (as :meth:`AllGatherBesideGemm.__call__`).
            out: optional contiguous ``[M / tp, N]`` output, not overlapping ``x``.
            out_dtype: the output's dtype: the op's ``dtype`` (default) or FP8.
            out_scale: FP8 outputs only, required: float32 ``[1]``; ``out = fp8(sum * scale)``.
            out_amax: FP8 outputs only, optional float32 ``[1]``: receives ``max |sum|``.
            out_scale_inv: FP8 outputs only, optional float32 ``[1]``: receives ``1 / scale``.
            gemm_out, gemm_out_dtype, gemm_out_scale, gemm_out_amax: the GEMM's ``out``,
                ``out_dtype``, ``out_scale``, ``out_amax`` (:func:`overlap.gemm.gemm`).
            **gemm: the GEMM's other keywords: ``transa``, ``transb``, ``alpha``, ``beta``,
                ``bias``, ``gelu``, ``a_scale_inv``, ``b_scale_inv``, ``fast_accum``,
                ``sm_count`` (default: the device's SMs minus ``gemm_sm_margin``).

        Returns:
            ``(out [M / tp, N], gemm_out)``.

        Raises:
            InvalidArgumentError / UnsupportedHardwareError: before any communication, with
                the buffer left usable.
            CommTimeoutError: a peer did not take part in time.
        """
        names = tuple(gemm)
        side_kw = {"out": gemm_out, "out_dtype": gemm_out_dtype, "out_scale": gemm_out_scale,
                   "out_amax": gemm_out_amax, **gemm}  # fmt: skip
        key = call_key(
            (x, a, b, out, out_scale, out_amax, out_scale_inv, gemm_out, gemm_out_scale,
             gemm_out_amax, *[gemm[k] for k in names if k in SIDE_TENSORS]),
            (out_dtype, gemm_out_dtype, len(names), *names,
             *[gemm[k] for k in names if k not in SIDE_TENSORS], self.tp, self.dtype,
             self.max_tokens, self.features),
        )  # fmt: skip
        plan = self._plan
        if plan is not None and plan.key == key:  # the fast path (NOTE [op plans])
            if out is None:
                import torch

                out = torch.empty(plan.shape, dtype=plan.out_dtype, device=self.device)
            g = side_gemm_as(plan.side, a, b, self.device, **side_kw)
            return self._issue(x, out, g, out_scale, out_scale_inv, out_amax, self._stream())
        return self._call_checked(
            key, x, a, b, out=out, out_dtype=out_dtype, out_scale=out_scale, out_amax=out_amax,
            out_scale_inv=out_scale_inv, side_kw=side_kw,
        )  # fmt: skip

    def _call_checked(
        self,
        key: tuple | None,
        x: torch.Tensor,
        a: Operand,
        b: Operand,
        *,
        out: torch.Tensor | None,
        out_dtype: torch.dtype | None,
        out_scale: torch.Tensor | None,
        out_amax: torch.Tensor | None,
        out_scale_inv: torch.Tensor | None,
        side_kw: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The slow path: every check, then the op; records the call's plan (NOTE [op
        plans]) once the native op has accepted it."""
        import torch

        if not isinstance(x, torch.Tensor) or str(x.dtype) != str(self.dtype) or x.dim() != 2:
            raise InvalidArgumentError(
                f"{_RS}: x must be a 2-D {self.dtype} tensor (the partial sums), got "
                f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', []))}"
            )
        rows, cols = x.shape
        if rows % self.tp or rows == 0 or rows > self.max_tokens or cols != self.features:
            raise InvalidArgumentError(
                f"{_RS}: x [{rows}, {cols}] does not fit this op: rows a positive multiple of "
                f"the TP size {self.tp} and <= max_tokens ({self.max_tokens}) (pad the tokens), "
                f"{self.features} columns"
            )
        if not x.is_contiguous() or x.device != self.device:
            raise InvalidArgumentError(
                f"{_RS}: x must be contiguous and on {self.device}, got {x.device}"
            )
        out_dtype = out_dtype or (out.dtype if out is not None else self.dtype)
        if out_dtype != self.dtype and not is_fp8(out_dtype):
            raise InvalidArgumentError(
                f"{_RS}: out_dtype must be {self.dtype} or FP8, got {out_dtype}"
            )
        if is_fp8(out_dtype) and out_scale is None:
            raise InvalidArgumentError(f"{_RS}: an FP8 output needs out_scale")
        shape = (rows // self.tp, cols)
        if out is not None and (tuple(out.shape) != shape or out.dtype != out_dtype):
            raise InvalidArgumentError(
                f"{_RS}: out must be {out_dtype}[{shape[0]}, {shape[1]}], got "
                f"{out.dtype}{list(out.shape)}"
            )
        side = plan_side_gemm(_RS, a, b, self.device, **side_kw)
        if out is None:
            out = torch.empty(shape, dtype=out_dtype, device=self.device)
        g = side_gemm_as(side, a, b, self.device, **side_kw)
        result = self._issue(x, out, g, out_scale, out_scale_inv, out_amax, stream_of(self.device))
        if key is not None:
            self._plan = _ScatterPlan(key, shape, out_dtype, side)
        return result

    def _issue(  # noqa: PLR0917 (one call site per path)
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        g: dict[str, Any],
        out_scale: torch.Tensor | None,
        out_scale_inv: torch.Tensor | None,
        out_amax: torch.Tensor | None,
        stream: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The native op, as both paths issue it (NOTE [op plans]): the op's tuning read now."""
        native().comm_ops.reduce_scatter_beside_gemm(
            self.buffer._core,
            x,
            out,
            g,
            out_scale=out_scale,
            out_scale_inv=out_scale_inv,
            out_amax=out_amax,
            reduce_max_blocks=self.reduce_max_blocks,
            gemm_sm_margin=self.gemm_sm_margin,
            pieces=self.pieces,
            stream=stream,
        )
        return out, g["out"]

    def destroy(self) -> None:
        """Free the buffer if the op created it. Idempotent; not collective."""
        if self._owns_buffer:
            self.buffer.destroy()


@dataclass(frozen=True)
class _GatherPlan:
    """What a checked call of :class:`AllGatherBesideGemm` derived, for the calls of its key
    (NOTE [op plans]); it holds no tensor."""

    key: tuple | None
    split: Split  # of x_shard
    side: SidePlan
    last_gather: tuple  # CallRecord's LastGather of such a call


@dataclass(frozen=True)
class _ScatterPlan:
    """What a checked call of :class:`ReduceScatterBesideGemm` derived, for the calls of its
    key (NOTE [op plans]); it holds no tensor."""

    key: tuple
    shape: tuple[int, int]  # of the output the op allocates when the call gives none
    out_dtype: torch.dtype  # likewise
    side: SidePlan

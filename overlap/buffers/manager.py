"""Buffer managers: quantized shards in, gathered tensors out (docs/design.md §3, invariants
1, 2, 5).

A :class:`GatherBuffer` manages one :class:`~overlap.comm.SymmetricBuffer` of a TP group::

    local = mgr.copy_into_buffer(x, quantizer, amax_group=tp_group)  # stage this rank's shard
    mgr.gather()                                                     # ONE collective
    view = mgr.get_buffer(quantizer)                                 # transient view
    y = gemm(view.value, weight)                                     # use it now
    ctx.save_for_backward(*local.tensors())                          # save the LOCAL shard

NOTE [scale_inv travels with the data] (docs/design.md §3, invariant 1): staging copies
the shard's data AND its scale_inv (and the columnwise parts the format gathers) into this
rank's slots, the gather moves all parts in one op, and a gathered tensor's scale_inv is a
view of the gathered scales in the buffer. A quantizer is never asked for a scale after the
fact: with pipeline parallelism it may have been called again since.

NOTE [one scale per per-tensor tensor]: per-tensor FP8 gathers one scale_inv per shard. The
gathered :class:`~overlap.quantization.QuantizedTensor` has a single scale_inv, which is exact
when every shard used the same scale (an amax group given at quantization, invariant 3).
When the shards' scales differ the whole tensor is refused with an error (never one scale
silently picked): :meth:`BufferView.shard` gives each shard with its own scale_inv for
per-chunk GEMMs, and :meth:`BufferView.shard_scale_invs` all of them.

NOTE [transient views] (invariant 2): :meth:`GatherBuffer.get_buffer` returns a
:class:`BufferView`, valid until the next op on the buffer (staging, gather, destroy, by any
manager of that buffer). A stale view raises :class:`~overlap.errors.StateError` when used,
so a consumer that kept one past a later layer's op fails loudly instead of reading that
layer's data. Save the local shard returned by :meth:`GatherBuffer.copy_into_buffer` (it
never aliases the buffer) and re-gather in backward (:func:`~overlap.buffers.gather_for_wgrad`),
or keep a copy (:func:`~overlap.buffers.saveable`).

NOTE [streams]: on cuda, staging, the gather and the copies a view makes (the transpose of a
per-tensor columnwise direction, the assembly of transposed block slots) run on the current
stream; consumers read a view on that stream (or after synchronising with it). Checking that
per-tensor shards share one scale reads ``tp_size`` floats back to the host (a sync).

NOTE [staging is a local write]: staging writes only this rank's slots of its own region. No
peer writes there (a gather puts rank k's parts only into slot k) and a manager issues nothing
that reads a peer's region, so the write cannot race with peers; on cuda it is ordered on the
current stream before the gather. A buffer shared with ops that read peer regions (a
reduce-scatter) must be used by one of them at a time, through this manager's gather.

One file: :class:`GatherBuffer` and the :class:`BufferView` it hands out share the staged
record, the slot layout and the staleness rule of NOTE [transient views]; apart, each module
would reach into the other's private state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Union

from overlap.buffers.aliasing import BufferState, BufferValue, buffer_state
from overlap.buffers.layout import (
    FormatPair,
    GatherLayout,
    PartKind,
    PartLayout,
    derived_after_gather,
    gather_layout,
    gathered_directions,
)
from overlap.dtypes import ScalingMode
from overlap.errors import InvalidArgumentError, StateError
from overlap.quantization.formats import DirectionFormat
from overlap.quantization.quantizers import HighPrecisionQuantizer, Quantizer
from overlap.quantization.tensor import QuantizedTensor, QuantizedTensorMeta

if TYPE_CHECKING:
    import torch

    from overlap.comm import Communicator, SymmetricBuffer
    from overlap.quantization.amax_reduction import AmaxReducer

__all__ = ["BufferView", "FormatSpec", "GatherBuffer", "required_nbytes"]

#: What a gather holds: a quantizer (its formats), a ``(rowwise, columnwise)`` pair of
#: :class:`DirectionFormat`, a torch dtype (a plain tensor of that dtype) or None (as staged).
FormatSpec = Union[Quantizer, FormatPair, "torch.dtype", None]

_DATA = (PartKind.ROWWISE_DATA, PartKind.COLUMNWISE_DATA)
_SCALE = (PartKind.ROWWISE_SCALE_INV, PartKind.COLUMNWISE_SCALE_INV)


@dataclass(frozen=True)
class _Staged:
    """What the buffer holds, as staged by a manager."""

    layout: GatherLayout
    meta: QuantizedTensorMeta | None  # None: a plain tensor of dtype layout.parts[0].dtype
    usage: tuple[bool, bool]  # usages asked for the gathered tensor
    generation: int  # the buffer's generation when this record was made
    complete: bool  # every slot holds its rank's shard (after gather(), or local_chunk=False)
    owner: int  # id() of the manager that staged it


def _is_dtype(spec: Any) -> bool:
    import torch

    return isinstance(spec, torch.dtype)


def _spec_formats(spec: FormatSpec, what: str) -> FormatPair | None:
    """The formats of a quantizer / format pair; None for a plain dtype."""
    if isinstance(spec, Quantizer):
        return spec.formats
    if (
        isinstance(spec, tuple)
        and len(spec) == 2
        and all(isinstance(f, DirectionFormat) for f in spec)
    ):
        return spec
    if _is_dtype(spec):
        return None
    raise InvalidArgumentError(
        f"{what} must be a Quantizer, a (rowwise, columnwise) pair of DirectionFormat, a torch "
        f"dtype or None, got {type(spec).__name__}"
    )


def _hp_storage_dtype(spec: FormatSpec, default: torch.dtype) -> torch.dtype:
    """The dtype high-precision directions are stored in."""
    for q in (
        spec,
        getattr(spec, "rowwise_quantizer", None),
        getattr(spec, "columnwise_quantizer", None),
    ):
        if isinstance(q, HighPrecisionQuantizer) and q.config.dtype is not None:
            return q.config.dtype
    return default


def required_nbytes(
    max_shape: Sequence[int],
    tp_size: int,
    specs: Sequence[FormatSpec],
    *,
    dtype: torch.dtype,
) -> int:
    """Bytes per rank a buffer needs to gather shards of up to ``max_shape`` (one rank's
    shard) in every spec of ``specs``, with both usages.

    Args:
        max_shape: the largest local shard, ``[s0, ..., K]``.
        tp_size: ranks of the TP group.
        specs: quantizers / format pairs / dtypes (plain tensors) the buffer must hold.
        dtype: the high-precision dtype of the shards (storage of high-precision data).
    """
    if not specs:
        raise InvalidArgumentError("required_nbytes needs at least one format spec")
    sizes = []
    for spec in specs:
        formats = _spec_formats(spec, "a format spec")
        if formats is None:
            sizes.append(gather_layout(max_shape, tp_size, formats=None, dtype=spec).nbytes)
            continue
        directions = gathered_directions(formats, True, True)
        layout = gather_layout(
            max_shape,
            tp_size,
            formats=formats,
            dtype=_hp_storage_dtype(spec, dtype),
            directions=directions,
            validate=False,
        )
        sizes.append(layout.nbytes)
    return max(sizes)


class GatherBuffer:
    """All-gather manager over one symmetric buffer (see the module notes).

    Args:
        buffer: the symmetric buffer of the TP group (shared with nothing that reads peer
            regions while this manager uses it, NOTE [staging is a local write]).
        owns_buffer: :meth:`destroy` also destroys ``buffer``.

    Several managers may share one buffer: they see each other's ops (a view of one is made
    stale by the other's op). Every op that communicates (:meth:`gather`) is COLLECTIVE:
    all ranks of the group call it in the same order with shards of the same shape and
    format; validation happens before any communication, so a call that every rank makes
    with the same bad argument raises on every rank and leaves the buffer usable.
    """

    def __init__(self, buffer: SymmetricBuffer, *, owns_buffer: bool = False) -> None:
        import torch

        if buffer.destroyed:
            raise StateError(f"symmetric buffer {buffer.name!r} is destroyed")
        self._buffer = buffer
        self._owns = bool(owns_buffer)
        self._state: BufferState = buffer_state(buffer)
        self.device: torch.device = buffer.view(torch.uint8, (1,)).device

    @classmethod
    def create(
        cls,
        comm: Communicator,
        max_shape: Sequence[int],
        specs: Sequence[FormatSpec],
        *,
        dtype: torch.dtype,
        name: str = "",
    ) -> GatherBuffer:
        """COLLECTIVE: a manager owning a new buffer sized for shards of up to ``max_shape``
        in each of ``specs`` (see :func:`required_nbytes`)."""
        nbytes = required_nbytes(max_shape, comm.group.size, specs, dtype=dtype)
        return cls(comm.create_buffer(nbytes, name), owns_buffer=True)

    # ---- properties -----------------------------------------------------------------------

    @property
    def buffer(self) -> SymmetricBuffer:
        return self._buffer

    @property
    def name(self) -> str:
        return self._buffer.name

    @property
    def tp_size(self) -> int:
        return self._buffer.size

    @property
    def rank(self) -> int:
        return self._buffer.rank

    @property
    def nbytes(self) -> int:
        """Bytes of each rank's region."""
        return self._buffer.nbytes

    @property
    def generation(self) -> int:
        """The buffer's generation (it changes with every op and local write on it, by any
        object); views of an older generation are stale."""
        return self._state.generation

    # ---- staging --------------------------------------------------------------------------

    def copy_into_buffer(
        self,
        x: torch.Tensor | QuantizedTensor,
        quantizer: Quantizer | None = None,
        local_chunk: bool = True,
        *,
        rowwise: bool | None = None,
        columnwise: bool | None = None,
        amax_group: AmaxReducer | Any | None = None,
    ) -> torch.Tensor | QuantizedTensor:
        """Place this rank's shard (data, scale_inv and the columnwise parts the format
        gathers) into its slots of the buffer. Local: no communication.

        Args:
            x: a high-precision tensor (quantized here with ``quantizer``; or gathered plain
                when ``quantizer`` is None) or an already quantized :class:`QuantizedTensor`
                (e.g. the local shard saved in forward). Shards are ``[s0, ..., K]``,
                quantized ones at least 2-D; on the buffer's device.
            quantizer: the quantizer (a :class:`QuantizedTensor` ``x`` must have its formats).
            local_chunk: ``x`` is this rank's shard (True; call :meth:`gather` next) or the
                whole gathered tensor ``[tp_size * s0, ...]`` whose every shard is placed in its
                slot (False; no gather needed).
            rowwise: the gathered tensor needs rowwise data (default: the quantizer's usage,
                or what ``x`` holds).
            columnwise: the gathered tensor needs columnwise data (same defaults).
            amax_group: the amax reduction group of per-tensor quantization (invariant 3):
                with it every shard gets the same scale. Only used when ``x`` is quantized here.

        Returns:
            The local shard (the whole tensor for ``local_chunk=False``) as quantized here, or
            ``x`` itself: memory of its own, never a view into the buffer, safe to save for
            backward. Per-tensor formats quantize rowwise data only (the gathered tensor's
            columnwise data is a transpose after the gather).

        Raises:
            StateError: the buffer is destroyed.
            InvalidArgumentError: wrong type, dtype or device; a shape the format cannot
                gather or that exceeds the buffer; formats of ``x`` and ``quantizer`` differ;
                ``x`` lacks a direction that must travel. Nothing is written then: views
                and the staged shard stay valid.
        """
        import torch

        self._check_live()
        tp = self.tp_size
        quantized_in = isinstance(x, QuantizedTensor)
        if not quantized_in and not isinstance(x, torch.Tensor):
            raise InvalidArgumentError(
                f"copy_into_buffer expects a torch.Tensor or a QuantizedTensor, got "
                f"{type(x).__name__}"
            )
        if quantizer is not None and not isinstance(quantizer, Quantizer):
            raise InvalidArgumentError(
                f"copy_into_buffer: quantizer must be a Quantizer or None, got "
                f"{type(quantizer).__name__}"
            )
        if x.device != self.device:
            raise InvalidArgumentError(
                f"copy_into_buffer: x is on {x.device}, but buffer {self.name!r} is on "
                f"{self.device}; move it there first"
            )
        sources = x.tensors() if quantized_in else (x,)
        if any(t is not None and self._state.overlaps(t) for t in sources):
            raise InvalidArgumentError(
                f"copy_into_buffer: x is a view into buffer {self.name!r} itself (it would be "
                "overwritten while it is read); stage the saved local shard instead"
            )
        shape = tuple(x.shape)
        if not local_chunk and (len(shape) < 1 or shape[0] % tp):
            raise InvalidArgumentError(
                f"copy_into_buffer(local_chunk=False): the whole tensor's first dim must be "
                f"divisible by the group size {tp}, got shape {list(shape)}"
            )
        shard_shape = shape if local_chunk else (shape[0] // tp, *shape[1:])

        if quantizer is None and not quantized_in:
            layout = gather_layout(shard_shape, tp, formats=None, dtype=x.dtype)
            meta, usage, local = None, (True, False), x
            self._check_fits(layout)
        else:
            if quantized_in:
                formats = x.formats
                if quantizer is not None and quantizer.formats != formats:
                    raise InvalidArgumentError(
                        f"copy_into_buffer: x has formats {_fmt_str(formats)} but the quantizer "
                        f"makes {_fmt_str(quantizer.formats)}"
                    )
                defaults = (x.has_rowwise, x.has_columnwise)
                hp = next(
                    (
                        t.dtype
                        for t in (x.rowwise_data, x.columnwise_data)
                        if t is not None and not _is_fp8(t)
                    ),
                    x.dtype,
                )
            else:
                formats = quantizer.formats
                defaults = (quantizer.rowwise_usage, quantizer.columnwise_usage)
                if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise InvalidArgumentError(
                        f"copy_into_buffer: a tensor to quantize must be float32, bfloat16 or "
                        f"float16, got {x.dtype}"
                    )
                hp = _hp_storage_dtype(quantizer, x.dtype)
            if len(shape) < 2:
                raise InvalidArgumentError(
                    f"copy_into_buffer: a quantized shard must be at least 2-D [s0, ..., K], "
                    f"got shape {list(shape)}"
                )
            usage = (
                defaults[0] if rowwise is None else bool(rowwise),
                defaults[1] if columnwise is None else bool(columnwise),
            )
            directions = gathered_directions(formats, *usage)
            layout = gather_layout(
                shard_shape, tp, formats=formats, dtype=hp, directions=directions
            )
            self._check_fits(layout)
            meta = QuantizedTensorMeta(shard_shape, x.dtype, *formats)
            if quantized_in:
                local = _with_directions(x, directions)
            else:
                local = quantizer.quantize(
                    x, amax_group=amax_group, rowwise=directions[0], columnwise=directions[1]
                )
        # Validated: from here on the buffer is written.
        op = "copy_into_buffer" + ("" if local_chunk else "(local_chunk=False)")
        generation = self._state.bump(op)
        if local_chunk:
            self._write_slot(layout, local, self.rank)
        else:
            s0 = shard_shape[0]
            for k in range(tp):
                part = local.rows(k * s0, (k + 1) * s0) if meta else local[k * s0 : (k + 1) * s0]
                self._write_slot(layout, part, k)
        self._state.staged = _Staged(
            layout, meta, usage, generation, complete=not local_chunk, owner=id(self)
        )
        return local

    def _write_slot(self, layout: GatherLayout, src: Any, k: int) -> None:
        """Copy every travelling part of ``src`` (a shard) into slot ``k``."""
        import torch

        tensors = {PartKind.DATA: src}
        if isinstance(src, QuantizedTensor):
            tensors = dict(
                zip((_DATA[0], _SCALE[0], _DATA[1], _SCALE[1]), src.tensors(), strict=True)
            )
        for part in layout.parts:
            t = tensors[part.kind]
            dst = self._slot(part, k)
            if tuple(t.shape) != tuple(dst.shape):
                t = t.reshape(dst.shape)  # a per-tensor scale_inv of one element
            if t.dtype != dst.dtype:
                # FP8 data given as raw uint8 bytes, E8M0 scales as float8_e8m0fnu.
                dst, t = dst.view(torch.uint8), t.view(torch.uint8)
            dst.copy_(t)

    # ---- the collective -------------------------------------------------------------------

    def gather(self) -> None:
        """COLLECTIVE: gather every rank's staged shard into every rank's buffer, all parts
        (data, scale_inv, columnwise parts) in ONE op. Stream-ordered on cuda.

        Raises:
            StateError: nothing staged, or the staged shard was overwritten by another op on
                the buffer since (stage it again).
        """
        staged = self._current_staged("gather")
        # Whole slots travel (a padded scale slot too: rank k's lands at offset + k * slot).
        parts = [
            (
                self._buffer.view(_uint8(), (p.slot_nbytes,), offset=p.slot_offset(self.rank)),
                p.offset,
            )
            for p in staged.layout.parts
        ]
        self._state.staged = None  # an op that fails half-way leaves nothing to read
        self._buffer.all_gather_into(parts)
        generation = self._state.bump("gather", local=False)  # its epoch moved the generation
        self._state.staged = replace(staged, generation=generation, complete=True)

    # ---- reading --------------------------------------------------------------------------

    def get_buffer(
        self,
        quantizer_or_format: FormatSpec = None,
        local_chunk: bool = False,
        *,
        rowwise: bool | None = None,
        columnwise: bool | None = None,
    ) -> BufferView:
        """A transient view of the gathered tensor (or of this rank's shard).

        Args:
            quantizer_or_format: what the caller expects (checked against what was staged):
                a quantizer or format pair (a quantized tensor), a dtype (a plain tensor), or
                None (whatever was staged).
            local_chunk: view this rank's shard instead of the gathered tensor.
            rowwise: the view's tensor holds rowwise data (default: the usages asked for at
                :meth:`copy_into_buffer`).
            columnwise: same, columnwise.

        Returns:
            A :class:`BufferView`, valid until the next op on the buffer. Its
            :attr:`BufferView.value` is a :class:`QuantizedTensor` of shape
            ``[tp_size * s0, ...]`` (``[s0, ...]`` for ``local_chunk``) whose scale_inv comes
            from the buffer, or a plain tensor.

        Raises:
            StateError: nothing staged, the staged shard was overwritten, or the gather has
                not run (``local_chunk=False`` before :meth:`gather`).
            InvalidArgumentError: the expected format or dtype differs from what was staged,
                or a requested direction did not travel.
        """
        staged = self._current_staged("get_buffer")
        if not local_chunk and not staged.complete:
            raise StateError(
                f"get_buffer: buffer {self.name!r} holds only this rank's staged shard; call "
                "gather() first (or get_buffer(local_chunk=True) for the local shard)"
            )
        if quantizer_or_format is not None:
            formats = _spec_formats(quantizer_or_format, "get_buffer's quantizer_or_format")
            if staged.meta is None:
                want_dtype = staged.layout.parts[0].dtype
                if formats is not None or quantizer_or_format != want_dtype:
                    raise InvalidArgumentError(
                        f"get_buffer: the buffer holds a plain {want_dtype} tensor, not "
                        f"{_spec_str(quantizer_or_format)}"
                    )
            elif formats != staged.layout.formats:
                raise InvalidArgumentError(
                    f"get_buffer: the buffer holds formats {_fmt_str(staged.layout.formats)}, "
                    f"not {_spec_str(quantizer_or_format)}"
                )
        usage = staged.usage
        if staged.meta is not None:
            usage = (
                usage[0] if rowwise is None else bool(rowwise),
                usage[1] if columnwise is None else bool(columnwise),
            )
            have = staged.layout.directions
            can = (have[0], have[1] or (have[0] and derived_after_gather(staged.layout.formats)))
            for col, name in ((0, "rowwise"), (1, "columnwise")):
                if usage[col] and not can[col]:
                    raise InvalidArgumentError(
                        f"get_buffer: {name} data did not travel in this gather; stage with "
                        f"{name}=True"
                    )
            if not any(usage):
                raise InvalidArgumentError("get_buffer: rowwise and columnwise both False")
        return BufferView(self, staged, usage, local_chunk)

    def all_gather(
        self,
        x: torch.Tensor | QuantizedTensor,
        quantizer: Quantizer | None = None,
        *,
        rowwise: bool | None = None,
        columnwise: bool | None = None,
        amax_group: AmaxReducer | Any | None = None,
    ) -> tuple[torch.Tensor | QuantizedTensor, BufferView]:
        """COLLECTIVE: :meth:`copy_into_buffer` + :meth:`gather` + :meth:`get_buffer`.

        Returns:
            ``(local shard, view of the gathered tensor)``: save the first, use the second now.
        """
        local = self.copy_into_buffer(
            x, quantizer, rowwise=rowwise, columnwise=columnwise, amax_group=amax_group
        )
        self.gather()
        return local, self.get_buffer(quantizer)

    # ---- lifecycle ------------------------------------------------------------------------

    def destroy(self) -> None:
        """Make every view stale; destroy the buffer if this manager owns it. Idempotent."""
        self._state.bump("destroy")
        self._state.staged = None
        if self._owns:
            self._buffer.destroy()

    # ---- internals ------------------------------------------------------------------------

    def _check_live(self) -> None:
        if self._buffer.destroyed:
            raise StateError(f"buffer {self.name!r} is destroyed")

    def _check_fits(self, layout: GatherLayout) -> None:
        if layout.nbytes > self.nbytes:
            raise InvalidArgumentError(
                f"shards of shape {list(layout.shape)} ({_fmt_str(layout.formats)}) need "
                f"{layout.nbytes} bytes per rank for {self.tp_size} ranks, but buffer "
                f"{self.name!r} has {self.nbytes}; create it for a larger max shape"
            )

    def _current_staged(self, op: str) -> _Staged:
        self._check_live()
        staged = self._state.staged
        if staged is None:
            raise StateError(
                f"{op}: nothing is staged in buffer {self.name!r} (last op: "
                f"{self._state.last_op}); call copy_into_buffer() first"
            )
        if staged.generation != self._state.generation or staged.owner != id(self):
            raise StateError(
                f"{op}: what this manager staged in buffer {self.name!r} was overwritten by a "
                f"later op ({self._state.last_op}, possibly by another manager of the buffer); "
                "stage it again"
            )
        return staged

    def _slot(self, part: PartLayout, k: int) -> torch.Tensor:
        return self._buffer.view(part.dtype, part.slot_shape, offset=part.slot_offset(k))

    def _region(self, part: PartLayout) -> torch.Tensor:
        """All slots as one tensor, concatenated along the first stored dim (a strided view
        when the slots are padded, NOTE [one scale slot])."""
        s = part.slot_shape
        if part.padded:
            per_slot = part.slot_nbytes // part.dtype.itemsize
            numel = math.prod(s)
            slots = self._buffer.view(part.dtype, (part.tp_size, per_slot), offset=part.offset)
            return slots[:, :numel].reshape(part.tp_size * s[0], *s[1:])
        return self._buffer.view(part.dtype, (part.tp_size * s[0], *s[1:]), offset=part.offset)

    def __repr__(self) -> str:
        return (
            f"GatherBuffer({self.name!r}, rank={self.rank}, tp_size={self.tp_size}, "
            f"nbytes={self.nbytes}, generation={self.generation})"
        )


class BufferView(BufferValue):
    """A gathered tensor (or one rank's shard) in a buffer, valid until the next op on it.

    Made by :meth:`GatherBuffer.get_buffer`. Every accessor first checks that no op has run
    on the buffer since the view was made, and raises :class:`~overlap.errors.StateError`
    otherwise. Tensors taken out of :attr:`value` alias the buffer: use them at once, and
    never save them for backward (:func:`~overlap.buffers.saveable` copies them).
    """

    def __init__(
        self, manager: GatherBuffer, staged: _Staged, usage: tuple[bool, bool], local: bool
    ) -> None:
        self._mgr = manager
        self._staged = staged
        self._usage = usage
        self._local = local
        self._value: torch.Tensor | QuantizedTensor | None = None

    # ---- state ----------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The buffer generation this view belongs to."""
        return self._staged.generation

    @property
    def stale(self) -> bool:
        """True once another op ran on the buffer (the view may no longer be used)."""
        state = self._mgr._state
        return state.generation != self._staged.generation or not state.live

    @property
    def buffer_name(self) -> str:
        return self._mgr.name

    def check(self) -> None:
        """Raise StateError if the view is stale."""
        if self.stale:
            state = self._mgr._state
            raise StateError(
                f"stale view of buffer {self.buffer_name!r}: made at op #{self.generation}, "
                f"but the buffer has since been overwritten (op #{state.generation}: "
                f"{state.last_op}). A view is valid until the next op on its buffer; keep the "
                "local shard and re-gather, or copy the view (saveable) while it is valid"
            )

    # ---- description (no buffer access) ---------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape: ``[tp_size * s0, ...]``, or ``[s0, ...]`` for a local view."""
        layout = self._staged.layout
        return layout.shape if self._local else layout.gathered_shape

    @property
    def quantized(self) -> bool:
        return self._staged.meta is not None

    @property
    def formats(self) -> FormatPair | None:
        """``(rowwise, columnwise)`` formats; None for a plain tensor."""
        return self._staged.layout.formats

    @property
    def usage(self) -> tuple[bool, bool]:
        """``(rowwise, columnwise)`` directions :attr:`value` holds."""
        return self._usage

    # ---- access ---------------------------------------------------------------------------

    @property
    def value(self) -> torch.Tensor | QuantizedTensor:
        """The gathered tensor (the local shard for a local view): a :class:`QuantizedTensor`
        whose scale_inv lives in the buffer, or a plain tensor aliasing the buffer.

        Raises:
            StateError: the view is stale.
            InvalidArgumentError: per-tensor shards with different scales (NOTE [one scale
                per per-tensor tensor]); use :meth:`shard` per shard.
        """
        self.check()
        if self._value is None:
            ks = [self._mgr.rank] if self._local else list(range(self._mgr.tp_size))
            self._value = self._assemble(ks)
        return self._value

    def shard(self, k: int) -> torch.Tensor | QuantizedTensor:
        """Rank ``k``'s shard ``[s0, ...]`` with its own scale_inv, without a copy (except the
        transpose of a per-tensor columnwise direction). For per-chunk GEMMs.

        Raises:
            StateError: stale, or a local view and ``k`` is not this rank.
            InvalidArgumentError: ``k`` outside the group.
        """
        self.check()
        if not 0 <= k < self._mgr.tp_size:
            raise InvalidArgumentError(f"shard {k} is outside a group of {self._mgr.tp_size}")
        if self._local and k != self._mgr.rank:
            raise StateError(
                f"a local view holds only rank {self._mgr.rank}'s shard (before the gather, "
                "the other slots are stale)"
            )
        return self._assemble([k])

    def shard_scale_invs(self, *, columnwise: bool = False) -> torch.Tensor:
        """float32 ``[tp_size]``: every shard's per-tensor scale_inv of a TENSOR direction
        (a copy).

        Raises:
            StateError: stale, or a local view.
            InvalidArgumentError: the direction is not per-tensor or did not travel.
        """
        self.check()
        if self._local:
            raise StateError("shard_scale_invs needs the gathered view, not a local one")
        part = self._scale_part(columnwise)
        return self._mgr._region(part).reshape(-1).clone()

    @property
    def uniform_scale(self) -> bool:
        """True if every per-tensor direction's shards share one scale_inv (True for
        formats without per-tensor scales). Reads the scales (a device sync on cuda)."""
        self.check()
        if self.formats is None or self._local:
            return True
        layout = self._staged.layout
        for col in (False, True):
            part = layout.part(_SCALE[col])
            per_tensor = part is not None and layout.formats[col].mode is ScalingMode.TENSOR
            if per_tensor and not _all_equal(self._mgr._region(part)):
                return False
        return True

    def dequantize(self, *, dtype: torch.dtype | None = None, columnwise: bool | None = None):
        """The values in high precision (a new tensor of its own; see
        :meth:`QuantizedTensor.dequantize`); a plain view is copied."""
        value = self.value
        if isinstance(value, QuantizedTensor):
            return value.dequantize(dtype=dtype, columnwise=columnwise)
        return value.to(dtype or value.dtype, copy=True)

    def clone(self) -> torch.Tensor | QuantizedTensor:
        """A copy of :attr:`value` that does not alias the buffer (safe to save)."""
        from overlap.buffers.aliasing import saveable

        return saveable(self)

    # ---- internals ------------------------------------------------------------------------

    def _scale_part(self, columnwise: bool) -> PartLayout:
        layout = self._staged.layout
        part = layout.part(_SCALE[columnwise])
        if part is None or layout.formats[columnwise].mode is not ScalingMode.TENSOR:
            raise InvalidArgumentError(
                f"no per-tensor {'columnwise' if columnwise else 'rowwise'} scales travelled "
                f"in this gather ({_fmt_str(layout.formats)})"
            )
        return part

    def _assemble(self, ks: list[int]) -> torch.Tensor | QuantizedTensor:
        """The tensor of shards ``ks`` (one shard, or all of them in order)."""
        mgr, layout, meta = self._mgr, self._staged.layout, self._staged.meta
        if meta is None:
            part = layout.parts[0]
            return mgr._slot(part, ks[0]) if len(ks) == 1 else mgr._region(part)
        data: list[torch.Tensor | None] = [None, None]
        scales: list[torch.Tensor | None] = [None, None]
        need_row = self._usage[0] or (self._usage[1] and not layout.directions[1])
        for col in (False, True):
            if layout.directions[col] and (self._usage[col] or (not col and need_row)):
                data[col], scales[col] = self._direction(col, ks)
        if self._usage[1] and not layout.directions[1]:
            # NOTE [which directions travel]: made from the gathered rowwise data.
            fmt = layout.formats[1]
            if fmt.mode is None:
                data[1] = data[0]
            else:
                data[1] = data[0].view(_uint8()).t().contiguous().view(data[0].dtype)
                scales[1] = scales[0]
        if not self._usage[0]:
            data[0] = scales[0] = None
        shape = (len(ks) * layout.shape[0], *layout.shape[1:])
        return QuantizedTensor.from_tensors(
            [data[0], scales[0], data[1], scales[1]], replace(meta, shape=shape)
        )

    def _direction(self, col: bool, ks: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Data and scale_inv of one travelled direction for shards ``ks``."""
        import torch

        mgr, layout = self._mgr, self._staged.layout
        fmt = layout.formats[col]
        transposed = fmt.transposed(col)

        def pick(part: PartLayout) -> torch.Tensor:
            if len(ks) == 1:
                return mgr._slot(part, ks[0])
            if not transposed:
                return mgr._region(part)
            # Slots [K, m] -> [K, tp * m]: one copy (NOTE [slot contiguity]).
            slots = [mgr._slot(part, k) for k in ks]
            if slots[0].element_size() == 1:
                return torch.cat([s.view(torch.uint8) for s in slots], dim=1).view(part.dtype)
            return torch.cat(slots, dim=1)

        data = pick(layout.part(_DATA[col]))
        scale_part = layout.part(_SCALE[col])
        if scale_part is None:
            return data, None
        if fmt.mode is not ScalingMode.TENSOR:
            return data, pick(scale_part)
        if len(ks) == 1:
            return data, mgr._slot(scale_part, ks[0])
        if not _all_equal(mgr._region(scale_part)):
            values = mgr._region(scale_part).reshape(-1).tolist()
            raise InvalidArgumentError(
                f"the gathered {'columnwise' if col else 'rowwise'} {fmt} shards were quantized "
                f"with different scales (scale_inv per rank: {values}), so the gathered tensor "
                "has no single scale_inv. Quantize with the TP group as amax_group (one shared "
                "scale), or use BufferView.shard(k) / shard_scale_invs() per shard"
            )
        return data, mgr._slot(scale_part, 0)


# ---- small helpers ---------------------------------------------------------------------------


def _uint8() -> torch.dtype:
    import torch

    return torch.uint8


def _all_equal(scales: torch.Tensor) -> bool:
    """True if every float32 scale_inv has the same bits (NaN included). On cuda this reads
    the values back: a sync of the current stream."""
    import torch

    bits = scales.view(torch.int32).reshape(-1)
    return bool((bits == bits[0]).all())


def _is_fp8(t: torch.Tensor) -> bool:
    import torch

    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _with_directions(x: QuantizedTensor, directions: tuple[bool, bool]) -> QuantizedTensor:
    """``x`` holding (at least) the travelling directions; a missing one is derived exactly
    (per-tensor, 128x128, high precision) on a shallow copy, never by changing ``x``."""
    missing = [col for col in (0, 1) if directions[col] and x.tensors()[2 * col] is None]
    if not missing:
        return x
    for col in missing:
        if not x.can_derive(columnwise=bool(col)):
            which = "columnwise" if col else "rowwise"
            raise InvalidArgumentError(
                f"copy_into_buffer: the quantized shard holds no {which} data and it cannot be "
                f"made from the other direction ({_fmt_str(x.formats)}); quantize the shard "
                f"with {which} usage"
            )
    y = QuantizedTensor.from_tensors(x.tensors(), x.meta)
    y.update_usage(
        rowwise=True if directions[0] else None, columnwise=True if directions[1] else None
    )
    return y


def _fmt_str(formats: FormatPair | None) -> str:
    if formats is None:
        return "a plain tensor"
    return f"(rowwise {formats[0]}, columnwise {formats[1]})"


def _spec_str(spec: FormatSpec) -> str:
    if isinstance(spec, Quantizer):
        return f"{type(spec).__name__} formats {_fmt_str(spec.formats)}"
    if _is_dtype(spec):
        return f"a plain {spec} tensor"
    return _fmt_str(spec)  # type: ignore[arg-type]

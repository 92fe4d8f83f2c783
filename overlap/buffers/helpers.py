"""Helpers layers use around a :class:`~overlap.buffers.GatherBuffer` (docs/design.md §3,
invariant 2).

A sequence-parallel layer gathers its activation in forward and needs the gathered
activation's columnwise operand again for wgrad in backward. Between the two, other layers
overwrite the shared buffer, so the layer saves its LOCAL shard, never the gathered view, and
re-gathers in backward::

    # forward
    saved, view = gather_activation(mgr, x, quantizer, amax_group=tp_group)
    y = gemm(view.value, w)            # the view is valid until the next op on mgr's buffer
    ctx.save_for_backward(*saved.tensors()); ctx.meta = saved.meta
    # backward
    saved = QuantizedTensor.from_tensors(ctx.saved_tensors, ctx.meta)
    x_total = gather_for_wgrad(mgr, saved, quantizer)
    dw = gemm(dy_columnwise, x_total.value.columnwise_data, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from overlap.buffers.layout import derived_after_gather

if TYPE_CHECKING:
    import torch

    from overlap.buffers.manager import BufferView, GatherBuffer
    from overlap.quantization.amax_reduction import AmaxReducer
    from overlap.quantization.quantizers import Quantizer
    from overlap.quantization.tensor import QuantizedTensor

__all__ = ["gather_activation", "gather_for_wgrad"]


def gather_activation(
    manager: GatherBuffer,
    x: torch.Tensor,
    quantizer: Quantizer | None = None,
    *,
    amax_group: AmaxReducer | Any | None = None,
    for_wgrad: bool = True,
) -> tuple[torch.Tensor | QuantizedTensor, BufferView]:
    """COLLECTIVE, forward: quantize this rank's activation shard ``x`` ``[s0, ..., K]`` and
    gather its rowwise operand.

    Args:
        manager: the gather buffer of the TP group.
        x: this rank's high-precision shard, on the buffer's device.
        quantizer: the activation's quantizer; None gathers ``x`` as it is.
        amax_group: the TP group for per-tensor scaling (one scale for every shard).
        for_wgrad: also quantize the columnwise direction locally when the format cannot make
            it from the rowwise one after the gather (block and MX formats, hybrids), so that
            :func:`gather_for_wgrad` can re-gather it from the saved shard. Only the rowwise
            direction travels now.

    Returns:
        ``(shard to save, view)``: the local shard owns its memory (save it); the view of the
        gathered ``[tp_size * s0, ..., K]`` rowwise tensor is valid until the next op on the
        buffer.
    """
    if quantizer is None:
        local: torch.Tensor | QuantizedTensor = x
    else:
        need_col = for_wgrad and not derived_after_gather(quantizer.formats)
        local = quantizer.quantize(x, amax_group=amax_group, rowwise=True, columnwise=need_col)
    manager.copy_into_buffer(local, quantizer, rowwise=True, columnwise=False)
    manager.gather()
    return local, manager.get_buffer(quantizer, rowwise=True, columnwise=False)


def gather_for_wgrad(
    manager: GatherBuffer,
    saved: torch.Tensor | QuantizedTensor,
    quantizer: Quantizer | None = None,
) -> BufferView:
    """COLLECTIVE, backward: re-gather a saved local activation shard for wgrad.

    Args:
        manager: the gather buffer of the TP group.
        saved: the local shard returned by :func:`gather_activation` (or any quantized shard
            holding the columnwise data, or rowwise data of a per-tensor / high-precision
            format), or a plain tensor.
        quantizer: optional; when given, ``saved`` must have its formats.

    Returns:
        A view of the gathered tensor with its columnwise operand (for per-tensor FP8 the
        transpose of the gathered rowwise data, with the shards' one scale_inv from the
        buffer); a plain gathered tensor for a plain ``saved``.
    """
    from overlap.quantization.tensor import QuantizedTensor

    if isinstance(saved, QuantizedTensor):
        manager.copy_into_buffer(saved, quantizer, rowwise=False, columnwise=True)
        manager.gather()
        return manager.get_buffer(quantizer, rowwise=False, columnwise=True)
    manager.copy_into_buffer(saved, quantizer)
    manager.gather()
    return manager.get_buffer(quantizer)

"""Reading a gathered input back out of a buffer laid out as NOTE [ag_gemm layout] says.

Shared by :class:`~overlap.ops.AllGatherGemm` and :class:`~overlap.ops.AllGatherBesideGemm`,
whose buffers hold the gathered rows ``[tp * m, K]`` followed, for FP8 shards, by one 16-byte
scale slot per rank.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from overlap._native import native
from overlap.errors import StateError
from overlap.quantization import DirectionFormat, QuantizedTensor

if TYPE_CHECKING:
    import torch

    from overlap.comm import SymmetricBuffer

# What the last call gathered: (m rows per rank, the high-precision dtype, the rowwise FP8
# format or None for a plain tensor).
LastGather = tuple[int, "torch.dtype", DirectionFormat | None]


@dataclasses.dataclass(frozen=True)
class GatherState:
    """What reading the gathered input back needs: the op's name (messages), its buffer, the
    TP size, the dtype the shards travel in, K, and what the last call gathered (None before
    the first call)."""

    op: str
    buffer: SymmetricBuffer
    tp: int
    dtype: torch.dtype
    k: int
    last: LastGather | None
    generation: int = 0  # the buffer's generation right after the last call

    def check(self) -> None:
        """The last call's gather is still what the buffer holds (NOTE [buffer generation] in
        overlap.comm.communicator): no op of any object sharing the buffer ran since."""
        if self.last is None:
            raise StateError(f"{self.op}: gathered_input() before the first call")
        self.buffer.check_current(self.generation, f"{self.op}: the gathered input")


def gathered_scale_invs(g: GatherState) -> torch.Tensor:
    """FP8: the float32 ``[tp]`` scale_invs of the last call's shards, from the buffer."""
    import torch

    g.check()
    if g.last is None or g.last[2] is None:
        raise StateError(f"{g.op}: no FP8 call yet")
    shard_bytes = g.last[0] * g.k * g.dtype.itemsize
    scale_offset, _ = native().comm_ops.ag_gemm_layout(g.tp, shard_bytes, True)
    # One slot per rank (NOTE [ag_gemm layout]): the scale_inv is its first float.
    per_slot = int(native().comm_ops.SCALE_SLOT_BYTES) // 4
    return g.buffer.view(torch.float32, (g.tp, per_slot), offset=int(scale_offset))[:, 0]


def gathered_input(g: GatherState, *, check_scales: bool = True) -> torch.Tensor | QuantizedTensor:
    """The last call's gathered ``[tp * m, k]`` input, a view of the buffer (FP8: a
    :class:`QuantizedTensor` with the one scale_inv every rank's shard must share, a view of
    rank 0's scale slot).

    ``check_scales=False`` skips the check that every shard's scale_inv is the same (it reads
    them on the host: a device sync on cuda), for callers that quantized the shards with an
    amax reduced over the group, which makes them equal by construction.

    Raises:
        StateError: before the first call, after another op on the buffer (it was
            overwritten), or FP8 shards whose scale_invs differ.
    """
    g.check()
    m, hp_dtype, fmt = g.last  # type: ignore[misc]
    rows = g.tp * m
    # The shards' own encoding (an E5M2 gradient may travel in an E4M3 op's buffer).
    data = g.buffer.view(g.dtype if fmt is None else fmt.fp8.torch_dtype, (rows, g.k))
    if fmt is None:
        return data
    scales = gathered_scale_invs(g)
    if check_scales and not bool((scales == scales[0]).all()):
        raise StateError(
            f"{g.op}: the ranks' shards have different scale_inv values "
            f"({scales.tolist()}); a gathered per-tensor FP8 tensor needs one (quantize with "
            "an amax reduced over the TP group, docs/design.md §3, invariant 3). Use "
            "gathered_scale_invs() to read them"
        )
    return QuantizedTensor(
        shape=(rows, g.k),
        dtype=hp_dtype,
        rowwise_format=fmt,
        columnwise_format=DirectionFormat(),
        rowwise_data=data,
        rowwise_scale_inv=scales[:1],
    )


class CallRecord:
    """What an op's last call left in its buffer, eager or captured into a CUDA graph (NOTE
    [buffer generation] in overlap.comm.communicator): after a replay of the graph, the buffer
    holds the captured call's gather, not the last eager call's."""

    def __init__(self) -> None:
        self.eager: tuple[LastGather, int, bool] | None = None
        self.captured: tuple[LastGather, int, bool] | None = None

    def note(self, buffer: SymmetricBuffer, last: LastGather, kept: bool, cuda: bool) -> None:
        """Record a call that just ran on ``buffer`` (``kept``: it left the whole gathered
        input there; ``cuda``: the op runs on a GPU, so it may have been captured into a
        graph, which an op of the host transport never is)."""
        record = (last, buffer.generation, kept)
        self.eager = record
        if cuda:
            import torch

            if torch.cuda.is_current_stream_capturing():
                self.captured = record

    def current(self, buffer: SymmetricBuffer) -> tuple[LastGather | None, int, bool]:
        """``(last gather, its generation, kept)`` of the call the buffer holds now: the
        captured one right after a replay of its graph, else the latest eager one."""
        replayed = buffer.replayed_from
        if self.captured is not None and replayed is not None and replayed == self.captured[1]:
            return self.captured
        if self.eager is None:
            return None, 0, False
        return self.eager

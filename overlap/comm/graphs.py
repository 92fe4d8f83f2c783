"""CUDA graphs that contain communication ops.

Communication ops synchronise ranks through flags that carry epochs, each used once, so a
graph captured with plain :func:`torch.cuda.graph` would replay the epochs it was captured with
and break the buffer-reuse protocol: such a capture is refused with
:class:`~overlap.errors.UnsupportedHardwareError`. :class:`CudaGraph` captures through a log
of the ops and, before every replay, rewrites the graph's signals and waits to fresh epochs
(NOTE [graph capture] in ``csrc/comm/cuda/graph_log.h``)::

    graph = overlap.comm.CudaGraph()
    op(x, w)                      # warm up eagerly first (GEMM plans, side streams)
    with graph.capture():
        y = op(x, w)              # COLLECTIVE ops, captured on every rank
    for _ in range(steps):
        x.copy_(next_input())     # static inputs, as with any CUDA graph
        graph.replay()            # y holds the new result

Rules: every rank captures the same ops in the same order and replays as often as the others
(a replay counts as issuing the captured ops again); no other op may run on a captured buffer
while it is being captured; buffers used by the graph must stay alive while it is replayed.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator
from typing import Any

from overlap._native import native
from overlap.comm.communicator import live_buffers
from overlap.errors import StateError, UnsupportedHardwareError

__all__ = ["CudaGraph"]


class CudaGraph:
    """A :class:`torch.cuda.CUDAGraph` whose captured communication ops replay safely.

    Args:
        pool: optional memory pool handle shared with other graphs (as for
            :func:`torch.cuda.graph`).

    Raises:
        UnsupportedHardwareError: this build of overlap has no CUDA support.
    """

    def __init__(self, pool: Any = None) -> None:
        import torch

        if not hasattr(native().comm, "begin_graph_log"):
            raise UnsupportedHardwareError(
                "overlap.comm.CudaGraph needs an overlap build with CUDA support (this one was "
                "built without it)"
            )
        if not torch.cuda.is_available():
            raise UnsupportedHardwareError("overlap.comm.CudaGraph needs a CUDA device")
        self._graph = torch.cuda.CUDAGraph(keep_graph=True)
        self._pool = pool
        self._log: Any = None
        self._stream: Any = None
        self._instantiated = False
        self._touched: list[tuple[Any, int]] = []  # (weakref to a buffer, its generation)
        self._reset = False

    @property
    def torch_graph(self) -> Any:
        """The underlying :class:`torch.cuda.CUDAGraph` (replay it only through
        :meth:`replay`)."""
        return self._graph

    @property
    def ops(self) -> int:
        """Epochs of communication ops captured (0 before :meth:`capture`): one per op, more
        for the ops that take several (AG+GEMM and pipelined GEMM+RS: 5, NOTE [ag_gemm
        pieces]; ring GEMM+RS: NOTE [ring sub-epochs])."""
        return 0 if self._log is None else int(self._log.ops)

    @contextlib.contextmanager
    def capture(self, stream: Any = None) -> Iterator[CudaGraph]:
        """Capture the body's work (COLLECTIVE for the communication ops in it).

        Args:
            stream: the capture stream (default: a side stream, as :func:`torch.cuda.graph`).

        Raises:
            StateError: the graph was already captured.
        """
        import torch

        if self._log is not None or self._reset:
            raise StateError("this CudaGraph was already captured; create a new one")
        before = {id(b): b.generation for b in live_buffers()}
        # NOTE [collector during capture]: a cyclic-garbage collection inside the capture may
        # finalise objects that free driver resources (a handle's buffers, streams, events).
        # Those calls are illegal while any stream captures and invalidate the capture, at a
        # point that depends on the collector's timing. torch.cuda.graph collects on entry;
        # the collector then stays off until the capture ends. Verdict: no collection inside.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(self._graph, pool=self._pool, stream=stream):
                capturing = torch.cuda.current_stream()
                self._log = native().comm.begin_graph_log(stream=capturing.cuda_stream)
                try:
                    yield self
                finally:
                    native().comm.end_graph_log(self._log)
        finally:
            if collecting:
                gc.enable()
        self._stream = capturing
        # The buffers the capture touched, at the generation it left them (NOTE [buffer
        # generation]): a replay brings them back there.
        self._touched = [
            (weakref.ref(b), b.generation)
            for b in live_buffers()
            if before.get(id(b)) != b.generation
        ]

    def replay(self) -> None:
        """Launch the graph on the current stream, with fresh epochs for its ops.

        Raises:
            StateError: nothing captured yet, or a buffer the graph uses was destroyed.
            CommTimeoutError: an earlier op of a communicator the graph uses timed out.
        """
        import torch

        if self._reset:
            raise StateError("CudaGraph.replay() after reset(): capture a new graph")
        if self._log is None:
            raise StateError("CudaGraph.replay() before capture()")
        if not self._instantiated:
            self._graph.instantiate()
            self._instantiated = True
        stream = torch.cuda.current_stream()
        self._log.prepare_replay(
            self._graph.raw_cuda_graph(),
            self._graph.raw_cuda_graph_exec(),
            stream=stream.cuda_stream,
        )
        self._graph.replay()
        for ref, captured in self._touched:
            buf = ref()
            if buf is not None:
                buf.note_replay(captured)

    def reset(self) -> None:
        """Free the graph and its captured ops now, without waiting for garbage collection.

        NCCL's communicator teardown (``torch.distributed.destroy_process_group``) waits until
        every graph that captured one of its collectives is destroyed: free such graphs first
        (NOTE [graph teardown] in ``overlap/layers/graphs.py``). Idempotent; the graph cannot
        be replayed afterwards (StateError).
        """
        if self._reset:
            return
        self._reset = True
        self._graph.reset()
        self._log = None
        self._touched = []

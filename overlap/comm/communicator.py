"""Communicator and symmetric buffers: the Python face of the userbuffers runtime.

A :class:`Communicator` binds a TP group (given as a :class:`~overlap.comm.Bootstrap`) to a
transport; :meth:`Communicator.create_buffer` runs the collective rendezvous that gives every
rank a mapping of every peer's region. Collectives run on those buffers.

Stream contract: on the cuda transport every op is enqueued on the caller's current stream
and returns without synchronising the host. The host transport runs ops synchronously.
"""

from __future__ import annotations

import enum
import itertools
import os
import secrets
import warnings
from typing import TYPE_CHECKING, Any

from overlap._native import native
from overlap.comm.bootstrap import Bootstrap, check_single_host
from overlap.env import settings
from overlap.errors import BootstrapError, ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    import torch

__all__ = ["Communicator", "SymmetricBuffer", "TransportKind"]


class TransportKind(enum.Enum):
    """How buffers are shared between the ranks of a group."""

    HOST = "host"  # POSIX shared memory; CPU tensors (what CI runs)
    CUDA = "cuda"  # CUDA IPC; CUDA tensors (the product)


def _stream_of(t: torch.Tensor) -> int:
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


class SymmetricBuffer:
    """One region per rank of a group, each rank mapping all of them. Create it with
    :meth:`Communicator.create_buffer`; free it with :meth:`destroy` (idempotent).

    Every op is COLLECTIVE: all ranks of the group call the same ops in the same order.
    """

    def __init__(self, core: Any, name: str) -> None:
        self._core = core
        self.name = name

    @property
    def nbytes(self) -> int:
        """Bytes of the data region of each rank."""
        return int(self._core.nbytes)

    @property
    def rank(self) -> int:
        return int(self._core.rank)

    @property
    def size(self) -> int:
        return int(self._core.size)

    @property
    def destroyed(self) -> bool:
        return bool(self._core.destroyed)

    def all_gather(self, input: torch.Tensor, output: torch.Tensor | None = None) -> torch.Tensor:
        """Gather ``input`` of every rank.

        Args:
            input: contiguous tensor of any dtype and shape ``[m, ...]``, the same on all ranks,
                on the transport's device; ``size * input.nbytes`` must fit in the buffer.
            output: optional contiguous tensor of shape ``[size * m, ...]`` and ``input``'s
                dtype to receive the result (allocated when omitted).

        Returns:
            ``output``: rank ``k``'s input in rows ``[k * m, (k + 1) * m)``.
        """
        if getattr(input, "dim", lambda: 0)() == 0:
            raise InvalidArgumentError("all_gather input must be a tensor of at least 1 dim")
        output = self._output_like(input, output, input.shape[0] * self.size)
        self._core.all_gather(input, stream=_stream_of(input))
        self._core.copy_out(output, 0, stream=_stream_of(output))
        return output

    def reduce_scatter(
        self, input: torch.Tensor, output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sum ``input`` over ranks and keep this rank's share, with fp32 accumulation.

        Args:
            input: contiguous float32/bfloat16/float16 tensor of shape ``[size * m, ...]``
                (rows ``[k * m, (k + 1) * m)`` are destined to rank ``k``).
            output: optional contiguous tensor ``[m, ...]`` of ``input``'s dtype.

        Returns:
            ``output`` = sum over ranks of their rows for this rank. Every rank sums in rank
            order, so the result does not depend on which rank computed it.
        """
        if getattr(input, "dim", lambda: 0)() == 0 or input.shape[0] % self.size:
            raise InvalidArgumentError(
                f"reduce_scatter input of shape {tuple(input.shape)} must have a first "
                f"dimension divisible by the group size {self.size}"
            )
        output = self._output_like(input, output, input.shape[0] // self.size)
        self._core.reduce_scatter(input, output, stream=_stream_of(input))
        return output

    def barrier(self) -> None:
        """Return once every rank of the group has entered the barrier."""
        self._core.barrier()

    def destroy(self) -> None:
        """Unmap the peers and free the local region. Idempotent; not collective."""
        self._core.destroy()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None and not core.destroyed:
            warnings.warn(
                f"symmetric buffer {self.name!r} was garbage-collected without destroy(); "
                "freeing it now",
                ResourceWarning,
                stacklevel=2,
            )
            core.destroy()

    def _output_like(
        self, input: torch.Tensor, output: torch.Tensor | None, rows: int
    ) -> torch.Tensor:
        import torch

        if not isinstance(input, torch.Tensor):
            raise InvalidArgumentError(f"expected a torch.Tensor, got {type(input).__name__}")
        shape = (rows, *input.shape[1:])
        if output is None:
            return torch.empty(shape, dtype=input.dtype, device=input.device)
        if tuple(output.shape) != shape or output.dtype != input.dtype:
            raise InvalidArgumentError(
                f"output must be {input.dtype} of shape {shape}, got {output.dtype} of shape "
                f"{tuple(output.shape)}"
            )
        return output


class Communicator:
    """The userbuffers runtime of one TP group.

    Args:
        group: the TP group's bootstrap (all its ranks must be on one host).
        transport: ``TransportKind.HOST`` (CPU tensors) or ``TransportKind.CUDA``.
        timeout_s: deadline of every wait (default ``OVERLAP_TIMEOUT_S``, 60 s).

    Construction is COLLECTIVE over ``group``.
    """

    def __init__(
        self,
        group: Bootstrap,
        transport: TransportKind | str = TransportKind.HOST,
        *,
        timeout_s: float | None = None,
    ) -> None:
        try:
            self.transport = TransportKind(transport)
        except ValueError:
            raise ConfigError(
                f"unknown transport {transport!r}; use one of {[t.value for t in TransportKind]}"
            ) from None
        self.timeout_s = settings().timeout_s if timeout_s is None else float(timeout_s)
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s}")
        if self.transport is TransportKind.CUDA:
            from overlap.errors import UnsupportedHardwareError

            raise UnsupportedHardwareError(
                "the cuda transport is not implemented yet; use TransportKind.HOST"
            )
        self.group = group
        check_single_host(group, "a communicator's group")
        # NOTE [shm names]: a token from rank 0 makes names unique per job and group.
        token = secrets.token_hex(6) if group.rank == 0 else None
        job = group.broadcast_bytes(
            f"{token}-{os.getpid()}".encode() if token else None, root=0
        ).decode()
        self._tag = job
        self._counter = itertools.count()
        self._core_transport = native().comm.make_host_transport()
        self._buffers: list[SymmetricBuffer] = []

    def create_buffer(self, nbytes: int, name: str = "") -> SymmetricBuffer:
        """COLLECTIVE: a symmetric buffer with ``nbytes`` of data per rank.

        Raises:
            BootstrapError: ranks asked for different sizes, or a rank could not map a peer;
                raised on every rank, and nothing stays allocated.
        """
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidArgumentError(f"nbytes must be a positive int, got {nbytes!r}")
        index = next(self._counter)
        tag = f"{self._tag}-{self.group.rank}-{index}"
        core = native().comm.SymmetricBuffer(
            transport=self._core_transport,
            rank=self.group.rank,
            size=self.group.size,
            nbytes=nbytes,
            tag=tag,
            timeout_s=self.timeout_s,
        )
        handles = self.group.allgather_bytes(core.local_handle())
        error = ""
        try:
            core.connect(handles)
        except Exception as exc:
            error = str(exc)
        errors = [e.decode() for e in self.group.allgather_bytes(error.encode())]
        if any(errors):
            core.destroy()
            first = next(r for r, e in enumerate(errors) if e)
            raise BootstrapError(
                f"creating symmetric buffer {name or index!r} failed on ranks "
                f"{[r for r, e in enumerate(errors) if e]}; rank {first}: {errors[first]}"
            )
        self.group.barrier()  # every peer has mapped every region: names can go
        core.finish_rendezvous()
        buf = SymmetricBuffer(core, name or f"buffer{index}")
        self._buffers.append(buf)
        return buf

    def destroy(self) -> None:
        """Destroy every buffer this communicator created. Idempotent; not collective."""
        for buf in reversed(self._buffers):
            buf.destroy()
        self._buffers.clear()

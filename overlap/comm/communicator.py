"""Communicator and symmetric buffers: the Python face of the userbuffers runtime.

A :class:`Communicator` binds a TP group (given as a :class:`~overlap.comm.Bootstrap`) to a
transport; :meth:`Communicator.create_buffer` runs the collective rendezvous that gives every
rank a mapping of every peer's region. Collectives run on those buffers.

NOTE [stream contract]: on the cuda transport every op waits for the work already issued on
the current stream of its input's device, is enqueued there (its internal side streams fork
from and join back to that stream), and returns without synchronising the host: results are
ready for work issued later on the same stream. A wait that passes its deadline is released by
the runtime's watchdog and raised as :class:`~overlap.errors.CommTimeoutError` by the next op
or :meth:`SymmetricBuffer.synchronize`. The host transport runs ops synchronously and raises
at once.

NOTE [failed transport] (``csrc/comm/transport.h``): once an op has started exchanging with the
peers, a timeout, a collective mismatch or any other error in it leaves this rank's op sequence
out of step with its peers'. The communicator is then failed (:attr:`Communicator.failed`):
every later op on any of its buffers raises at once, with the first fault's class and message
(:attr:`Communicator.failure`), instead of waiting out another deadline or pairing with a
peer's other op. Destroy the communicator and its buffers and create new ones. A call rejected
before it communicates (a bad argument) fails nothing. :meth:`Communicator.abort` fails it on
purpose and ends every wait at once (NOTE [abort] in ``csrc/comm/fault.h``), and Ctrl-C during
a wait does the same, raising ``KeyboardInterrupt`` (NOTE [interrupting waits]); the peers of a
failed communicator fail too, through their flags (NOTE [poisoned flags]).

One file: a :class:`SymmetricBuffer` only comes out of its :class:`Communicator`'s rendezvous,
and both share the argument coercions and the registry of live buffers; split, the two modules
would import each other.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import operator
import secrets
import warnings
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from overlap import errors
from overlap._native import native
from overlap.comm._setup import Deadline, DeadlineGroup, run_collective
from overlap.comm.bootstrap import Bootstrap, check_single_host
from overlap.env import check_timeout_s, settings
from overlap.errors import BootstrapError, ConfigError, InvalidArgumentError, OverlapError

if TYPE_CHECKING:
    import torch

__all__ = [
    "Communicator",
    "SymmetricBuffer",
    "TransportKind",
    "buffer_of",
    "live_buffers",
    "tensor_extent",
]


class TransportKind(enum.Enum):
    """How buffers are shared between the ranks of a group."""

    HOST = "host"  # POSIX shared memory; CPU tensors (what CI runs)
    CUDA = "cuda"  # CUDA IPC; CUDA tensors (the product)


def _stream_of(t: torch.Tensor) -> int:
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


# NOTE [buffer generation]: every tensor read out of a symmetric buffer (a gathered input, a
# buffer manager's view) is only valid until the buffer's next op overwrites it; the buffers
# are shared by every layer of a model (docs/design.md §3, invariant 2). One model serves the
# ops and the buffer managers alike: a buffer knows its generation (the runtime's op epoch
# plus the local writes announced to it) and its address ranges, and every live buffer is
# registered here, so a reader records the generation it read at and checks it before use
# (SymmetricBuffer.check_current), and the alias guard (overlap.buffers.saveable) finds any
# tensor that lies in any live buffer (buffer_of). A CUDA-graph replay re-runs the captured ops
# with fresh epochs: the buffers it touches hold again what they held at the end of the
# capture, so a view read then is current right after a replay (SymmetricBuffer.note_replay),
# while generations still only grow (no value comes back to make an old view look current).
# Verdict: one registry, in the lowest layer that owns buffers; nothing above keeps its own.
_LIVE: weakref.WeakSet[SymmetricBuffer] = weakref.WeakSet()


def live_buffers() -> list[SymmetricBuffer]:
    """The symmetric buffers of this process not destroyed yet (NOTE [buffer generation])."""
    return [b for b in list(_LIVE) if not b.destroyed]


def buffer_of(t: torch.Tensor) -> SymmetricBuffer | None:
    """The live symmetric buffer whose memory ``t`` shares (any rank's region), or None."""
    for buf in live_buffers():
        if buf.overlaps(t):
            return buf
    return None


def tensor_extent(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, last byte + 1)`` spanned by ``t``'s elements."""
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    span = 1 + sum(
        (size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)
    )
    return (t.data_ptr(), t.data_ptr() + span * t.element_size())


def _as_int(value: object, what: str, error: type[OverlapError] = InvalidArgumentError) -> int:
    """``value`` as an int (bools and floats refused: no silent truncation), else ``error``."""
    if isinstance(value, bool):
        raise error(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise error(f"{what} must be an int, got {type(value).__name__} {value!r:.40}") from None


def _as_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be True or False, got {value!r:.40}")
    return value


def _as_tensor(value: object, what: str) -> torch.Tensor:
    import torch

    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _as_dtype(value: object) -> torch.dtype:
    """A torch dtype, or its name ("bfloat16", "torch.bfloat16")."""
    import torch

    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    if isinstance(value, torch.dtype):
        return value
    raise InvalidArgumentError(f"dtype must be a torch.dtype or its name, got {value!r:.40}")


def _as_shape(value: object) -> tuple[int, ...]:
    """A shape: an int, or a sequence of non-negative ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        dims: Iterable[object] = (value,)
    elif isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        dims = value
    else:
        raise InvalidArgumentError(f"view shape must be a sequence of ints, got {value!r:.40}")
    shape = tuple(_as_int(d, "a view shape's dimension") for d in dims)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"view shape {shape} has a negative dimension")
    return shape


class SymmetricBuffer:
    """One region per rank of a group, each rank mapping all of them. Create it with
    :meth:`Communicator.create_buffer`; free it with :meth:`destroy` (idempotent).

    Every op is COLLECTIVE: all ranks of the group call the same ops in the same order.
    """

    def __init__(self, core: Any, name: str, transport: Any) -> None:
        self._core = core
        self._transport = transport
        self.name = name
        # NOTE [buffer windows]: the buffer whose memory, epochs and generation this one
        # shares (itself unless a window).
        self._root: SymmetricBuffer = self
        self._local_writes = 0  # NOTE [buffer generation]
        self._ranges: tuple[tuple[int, int], ...] | None = None
        # (generation at the end of a graph's capture, generation right after its latest
        # replay): a view read at the first is current at the second (NOTE [buffer generation]).
        self._replayed: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the data region of each rank."""
        return int(self._core.nbytes)

    @property
    def allocated_bytes(self) -> int:
        """Device memory (host transport: shared memory) this rank holds for its data region:
        :attr:`nbytes`, or more where the transport rounds allocations up (cuda: to a whole
        number of 2 MiB, NOTE [allocation granularity] in ``csrc/comm/cuda/cuda_memory.h``);
        0 for a window, whose memory is its root's."""
        return int(self._core.allocated_bytes)

    @property
    def is_window(self) -> bool:
        """Whether this is a window of another buffer (:meth:`window`)."""
        return self._root is not self

    @property
    def root(self) -> SymmetricBuffer:
        """The buffer that owns this one's memory: itself, or a window's root."""
        return self._root

    @property
    def window_offset(self) -> int:
        """Byte offset of this buffer's data in its root's regions (0 for a root)."""
        return int(self._core.window_offset)

    def window(self, offset: int, nbytes: int, name: str = "") -> SymmetricBuffer:
        """A buffer over bytes ``[offset, offset + nbytes)`` of this one's regions, sharing
        its memory, op sequence and generation (NOTE [buffer windows] in
        ``csrc/comm/symmetric_buffer.h``). Ops on a window see a buffer of ``nbytes``; every op
        on the root or on any of its windows makes every view of any of them stale (one
        generation), so sharing bytes between windows can never hand out overwritten data.
        A window owns no memory (:attr:`allocated_bytes` 0, :meth:`destroy` does nothing);
        destroying its root frees it. Not collective (nothing is exchanged), but every rank
        must make the same windows for the ops it runs on them.

        Raises:
            InvalidArgumentError: ``offset`` not a multiple of ``native().comm.window_align``
                (256), or a range outside this buffer.
            StateError: this buffer is destroyed.
        """
        offset = _as_int(offset, "window offset")
        nbytes = _as_int(nbytes, "window nbytes")
        if offset < 0 or nbytes <= 0:
            raise InvalidArgumentError(
                f"window [{offset}, {offset + nbytes}) must be a non-empty range at a "
                "non-negative offset"
            )
        core = self._core.window(self._core, offset, nbytes)
        label = name or f"{self.name}[{offset}:{offset + nbytes}]"
        win = SymmetricBuffer(core, label, self._transport)
        win._root = self._root
        return win

    @property
    def rank(self) -> int:
        return int(self._core.rank)

    @property
    def size(self) -> int:
        return int(self._core.size)

    @property
    def destroyed(self) -> bool:
        return bool(self._core.destroyed)

    @property
    def epoch(self) -> int:
        """The last epoch taken by an op on this buffer (0 before the first op). It grows with
        every op (by one, or by more for the ops that take several: AG+GEMM, GEMM+RS, bulk
        reduce-scatter, CUDA-graph replays) and never repeats, so it names the buffer's op
        generation: a view read at one epoch is stale once the epoch has moved on."""
        return int(self._core.epoch)

    # ---- what lives in the buffer (NOTE [buffer generation]) -------------------------------

    @property
    def generation(self) -> int:
        """Changes whenever the buffer's contents may have changed: every op (the
        :attr:`epoch`) and every local write announced with :meth:`note_local_write`. A tensor
        read out of the buffer at one generation is valid while the generation is the same."""
        return self.epoch + self._root._local_writes

    def note_local_write(self) -> None:
        """A write into this rank's region outside an op (a buffer manager staging its shard):
        views of the buffer made before it are stale (of its root and every window too)."""
        self._root._local_writes += 1

    def check_current(self, generation: int, what: str) -> None:
        """Raise :class:`~overlap.errors.StateError` unless the buffer is live, and
        :class:`~overlap.errors.StaleBufferError` unless it is still at ``generation``
        (``what`` names the reader in the message)."""
        _as_int(generation, "generation")
        if self.destroyed:
            raise errors.StateError(f"{what}: buffer {self.name!r} was destroyed")
        now = self.generation
        if generation != now and self._root._replayed != (generation, now):
            raise errors.StaleBufferError(
                f"{what}: buffer {self.name!r} was overwritten since (generation {generation} "
                f"-> {now}: another op or write on the buffer, e.g. by another op "
                "object sharing it). A view of a buffer is valid until its next op: copy it "
                "before then, or save the local shard and re-gather"
            )

    @property
    def replayed_from(self) -> int | None:
        """The capture-end generation of the CUDA graph whose replay is the buffer's latest op,
        or None when an op or a write came after the latest replay (or there was none)."""
        replayed = self._root._replayed
        if replayed is not None and replayed[1] == self.generation:
            return replayed[0]
        return None

    def note_replay(self, captured: int) -> None:
        """A CUDA graph whose capture left this buffer at generation ``captured`` was replayed
        (overlap.CudaGraph): the buffer holds what it held then, refreshed, so views read at
        ``captured`` are current until the next op; every other view is stale."""
        self._root._replayed = (captured, self.generation)

    @property
    def address_ranges(self) -> tuple[tuple[int, int], ...]:
        """``[start, end)`` of every rank's data region as mapped in this process (rank
        order): the memory a tensor must not share to be safe to keep."""
        if self._ranges is None:
            import torch

            starts = [
                self.view(torch.uint8, (self.nbytes,), peer=p).data_ptr() for p in range(self.size)
            ]
            self._ranges = tuple((a, a + self.nbytes) for a in starts)
        return self._ranges

    def overlaps(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s elements lie (partly) in one of this buffer's regions."""
        lo, hi = tensor_extent(_as_tensor(t, "overlaps()'s argument"))
        return lo < hi and any(lo < end and start < hi for start, end in self.address_ranges)

    @property
    def timeout_s(self) -> float:
        """Deadline in seconds of every wait of this buffer's ops (the communicator's
        ``timeout_s`` at creation). A wait past it raises
        :class:`~overlap.errors.CommTimeoutError` and fails the communicator. A window's is
        its root's (setting either sets both: NOTE [buffer windows]).

        Raises:
            ConfigError: on assignment of a value outside ``(0, MAX_TIMEOUT_S]``
                (:data:`overlap.env.MAX_TIMEOUT_S`, 1e6 s; NaN and infinity included).
        """
        return float(self._core.timeout_s)

    @timeout_s.setter
    def timeout_s(self, seconds: float) -> None:
        self._core.timeout_s = check_timeout_s(seconds)

    @property
    def put_split(self) -> int:
        """Copies (copy-engine streams on cuda) that carry one rank's shard to one peer in an
        all-gather, 1..8. More copies in flight use NVLink better; a tuning knob, the result
        is the same."""
        return int(self._core.put_split)

    @put_split.setter
    def put_split(self, split: int) -> None:
        self._core.put_split = _as_int(split, "put_split", ConfigError)

    @property
    def pull_gather(self) -> bool:
        """All-gather by pulls (each rank's copy engines read peers' shards) instead of
        pushes (each rank writes its shard into the peers' regions). Same result."""
        return bool(self._core.pull_gather)

    @pull_gather.setter
    def pull_gather(self, pull: bool) -> None:
        self._core.pull_gather = _as_bool(pull, "pull_gather")

    @property
    def serial_puts(self) -> bool:
        """All-gather copies to (or from) the peers one after another on one set of
        ``put_split`` lanes, in ring order (True, the default), instead of all at once on a
        set of lanes per peer. Fewer lanes, less per-op latency, the same bandwidth; same
        result."""
        return bool(self._core.serial_puts)

    @serial_puts.setter
    def serial_puts(self, serial: bool) -> None:
        self._core.serial_puts = _as_bool(serial, "serial_puts")

    @property
    def sm_share(self) -> tuple[int, int]:
        """``(percent, blocks)``: the share of every all-gather put moved by an SM copy kernel
        of ``blocks`` blocks instead of the copy engines. ``(0, 0)``, the default, keeps the
        all-gather off the SMs (what overlap with a GEMM wants); on 4xH200 the copy engines
        alone match NCCL's bandwidth from about 64 MB (below that the flags' latency shows),
        and SM copies have not been faster there."""
        return int(self._core.sm_percent), int(self._core.sm_blocks)

    @sm_share.setter
    def sm_share(self, share: tuple[int, int]) -> None:
        if not isinstance(share, (tuple, list)) or len(share) != 2:
            raise ConfigError(f"sm_share must be a (percent, blocks) pair, got {share!r:.40}")
        percent, blocks = share
        self._core.set_sm_share(
            _as_int(percent, "sm_share's percent", ConfigError),
            _as_int(blocks, "sm_share's blocks", ConfigError),
        )

    def view(
        self,
        dtype: torch.dtype,
        shape: tuple[int, ...] | list[int],
        *,
        offset: int = 0,
        peer: int | None = None,
    ) -> torch.Tensor:
        """A tensor aliasing bytes of a rank's data region, without a copy (DLPack).

        Args:
            dtype: element type of the view (FP8 dtypes included), or its name.
            shape: shape of the view; ``prod(shape) * dtype.itemsize`` bytes starting at
                ``offset`` must lie inside the region, and ``offset`` must be a multiple of
                the dtype's size.
            offset: byte offset into the region.
            peer: whose region (default: this rank's). A peer's region is mapped memory of
                another GPU (or process): reading it is a remote read.

        The view stays valid memory even after :meth:`destroy` (it keeps the region alive),
        but its CONTENTS are only defined until the next op on this buffer: never save it
        for backward (docs/design.md §3, invariant 2); copy it instead.
        """
        import torch

        dtype = _as_dtype(dtype)
        shape = _as_shape(shape)
        offset = _as_int(offset, "view offset")
        itemsize = dtype.itemsize
        if offset < 0 or offset % itemsize:
            raise InvalidArgumentError(
                f"view offset {offset} must be a non-negative multiple of {dtype}'s size "
                f"({itemsize} bytes)"
            )
        nbytes = itemsize
        for d in shape:
            nbytes *= d
        if offset + nbytes > self.nbytes:  # before the core, whose sizes are 64-bit
            raise InvalidArgumentError(
                f"view: bytes [{offset}, {offset + nbytes}) are outside the buffer's "
                f"{self.nbytes} bytes"
            )
        peer = self.rank if peer is None else _as_int(peer, "view peer")
        if not 0 <= peer < self.size:
            raise InvalidArgumentError(f"view: peer {peer} is outside a group of size {self.size}")
        capsule = self._core.view(peer, offset, nbytes)
        return torch.from_dlpack(capsule).view(dtype).view(shape)

    def synchronize(self) -> None:
        """Wait on the host for the current stream, then raise any asynchronous failure
        (a wait that timed out) of this buffer's communicator, and its failure once
        :attr:`Communicator.failed`. The host transport runs ops synchronously: there it only
        raises the failure."""
        self._transport.synchronize(stream=self._current_stream())

    def _current_stream(self) -> int:
        device = self._transport.device
        if device < 0:
            return 0
        import torch

        return torch.cuda.current_stream(device).cuda_stream

    def all_gather(self, input: torch.Tensor, output: torch.Tensor | None = None) -> torch.Tensor:
        """Gather ``input`` of every rank.

        Args:
            input: contiguous tensor of any dtype and shape ``[m, ...]``, the same on all ranks,
                on the transport's device; ``size * input.nbytes`` must fit in the buffer.
            output: optional contiguous tensor of shape ``[size * m, ...]`` and ``input``'s
                dtype to receive the result (allocated when omitted).

        Returns:
            ``output``: rank ``k``'s input in rows ``[k * m, (k + 1) * m)``.

        On cuda the bytes move by copy engine; the ranks meet at the start and the end in two
        one-block handshake kernels (NOTE [gather handshakes] in ``csrc/comm/collectives.cpp``).
        Beside a GEMM on another stream, which can hold every SM until it ends, use the bulk
        ops instead (:mod:`overlap.ops.bulk`), which need no SM while the GEMM runs.
        """
        if _as_tensor(input, "all_gather input").dim() == 0:
            raise InvalidArgumentError("all_gather input must be a tensor of at least 1 dim")
        output = self._output_like(input, output, input.shape[0] * self.size)
        self._core.all_gather(input, stream=_stream_of(input))
        self._core.copy_out(output, 0, stream=_stream_of(output))
        return output

    def all_gather_into(self, parts: Sequence[tuple[torch.Tensor, int]]) -> None:
        """Gather several tensors of every rank in ONE op, into the buffer itself.

        Args:
            parts: ``(shard, offset)`` pairs: rank ``k``'s ``shard`` (contiguous, any dtype,
                same nbytes on every rank) lands at byte ``offset + k * shard.nbytes`` of every
                rank's region. Parts must not overlap. Typical use: a quantized shard's data
                and its scale_inv, which must travel together (docs/design.md §3, invariant 1).

        Read the result with :meth:`view`; it is valid until the next op on this buffer. The
        same op as :meth:`all_gather` (two handshake kernels on cuda).
        """
        if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or not parts:
            raise InvalidArgumentError(
                "all_gather_into needs a non-empty list of (tensor, offset) parts, got "
                f"{parts!r:.60}"
            )
        checked = []
        for i, part in enumerate(parts):
            if not isinstance(part, (tuple, list)) or len(part) != 2:
                raise InvalidArgumentError(
                    f"all_gather_into: part {i} must be a (tensor, offset) pair, got {part!r:.60}"
                )
            t = _as_tensor(part[0], f"all_gather_into: part {i}'s shard")
            off = _as_int(part[1], f"all_gather_into: part {i}'s offset")
            if off < 0:
                raise InvalidArgumentError(f"all_gather_into: part {i}'s offset {off} is negative")
            checked.append((t, off))
        self._core.all_gather_parts(checked, stream=_stream_of(checked[0][0]))

    def reduce_scatter(
        self, input: torch.Tensor, output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sum ``input`` over ranks and keep this rank's share, with fp32 accumulation.

        Args:
            input: contiguous float32/bfloat16/float16 tensor of shape ``[size * m, ...]``
                (rows ``[k * m, (k + 1) * m)`` are destined to rank ``k``).
            output: optional contiguous tensor ``[m, ...]`` of ``input``'s dtype.

        ``input`` may be a :meth:`view` of this buffer starting at offset 0 (the partials
        already in place, where a GEMM writes them): the op then skips its data round. Every
        rank must then pass such a view, and write it only when no peer reads this buffer any
        more, e.g. after :meth:`barrier` (peers read the region until they enter the next op).
        Any other input, and the output, must lie outside every region of the buffer (an
        :class:`~overlap.errors.InvalidArgumentError` otherwise). Every rank must pass the same
        dtype and shapes: a mismatch raises :class:`~overlap.errors.StateError` on the host
        transport (best effort on cuda) and fails the communicator.

        Returns:
            ``output`` = sum over ranks of their rows for this rank. Every rank sums in rank
            order, so the result does not depend on which rank computed it.
        """
        if _as_tensor(input, "reduce_scatter input").dim() == 0 or input.shape[0] % self.size:
            raise InvalidArgumentError(
                f"reduce_scatter input of shape {tuple(input.shape)} must have a first "
                f"dimension divisible by the group size {self.size}"
            )
        output = self._output_like(input, output, input.shape[0] // self.size)
        self._core.reduce_scatter(input, output, stream=_stream_of(input))
        return output

    def barrier(self) -> None:
        """Every rank of the group has entered the barrier before work issued after it runs
        (on cuda: stream-ordered on the current stream; the host does not block)."""
        self._core.barrier(stream=self._current_stream())

    def destroy(self) -> None:
        """Unmap the peers and free the local region. Idempotent; not collective. A window's
        does nothing (its root owns the memory)."""
        self._core.destroy()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None and not core.is_window and not core.destroyed:
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

        shape = (rows, *input.shape[1:])
        if output is None:
            return torch.empty(shape, dtype=input.dtype, device=input.device)
        _as_tensor(output, "output")
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
        timeout_s: deadline of every wait in seconds (default ``OVERLAP_TIMEOUT_S``, 60 s), in
            ``(0, MAX_TIMEOUT_S]`` (:data:`overlap.env.MAX_TIMEOUT_S`, 1e6 s; finite: there is
            no unbounded deadline); also the deadline of the collective set-up (this
            constructor, :meth:`create_buffer`; NOTE [set-up deadlines] in ``_setup.py``).
        device: the CUDA device of this rank (cuda transport only; default: torch's current
            device). Tensors given to ops must live on it.

    Construction is COLLECTIVE over ``group``.

    Raises:
        ConfigError: an unknown transport, a bad ``group``, ``timeout_s`` or ``device``; raised
            before anything collective happens.
        CommTimeoutError: a peer did not take part within ``timeout_s``.
        BootstrapError: the ranks span several hosts, or the bootstrap failed (a peer died).
    """

    def __init__(
        self,
        group: Bootstrap,
        transport: TransportKind | str = TransportKind.HOST,
        *,
        timeout_s: float | None = None,
        device: int | None = None,
    ) -> None:
        if not isinstance(group, Bootstrap):
            raise ConfigError(
                "group must be an overlap.comm.Bootstrap (TorchBootstrap(process_group), "
                f"MPIBootstrap(mpi_comm), or a subclass), got {type(group).__name__}"
            )
        try:
            self.transport = TransportKind(transport)
        except (ValueError, TypeError):
            raise ConfigError(
                f"unknown transport {transport!r}; use one of {[t.value for t in TransportKind]}"
            ) from None
        self.timeout_s = settings().timeout_s if timeout_s is None else check_timeout_s(timeout_s)
        self.device = self._resolve_device(device)
        self.group = group
        deadline = Deadline(self.timeout_s, "creating a communicator")
        check_single_host(
            DeadlineGroup(group, deadline, "the exchange of host ids"), "a communicator's group"
        )
        # NOTE [shm names]: rank 0 draws the job's tag and its naming key.
        drawn = secrets.token_hex(8) + " " + secrets.token_hex(16) if group.rank == 0 else ""
        got = run_collective(
            lambda: group.allgather_bytes(drawn.encode()), group, deadline, "the exchange of names"
        )
        self._tag, key = got[0].decode().split(" ")
        self._key = bytes.fromhex(key)
        self._counter = itertools.count()
        if self.transport is TransportKind.CUDA:
            self._core_transport = native().comm.make_cuda_transport(self.device)
        else:
            self._core_transport = native().comm.make_host_transport()
        self._buffers: list[SymmetricBuffer] = []

    def _resolve_device(self, device: int | None) -> int:
        """The CUDA ordinal of this rank (cuda), or -1 (host); validated before anything
        collective happens."""
        if self.transport is TransportKind.HOST:
            if device is not None:
                raise ConfigError("device= is only meaningful for the cuda transport")
            return -1
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise ConfigError(f"device must be a CUDA device ordinal (int), got {device!r}")
        from overlap._native import require_cuda

        require_cuda("the cuda transport")
        import torch

        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device is None else int(device)
        if not 0 <= index < count:
            raise ConfigError(f"device {device} does not exist: {count} CUDA devices visible")
        return index

    @property
    def failed(self) -> bool:
        """Whether this communicator failed (NOTE [failed transport] in this module's
        docstring): after a timeout, a collective mismatch, an :meth:`abort` or another error
        in the middle of an op, or once a peer's communicator failed, every op on its buffers
        raises at once, naming :attr:`failure`, until the communicator is destroyed and a new
        one created. On cuda a timed-out wait counts once the watchdog has found it."""
        return bool(self._core_transport.failed)

    @property
    def failure(self) -> str | None:
        """The message of the fault that failed this communicator (the first one), or
        ``None`` while it works."""
        return str(self._core_transport.failure) if self.failed else None

    def abort(self) -> None:
        """Fail this communicator now and end every wait of it on this rank, like
        ``ncclCommAbort`` (NOTE [abort] in ``csrc/comm/fault.h``).

        Thread-safe and signal-safe: any thread may call it, a signal handler included. A wait
        in progress, on the host or the GPU, ends within 100 ms: an op blocked on the host
        transport raises :class:`~overlap.errors.CommAbortedError`, the cuda watchdog releases
        the GPU's waits and :meth:`synchronize` raises. The communicator stays failed (every
        later op raises at once); its peers fail through their flags (NOTE [poisoned flags]),
        or at their deadline. :meth:`destroy` it (and its buffers) afterwards; that waits
        for the ops it ended to return. Not collective; idempotent.
        """
        self._core_transport.abort()
        self._core_transport.failed  # noqa: B018 -- records the fault and tells the peers now

    def synchronize(self) -> None:
        """Wait for this rank's current stream and raise any asynchronous failure (and the
        communicator's failure, once :attr:`failed`). Ends early, raising, on :meth:`abort` or
        when a signal handler raises (Ctrl-C)."""
        stream = 0
        if self.device >= 0:
            import torch

            stream = torch.cuda.current_stream(self.device).cuda_stream
        self._core_transport.synchronize(stream=stream)

    def _fail_setup(self, kind: str, message: str) -> None:
        """NOTE [set-up deadlines]: a set-up exchange left the group out of step."""
        self._core_transport.fail(kind, message)

    def create_buffer(self, nbytes: int, name: str = "") -> SymmetricBuffer:
        """COLLECTIVE: a symmetric buffer with ``nbytes`` of data per rank.

        Every rank takes part in the rendezvous even when its own request is refused, and
        every rank raises when any rank's is: a size that one rank rejects never leaves its
        peers waiting. A peer that dies or hangs makes every live rank raise within the
        communicator's ``timeout_s`` (NOTE [set-up deadlines] in ``_setup.py``). Nothing stays
        allocated after an error, and nothing in ``/dev/shm``.

        Raises:
            InvalidArgumentError: ``nbytes`` is not an int in ``[1, 2**48]`` on some rank, or
                ``name`` is not a str.
            SystemResourceError: some rank could not reserve the memory (the host transport
                reserves its shared memory here, so a /dev/shm too small for the buffer is
                reported now, never by a SIGBUS in a later op).
            BootstrapError: ranks asked for different sizes, a rank could not map a peer (or
                refused a segment its peer did not create: NOTE [segment cookies]), or the
                bootstrap failed (a peer died: the communicator is then failed).
            CommTimeoutError: a peer did not take part within ``timeout_s`` (the communicator
                is then failed).
            OverlapError: generally, the error class of the rank that failed (of this rank,
                where its own request failed), e.g. the original fault's class where the
                communicator has :attr:`failed`.
        """
        index = next(self._counter)
        label = name or index
        deadline = Deadline(self.timeout_s, f"creating symmetric buffer {label!r}")
        tags = self._region_tags(index)
        core = None
        try:
            own: Exception | None = None
            try:
                _check_nbytes(nbytes)
                if not isinstance(name, str):
                    raise InvalidArgumentError(f"name must be a str, got {type(name).__name__}")
                self._core_transport.raise_if_failed()
                core = native().comm.SymmetricBuffer(
                    transport=self._core_transport,
                    rank=self.group.rank,
                    size=self.group.size,
                    nbytes=nbytes,
                    tag=tags[self.group.rank],
                    timeout_s=self.timeout_s,
                )
                status = b"ok " + core.local_handle()
            except Exception as exc:  # exchanged first: the peers must not wait for this rank
                own = exc
                status = f"error {type(exc).__name__} {exc}".encode()
            statuses = self._exchange(status, deadline, "the exchange of buffer handles")
            if any(not s.startswith(b"ok ") for s in statuses):
                _raise_rendezvous_error(label, statuses, self.group.rank, own)
            assert core is not None
            handles = [s[len(b"ok ") :] for s in statuses]
            error = ""
            try:
                core.connect(handles)
            except Exception as exc:
                error = str(exc)
            errors_by_rank = [
                e.decode()
                for e in self._exchange(error.encode(), deadline, "the exchange of mapping errors")
            ]
            if any(errors_by_rank):
                first = next(r for r, e in enumerate(errors_by_rank) if e)
                raise BootstrapError(
                    f"creating symmetric buffer {label!r} failed on ranks "
                    f"{[r for r, e in enumerate(errors_by_rank) if e]}; rank {first}: "
                    f"{errors_by_rank[first]}"
                )
            # Every peer has mapped every region: names can go.
            self._exchange(b"", deadline, "the barrier after mapping")
            core.finish_rendezvous()
        except BaseException:
            # NOTE [set-up deadlines]: nothing stays behind, a dead rank's name included.
            if core is not None:
                core.destroy()
            for tag in tags:
                native().comm.unlink_region_name(tag)
            raise
        buf = SymmetricBuffer(core, name or f"buffer{index}", self._core_transport)
        self._buffers.append(buf)
        _LIVE.add(buf)
        return buf

    # NOTE [shm names]: a region's shared-memory name is "/overlap-<job>-<secret>-<rank>".
    # <job> is 64 random bits that rank 0 draws per communicator (it tells one job's names
    # apart, for people and tests); <secret> is 96 bits of a keyed hash (BLAKE2b) of the
    # buffer's index, under a 128-bit key that rank 0 draws and the bootstrap carries to the
    # peers, never the file system. Another local user who watches /dev/shm sees a name only
    # once it exists and cannot compute the next buffer's from it, so cannot take it first.
    # Every rank still creates its segment exclusively (O_EXCL, mode 0600: a name that exists
    # is an error, never reused) and refuses a peer's segment whose cookie is not the one the
    # peer sent through the bootstrap (NOTE [segment cookies] in csrc/comm/transport.h). All
    # ranks know all names of a buffer before it is created, so the live ranks of a failed
    # rendezvous remove them all (NOTE [set-up deadlines] in _setup.py). Verdict: unguessable
    # names from a shared key, exclusive creation, cookies.
    def _region_tags(self, index: int) -> list[str]:
        """NOTE [shm names]: every rank's region tag of buffer ``index``."""
        secret = hashlib.blake2b(index.to_bytes(8, "little"), key=self._key, digest_size=12)
        return [f"{self._tag}-{secret.hexdigest()}-{k}" for k in range(self.group.size)]

    def _exchange(self, data: bytes, deadline: Deadline, step: str) -> list[bytes]:
        """The group's allgather of ``data`` within ``deadline`` (NOTE [set-up deadlines])."""
        return run_collective(
            lambda: self.group.allgather_bytes(data),
            self.group,
            deadline,
            step,
            on_failure=self._fail_setup,
        )

    def destroy(self) -> None:
        """Destroy every buffer this communicator created. Idempotent; not collective. A
        :attr:`failed` communicator stays failed: create a new one to go on. An op in progress
        on another thread is waited for (NOTE [destroy while in use] in
        ``csrc/comm/symmetric_buffer.h``: it ends by its deadline, or at once after
        :meth:`abort`); from inside an op's signal handler on the same thread it raises
        :class:`~overlap.errors.StateError` instead."""
        for buf in reversed(self._buffers):
            buf.destroy()
        self._buffers.clear()


def _check_nbytes(nbytes: object) -> None:
    """``nbytes`` is a buffer size the core accepts (NOTE [size bounds] in
    ``csrc/comm/symmetric_buffer.h``), checked here because a Python int may not even fit the
    core's 64-bit sizes."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise InvalidArgumentError(f"nbytes must be a positive int, got {nbytes!r}")
    limit = int(native().comm.max_buffer_bytes)
    if nbytes > limit:
        raise InvalidArgumentError(
            f"nbytes {nbytes} exceeds the largest symmetric buffer, {limit} bytes (2**48)"
        )


def _raise_rendezvous_error(
    label: object, statuses: list[bytes], rank: int, own: Exception | None
) -> NoReturn:
    """Raise, on every rank, the failure of a rendezvous whose first exchange carried an
    ``error <class> <message>`` status from some rank: this rank's own error if it failed
    itself, else the first failing rank's, as the same class of :mod:`overlap.errors`."""
    failed = [r for r, s in enumerate(statuses) if not s.startswith(b"ok ")]
    if own is not None and not isinstance(own, OverlapError):
        raise own  # not ours to translate (e.g. a bug): keep its type and traceback
    shown = rank if own is not None else failed[0]
    parts = statuses[shown].decode(errors="replace").split(" ", 2)  # error <class> <message>
    class_name, message = parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""
    cls = type(own) if own is not None else getattr(errors, class_name, OverlapError)
    if not (isinstance(cls, type) and issubclass(cls, OverlapError)):
        cls = OverlapError
    raise cls(
        f"creating symmetric buffer {label!r} failed on ranks {failed}; rank {shown}: {message}"
    ) from own

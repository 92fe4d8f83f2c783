"""Soak: a long randomized sequence of ops on one TP group, with random delays, stalls past
the deadline and a killed rank; every result is checked, or every error is typed.

Usage (launched by launcher.run_local_ranks: plain processes, so that a rank may die):
    soak_worker.py <host|cuda> <ops> <seed> <stalls> <kill: 0|1> [timeout_s]

Every rank draws the same decisions from one seeded generator (the op, its buffer, sizes,
dtypes and knobs, where the stalls and the kill fall) and its own delays from another. Inputs
are a function of (seed, op index, rank), so each rank computes every reference locally and no
check needs the group. Ops: all_gather (any dtype, every all-gather knob), all_gather_into,
reduce_scatter (out of place and partials in place), barrier, AG+GEMM (pieces, pulls, push
order), GEMM+RS (pipelined with pieces, ring with pushes or pulls), the bulk all-gather beside
a GEMM (sharing the AG+GEMM's buffer, as initialize_ub does) and the bulk reduce-scatter
beside a GEMM (pieces), over several buffers.

A stall: one rank sleeps past the deadline before an op. Its peers must raise a typed error
in that op (a timeout, or the poisoned flags of a peer that timed out first: NOTE [poisoned
flags]), and the stalled rank in that op or the next (an op whose waits were all satisfied
before its peers gave up may complete). Every rank then destroys its communicator, the ranks
agree through the bootstrap where to go on, and a new communicator continues the sequence.
An error anywhere else fails the soak. A kill (the last rank, SIGKILL, before an op or from a
timer while it waits inside one): the survivors must raise typed errors, in the op and in the
recovery's exchange (NOTE [set-up deadlines]), within their deadlines, and leave nothing in
/dev/shm. Each rank prints a summary line (ops, checked results, typed errors, sessions).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import zlib
from typing import Any

import _worker
import torch

from overlap.comm import Bootstrap, Communicator, SymmetricBuffer
from overlap.comm._setup import Deadline, run_collective
from overlap.errors import (
    BootstrapError,
    CommAbortedError,
    CommTimeoutError,
    CudaError,
    OverlapError,
    StateError,
)
from overlap.ops import (
    AllGatherBesideGemm,
    AllGatherGemm,
    GemmReduceScatter,
    ReduceScatterBesideGemm,
)

TYPED = (CommTimeoutError, CommAbortedError, StateError, BootstrapError, CudaError)
OPS = [
    "all_gather",
    "all_gather_into",
    "reduce_scatter",
    "reduce_scatter_in_place",
    "barrier",
    "ag_gemm",
    "gemm_rs_pipelined",
    "gemm_rs_ring",
    "bulk_ag",
    "bulk_rs",
]
GATHER_DTYPES = [torch.float32, torch.bfloat16, torch.uint8, torch.int64, torch.bool]
RS_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MAX_M, K, N = 4, 16, 16  # rows per rank, features of the GEMM ops


class Ended(Exception):
    """The group lost a rank: this survivor stops after its checks."""


class Session:
    """One communicator and everything built on it (collective)."""

    def __init__(self, world: Bootstrap, transport: str, timeout_s: float) -> None:
        n = world.size
        self.comm = Communicator(world, transport, timeout_s=timeout_s)
        self.buffers = [self.comm.create_buffer(b, f"soak{b}") for b in (4096, 1 << 16)]
        self.ag = AllGatherGemm(self.comm, n * MAX_M, K, torch.float32)
        # Sharing the AG+GEMM's buffer, as initialize_ub's ops of one kind do.
        self.bag = AllGatherBesideGemm(
            self.comm, n * MAX_M, K, torch.float32, buffer=self.ag.buffer
        )
        self.rs = GemmReduceScatter(self.comm, n * MAX_M, N, torch.float32)
        self.ring = GemmReduceScatter(self.comm, n * MAX_M, N, torch.float32, method="ring")
        self.brs = ReduceScatterBesideGemm(self.comm, n * MAX_M, N, torch.float32)

    def tags(self) -> str:
        return self.comm._tag

    def destroy(self) -> None:
        for op in (self.bag, self.ag, self.rs, self.ring, self.brs):
            op.destroy()
        self.comm.destroy()


class Soak:
    def __init__(self, argv: list[str]) -> None:
        self.transport = argv[1]
        self.ops = int(argv[2])
        self.seed = int(argv[3])
        self.stalls = int(argv[4])
        self.kill = argv[5] == "1"
        self.timeout_s = float(argv[6]) if len(argv) > 6 else 1.0
        self.world = _worker.local_setup()
        self.rank, self.n = self.world.rank, self.world.size
        self.cuda = self.transport == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"
        plan = random.Random(self.seed)
        # The stalls in the first 60% of the ops, the kill after them; none in the last ops
        # (every rank must reach the op after a stall to see its peers' failure).
        quiet = max(10, self.ops // 20)
        self.stall_at = {
            i: plan.randrange(self.n)
            for i in sorted(plan.sample(range(5, self.ops * 6 // 10), self.stalls))
        }
        self.kill_at = plan.randrange(self.ops * 7 // 10, self.ops - quiet) if self.kill else -1
        self.victim = self.n - 1
        self.local = random.Random(self.seed * 1000 + self.rank)  # this rank's delays
        self.checked = 0
        self.errors: dict[str, int] = {}
        self.sessions = 0
        self.tags: list[str] = []

    # ---- inputs and references (every rank computes every rank's inputs) ----------------

    def tensor(self, i: int, rank: int, what: str, shape: tuple[int, ...], dtype: Any) -> Any:
        g = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}/{i}/{rank}/{what}".encode()))
        if dtype == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dtype in (torch.uint8, torch.int64):
            t = torch.randint(0, 200, shape, generator=g).to(dtype)
        else:
            t = torch.randn(shape, generator=g).to(dtype)
        return t

    def on_device(self, t: Any) -> Any:
        return t.to(self.device)

    def rank_sum(self, parts: list[Any], dtype: Any) -> Any:
        """fp32 sum in rank order, rounded once (the runtime's reduction order)."""
        acc = torch.zeros_like(parts[0], dtype=torch.float32)
        for p in parts:
            acc += p.float()
        return acc.to(dtype)

    def close(self, got: Any, want: Any, what: str) -> None:
        tol = 2e-2 if self.cuda else 1e-4
        got, want = got.float().cpu(), want.float().cpu()
        assert torch.allclose(got, want, rtol=tol, atol=tol), f"{what}: {(got - want).abs().max()}"

    def same(self, got: Any, want: Any, what: str) -> None:
        assert torch.equal(got.cpu(), want.cpu()), f"{what}: results differ"

    # ---- one op --------------------------------------------------------------------------

    def run_op(self, s: Session, i: int, rng: random.Random) -> None:
        op = OPS[rng.randrange(len(OPS))]
        n, r = self.n, self.rank
        m = rng.randint(1, MAX_M)
        buf: SymmetricBuffer = s.buffers[rng.randrange(len(s.buffers))]
        if op in ("all_gather", "all_gather_into"):
            buf.pull_gather = rng.random() < 0.5
            buf.serial_puts = rng.random() < 0.5
            buf.put_split = rng.randint(1, 3)
            buf.sm_share = (0, 0) if rng.random() < 0.7 else (37, 3)
        cols = rng.randint(1, 17)
        if op == "all_gather":
            dtype = GATHER_DTYPES[rng.randrange(len(GATHER_DTYPES))]
            xs = [self.tensor(i, k, "x", (m, cols), dtype) for k in range(n)]
            self.finish(buf.all_gather(self.on_device(xs[r])), torch.cat(xs), f"{i} {op}")
        elif op == "all_gather_into":
            data = [self.tensor(i, k, "d", (m, cols), torch.bfloat16) for k in range(n)]
            scale = [self.tensor(i, k, "s", (1,), torch.float32) for k in range(n)]
            off2 = (n * data[0].nbytes + 64) // 64 * 64
            buf.all_gather_into([(self.on_device(data[r]), 0), (self.on_device(scale[r]), off2)])
            got = buf.view(torch.bfloat16, (n * m, cols)).clone()
            got_s = buf.view(torch.float32, (n,), offset=off2).clone()
            self.finish(got, torch.cat(data), f"{i} {op} data")
            self.same(got_s, torch.cat(scale), f"{i} {op} scales")
        elif op.startswith("reduce_scatter"):
            dtype = RS_DTYPES[rng.randrange(len(RS_DTYPES))]
            ys = [self.tensor(i, k, "y", (n * m, cols), dtype) for k in range(n)]
            want = self.rank_sum([y[r * m : (r + 1) * m] for y in ys], dtype)
            y = self.on_device(ys[r])
            if op == "reduce_scatter_in_place":
                buf.barrier()  # no peer reads our region any more
                y = buf.view(dtype, (n * m, cols))
                y.copy_(self.on_device(ys[r]))
            self.finish(buf.reduce_scatter(y), want, f"{i} {op}")
        elif op == "barrier":
            buf.barrier()
            self.finish(None, None, f"{i} {op}")
        elif op in ("ag_gemm", "bulk_ag"):
            xs = [self.tensor(i, k, "x", (m, K), torch.float32) for k in range(n)]
            w = self.tensor(i, -1, "w", (N, K), torch.float32)
            gathered = torch.cat(xs)
            if op == "ag_gemm":
                s.ag.pieces = rng.randint(1, m)
                s.ag.pull_shards = rng.random() < 0.3
                s.ag.staggered_puts = rng.random() < 0.5
                y = s.ag(self.on_device(xs[r]), self.on_device(w))
                self.finish(y, gathered.double() @ w.double().t(), f"{i} {op}", exact=False)
            else:
                a = self.tensor(i, r, "a", (8, 8), torch.float32)
                y = s.bag(self.on_device(xs[r]), self.on_device(a), self.on_device(a))
                self.finish(y, a.double() @ a.double(), f"{i} {op} gemm", exact=False)
                self.same(s.bag.gathered_input(), gathered, f"{i} {op} gathered")
        elif op.startswith("gemm_rs"):
            xs = [self.tensor(i, k, "x", (n * m, K), torch.float32) for k in range(n)]
            ws = [self.tensor(i, k, "w", (N, K), torch.float32) for k in range(n)]
            rows = slice(r * m, (r + 1) * m)
            parts = [(x.double() @ w.double().t())[rows] for x, w in zip(xs, ws, strict=True)]
            if op == "gemm_rs_pipelined":
                s.rs.pieces = rng.randint(1, m)
                y = s.rs(self.on_device(xs[r]), self.on_device(ws[r]))
            else:
                s.ring.pull_shards = rng.random() < 0.5
                y = s.ring(self.on_device(xs[r]), self.on_device(ws[r]))
            self.finish(y, sum(parts), f"{i} {op}", exact=False)
        else:  # bulk_rs
            xs = [self.tensor(i, k, "x", (n * m, N), torch.float32) for k in range(n)]
            a = self.tensor(i, r, "a", (8, 8), torch.float32)
            s.brs.pieces = rng.randint(1, m)
            out, y = s.brs(self.on_device(xs[r]), self.on_device(a), self.on_device(a))
            want = self.rank_sum([x[r * m : (r + 1) * m] for x in xs], torch.float32)
            self.finish(out, want, f"{i} {op}")
            self.close(y, a.double() @ a.double(), f"{i} {op} gemm")

    def finish(self, got: Any, want: Any, what: str, *, exact: bool = True) -> None:
        """Surfaces an asynchronous failure (cuda) before the result counts, then checks it."""
        if self.cuda:
            self.comm_of_op.synchronize()
        if got is not None:
            (self.same if exact else self.close)(got, want, what)
        self.checked += 1

    # ---- the sequence ---------------------------------------------------------------------

    def allowed(self, i: int) -> bool:
        """Whether an error at op ``i`` is expected: at a stall or the op after it, or from
        the kill on."""
        near_stall = any(s <= i <= s + 1 for s in self.stall_at)
        return near_stall or (self.kill_at >= 0 and i >= self.kill_at)

    def before_op(self, i: int) -> None:
        if self.local.random() < 0.3:  # random delays: the ranks arrive out of step
            if self.cuda and self.local.random() < 0.5:
                torch.cuda._sleep(int(self.local.uniform(0, 2e-3) * 1.5e9))
            else:
                time.sleep(self.local.uniform(0, 2e-3))
        if self.stall_at.get(i) == self.rank:
            time.sleep(self.timeout_s + 0.3)  # past the peers' deadline
        if i == self.kill_at and self.rank == self.victim:
            if self.local.random() < 0.5:
                os.kill(os.getpid(), signal.SIGKILL)
            # While waiting inside the op: the handler runs at the wait's next interrupt check.
            signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
            signal.setitimer(signal.ITIMER_REAL, 0.005)

    def recover(self, i: int, s: Session) -> int:
        """Every rank destroys its communicator; the ranks agree where to go on."""
        s.destroy()
        deadline = Deadline(3 * self.timeout_s + 5.0, "the soak's recovery")
        try:
            got = run_collective(
                lambda: self.world.allgather_bytes(str(i).encode()),
                self.world,
                deadline,
                "the exchange of failed ops",
            )
        except (CommTimeoutError, BootstrapError) as exc:
            self.count(exc)
            raise Ended from exc
        return max(int(b) for b in got) + 1

    def count(self, exc: BaseException) -> None:
        self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1

    def run(self) -> None:
        start = time.monotonic()
        i = 0
        ended = False
        while i < self.ops and not ended:
            s = Session(self.world, self.transport, self.timeout_s)
            self.comm_of_op = s.comm
            self.tags.append(s.tags())
            self.sessions += 1
            try:
                while i < self.ops:
                    rng = random.Random(f"{self.seed}/{i}")  # the same on every rank
                    self.before_op(i)
                    t0 = time.monotonic()
                    try:
                        self.run_op(s, i, rng)
                    except TYPED as exc:
                        self.count(exc)
                        assert self.allowed(i), f"op {i}: unexpected {type(exc).__name__}: {exc}"
                        assert time.monotonic() - t0 < self.timeout_s + 5.0, "a late error"
                        i = self.recover(i, s)
                        break
                    except OverlapError as exc:
                        raise AssertionError(f"op {i}: an untyped fault: {exc!r}") from exc
                    i += 1
                else:
                    s.destroy()
            except Ended:
                ended = True
        assert not ended or (self.kill_at >= 0 and self.rank != self.victim), "lost a rank"
        if not ended:  # every rank got to the end: the group is whole
            run_collective(
                lambda: self.world.allgather_bytes(b"done"),
                self.world,
                Deadline(3 * self.timeout_s + 5.0, "the soak's end"),
                "the final exchange",
            )
        time.sleep(0.2)
        left = [e for e in os.listdir("/dev/shm") if any(t in e for t in self.tags)]
        assert not left, f"left in /dev/shm: {left}"
        print(
            f"soak rank={self.rank}: {i} ops, {self.checked} results checked, typed errors "
            f"{self.errors}, {self.sessions} communicators, {time.monotonic() - start:.1f} s",
            flush=True,
        )


def main() -> None:
    Soak(sys.argv).run()


if __name__ == "__main__":
    _worker.run_local(main)

"""Comm-GEMM overlap ops against their references (plain collective + plain GEMM).

Usage: overlap_ops_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: correctness, delayed, negative, plans, mismatch, timeout, timeout_pull,
timeout_ring, ring_then_pipelined, pieces_then_one.

On the host transport the GEMM is the float64-accurate reference, so the overlapped ops must
match the references bit for bit (chunking rows does not change a row's value, and both sum
partials in rank order with fp32 accumulation). On cuda, cuBLASLt may pick other kernels for
chunks than for the whole matrix: GEMM outputs are compared with a tolerance, gathered data
and scales bit for bit. The ring GEMM+RS rounds its running sums at every hop (NOTE
[gemm_rs_ring numerics]) and is compared with a tolerance of that size on both transports
(close_ring). Outputs are poisoned before every call.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable

import _worker
import torch

import overlap.ops.ag_gemm as ag_module
from overlap.comm import Communicator, SymmetricBuffer, TorchBootstrap
from overlap.errors import (
    CommTimeoutError,
    ConfigError,
    InvalidArgumentError,
    StateError,
    UnsupportedHardwareError,
)
from overlap.ops import (
    AllGatherGemm,
    GemmReduceScatter,
    all_gather_gemm_reference,
    all_gather_rows,
    gemm_reduce_scatter_reference,
)

DEVICE = torch.device("cpu")  # cuda:<local rank> on the cuda transport (set in main)
E4M3 = torch.float8_e4m3fn
# Per-tensor FP8 with this rank's own scale where ranks differ on purpose (every chunk's GEMM
# must use its own chunk's scale_inv).
fp8 = _worker.per_tensor_fp8
POISON = float("nan")


def rand(rows: int, cols: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=gen) * scale).to(torch.bfloat16).to(DEVICE)


def close(got: torch.Tensor, want: torch.Tensor, what: str, fp8_inputs: bool = False) -> None:
    """Bit-exact on the host; on cuda within bf16 (or FP8-GEMM) tolerance, FP8 outputs
    within one code (_worker.close); and the reference's strides."""
    assert got.stride() == want.stride(), (what, got.stride(), want.stride())
    _worker.close(got, want, what, cuda=DEVICE.type == "cuda", fp8_inputs=fp8_inputs)


# Unit roundoff of the dtype the ring's running sums are rounded to.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def close_ring(
    got: torch.Tensor, want: torch.Tensor, what: str, n: int, partial: torch.dtype
) -> None:
    """The ring GEMM+RS against the reference (_worker.close_ring: the ring's rounding bound)."""
    assert got.stride() == want.stride(), (what, got.stride(), want.stride())
    _worker.close_ring(got, want, what, n, ROUNDOFF[partial], cuda=DEVICE.type == "cuda")


def shape_trials(tp: int, seed: int) -> list[tuple[int, int, int]]:
    """(m per rank, K, N): m not a multiple of 128 (nor of 16) included; K, N multiples of 16
    (FP8 GEMMs need K % 16 == 0)."""
    rng = random.Random(seed)
    big = DEVICE.type == "cuda"
    trials = [(1, 16, 16), (rng.randrange(2, 40), 32, 48), (rng.randrange(2, 40), 64, 32)]
    if big:
        trials += [(rng.randrange(100, 300), 16 * rng.randrange(8, 40), 16 * rng.randrange(8, 40))]
        trials += [(256, 1024, 768)]
    return trials


def correctness(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    group = tp.group
    n = tp.size
    for trial, (m, k, nout) in enumerate(shape_trials(n, 7)):
        for use_fp8 in (False, True):
            dtype = E4M3 if use_fp8 else torch.bfloat16
            # ---- AG -> GEMM ----
            lanes = 1 + trial % 2
            ag = AllGatherGemm(comm, n * m + 3 * trial, k, dtype, compute_lanes=lanes)
            ag.buffer.put_split = 1 + (trial + use_fp8) % 3  # copies per peer: same result
            ag.staggered_puts = trial % 2 == 0  # push order: same result
            ag.pieces = 1 + (trial + use_fp8) % 4  # pieces per peer shard (<= m): same result
            ag.pull_shards = (trial + use_fp8) % 3 == 1  # pulled or pushed: same result
            x = rand(m, k, gen)
            w = rand(nout, k, gen, 0.1)
            xs = fp8(x, 8.0 * (1 + tp.rank)) if use_fp8 else x
            ws = fp8(w, 64.0) if use_fp8 else w
            bias = rand(1, nout, gen).view(-1) if trial == 1 else None
            gelu = trial == 1
            out = torch.full((n * m, nout), POISON, dtype=torch.bfloat16, device=DEVICE)
            keep = trial % 3 != 2  # the own slot copied or not: same output
            got = ag(xs, ws, out=out, bias=bias, gelu=gelu, keep_gathered=keep)
            assert got is out
            want, gathered = all_gather_gemm_reference(xs, ws, group=group, bias=bias, gelu=gelu)
            close(got, want, f"ag_gemm trial {trial} fp8={use_fp8}", use_fp8)
            raw = ag.buffer.view(dtype, (n * m, k)).view(torch.uint8)
            if not (keep or ag.pull_shards):  # the peers' rows landed, ours were not copied
                _worker.expect_raises(StateError, "keep_gathered=True", ag.gathered_input)
                mine = slice(tp.rank * m, (tp.rank + 1) * m)
                peers = torch.ones(n * m, dtype=torch.bool, device=DEVICE)
                peers[mine] = False
                assert torch.equal(raw[peers], gathered.view(torch.uint8)[peers]), "peer rows"
            else:
                view = ag.gathered_input().view(torch.uint8) if not use_fp8 else raw
                assert torch.equal(view, gathered.view(torch.uint8)), "gathered"
            if use_fp8 and (keep or ag.pull_shards):
                want_scales = all_gather_rows(xs.rowwise_scale_inv.reshape(1), group)
                assert torch.equal(ag.gathered_scale_invs(), want_scales), "scale_invs"
                _worker.expect_raises(StateError, "different scale_inv", ag.gathered_input)
            several_weights(ag, xs, (trial, m, k, nout), use_fp8=use_fp8, tp=tp, gen=gen)
            ag.destroy()
            # ---- GEMM -> RS, both methods ----
            outs = (torch.bfloat16, E4M3) if use_fp8 else (torch.bfloat16, torch.float32)
            for j, out_dtype in enumerate(outs):
                # The ring pushes or pulls (same result): pulls with an FP8 or float32 output
                # in even trials, with a bfloat16 one in odd trials.
                pull = (trial + j) % 2 == 1
                for method in ("pipelined", "ring"):
                    kind = (use_fp8, out_dtype, method, pull and method == "ring")
                    gemm_rs_case(comm, tp, gen, (trial, m, k, nout), kind)


def several_weights(
    ag: AllGatherGemm,
    xs: object,
    shape: tuple[int, int, int, int],
    *,
    use_fp8: bool,
    tp: TorchBootstrap,
    gen: torch.Generator,
) -> None:
    """Q/K/V-like weights sharing one gather: each output against its own reference."""
    trial, m, k, nout = shape
    n = tp.size
    widths = (nout, 16 * (1 + trial % 3), 32)
    ws = [rand(width, k, gen, 0.1 * (i + 1)) for i, width in enumerate(widths)]
    wq = [fp8(w, 32.0 * (i + 1)) for i, w in enumerate(ws)] if use_fp8 else ws
    biases = [None, rand(1, widths[1], gen).view(-1), None]
    outs = [torch.full((n * m, w), POISON, dtype=torch.bfloat16, device=DEVICE) for w in widths]
    got = ag(xs, wq, out=outs, bias=biases, keep_gathered=True)
    assert (
        isinstance(got, tuple)
        and len(got) == 3
        and all(g is o for g, o in zip(got, outs, strict=True))
    )
    for i, (w, b) in enumerate(zip(wq, biases, strict=True)):
        want, gathered = all_gather_gemm_reference(xs, w, group=tp.group, bias=b)
        close(got[i], want, f"ag_gemm trial {trial} fp8={use_fp8} weight {i}", use_fp8)
    data = ag.buffer.view(E4M3 if use_fp8 else torch.bfloat16, (n * m, k))
    assert torch.equal(data.view(torch.uint8), gathered.view(torch.uint8)), "gathered (3 weights)"


def gemm_rs_case(
    comm: Communicator,
    tp: TorchBootstrap,
    gen: torch.Generator,
    shape: tuple[int, int, int, int],
    kind: tuple[bool, torch.dtype, str, bool],
) -> None:
    """One GEMM+RS call against the reference (exact on the host for the pipelined method,
    within the ring's rounding bound for the ring)."""
    group, n = tp.group, tp.size
    trial, m, k, nout = shape
    use_fp8, out_dtype, method, pull = kind
    rows = n * m
    lanes = 1 + trial % 2
    what = f"gemm_rs {method} trial {trial} fp8={use_fp8} out={out_dtype} pull={pull}"
    rs = GemmReduceScatter(
        comm,
        rows + n * trial,
        nout,
        out_dtype,
        compute_lanes=lanes,
        method=method,
        ring_subchunks=1 + trial % 4,
        # Rounds of pieces (<= m) per chunk: the same result, the amax over every piece.
        pieces=1 + (trial + use_fp8) % 4 if method == "pipelined" else 1,
        pull_shards=pull,
    )
    rs.buffer.put_split = 1 + trial % 3
    x = rand(rows, k, gen)
    w = rand(nout, k, gen, 0.1)
    xs = fp8(x, 16.0) if use_fp8 else x
    ws = fp8(w, 64.0 + tp.rank) if use_fp8 else w
    partial = torch.bfloat16 if out_dtype == E4M3 else out_dtype

    def check(got: torch.Tensor, want: torch.Tensor, label: str) -> None:
        if method == "ring":
            close_ring(got, want, label, n, partial)
        else:
            close(got, want, label, use_fp8)

    if out_dtype == E4M3:
        extra = {
            "out_scale": torch.tensor([4.0], device=DEVICE),
            "out_amax": torch.full((1,), POISON, device=DEVICE),
        }
        extra_ref = dict(extra, out_amax=torch.full((1,), POISON, device=DEVICE))
        scale_inv = torch.full((1,), POISON, device=DEVICE)
        out = torch.zeros((m, nout), dtype=E4M3, device=DEVICE)
        got = rs(xs, ws, out=out, out_scale_inv=scale_inv, **extra)
        assert got is out
        want = gemm_reduce_scatter_reference(xs, ws, group=group, out_dtype=E4M3, **extra_ref)
        assert scale_inv.item() == 0.25, scale_inv
        check(extra["out_amax"], extra_ref["out_amax"], f"{what}: amax")
        if method == "ring":
            close_ring(got, want, what, n, partial)
        else:
            close(got.float(), want.float(), what, True)
    else:
        out = torch.full((m, nout), POISON, dtype=out_dtype, device=DEVICE)
        got = rs(xs, ws, out=out)
        assert got is out
        want = gemm_reduce_scatter_reference(xs, ws, group=group, out_dtype=out_dtype)
        check(got, want, what)
    rs.destroy()


def delay(seconds: float) -> None:
    if DEVICE.type == "cuda":
        torch.cuda._sleep(int(seconds * 1.5e9))
    else:
        time.sleep(seconds)


def delayed(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Back-to-back ops on each op's buffer with a deliberately slow rank (invariant 8): a fast
    rank must never overwrite a chunk a slow one still reads."""
    n, m, k, nout = tp.size, 24, 32, 48
    ag = AllGatherGemm(comm, n * m, k, torch.bfloat16)
    rs = GemmReduceScatter(comm, n * m, nout, torch.bfloat16, compute_lanes=2)
    # The ring on the pipelined op's buffer: the two methods alternate on it (the ring takes
    # several epochs per op, NOTE [ring sub-epochs]), and two rings run back to back.
    ring = GemmReduceScatter(comm, n * m, nout, torch.bfloat16, method="ring", buffer=rs.buffer)
    slow = tp.size - 1
    xs = [rand(m, k, gen) for _ in range(6)]
    ys = [rand(n * m, k, gen) for _ in range(6)]
    zs = [[rand(n * m, k, gen) for _ in range(2)] for _ in range(6)]
    w = rand(nout, k, gen, 0.1)
    w2 = rand(16, k, gen, 0.3)
    got_ag, got_gathered, got_rs, got_ring, got_two = [], [], [], [], []
    side = torch.cuda.Stream(DEVICE) if DEVICE.type == "cuda" else None
    for i in range(6):
        # Odd iterations on a side stream (cuda): the ops follow the caller's current stream.
        with torch.cuda.stream(side) if side is not None and i % 2 else contextlib.nullcontext():
            if tp.rank == slow:
                delay(0.04 * (i % 3))
            x = xs[i].clone()
            ag.pieces = 1 + i % 3  # several epochs per op (NOTE [ag_gemm pieces])
            ag.pull_shards = i % 2 == 1  # pulls after pushes and back (NOTE [ag_gemm pulls])
            got_ag.append(ag(x, w).clone())
            # Two weights, one gather, the gathered input kept (pushes: our own slot copied).
            got_two.append([y.clone() for y in ag(x, (w2, w), keep_gathered=True)])
            # Stream order: the op has read its input by now (its copy lanes joined back).
            x.fill_(POISON)
            got_gathered.append(ag.gathered_input().clone())
            if tp.rank == slow:
                delay(0.03)
            y = ys[i].clone()
            rs.pieces = 1 + (i + 1) % 3  # several epochs per op (NOTE [gemm_rs pieces])
            got_rs.append(rs(y, w).clone())
            y.fill_(POISON)
            ring.ring_subchunks = 1 + i % 3
            ring.compute_lanes = 1 + i // 3  # two lanes: the pulls' signal lane
            for j, z_in in enumerate(zs[i]):
                # Pushes and pulls back to back (NOTE [gemm_rs_ring pulls]).
                ring.pull_shards = (i + j) % 2 == 1
                if tp.rank == (slow + j) % tp.size:
                    delay(0.02 * (1 + i % 2))
                z = z_in.clone()
                got_ring.append(ring(z, w).clone())
                z.fill_(POISON)
    if side is not None:
        torch.cuda.current_stream(DEVICE).wait_stream(side)
    for i in range(6):
        want, gathered = all_gather_gemm_reference(xs[i], w, group=tp.group)
        close(got_ag[i], want, f"ag_gemm {i} (delayed rank)")
        close(got_two[i][1], want, f"ag_gemm {i}, weight 1 of 2 (delayed rank)")
        want2, _ = all_gather_gemm_reference(xs[i], w2, group=tp.group)
        close(got_two[i][0], want2, f"ag_gemm {i}, weight 0 of 2 (delayed rank)")
        assert torch.equal(got_gathered[i], gathered), f"gathered input {i} corrupted"
        want = gemm_reduce_scatter_reference(ys[i], w, group=tp.group)
        close(got_rs[i], want, f"gemm_rs {i} (delayed rank)")
        for j, z in enumerate(zs[i]):
            want = gemm_reduce_scatter_reference(z, w, group=tp.group)
            close_ring(got_ring[2 * i + j], want, f"ring gemm_rs {i}.{j}", tp.size, torch.bfloat16)
    ag.destroy()
    rs.destroy()
    ring.destroy()


def negative(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Rejected calls raise typed errors before communicating; the ops stay usable. (Calls
    that do communicate, with arguments that differ across ranks: ``mismatch``.)"""
    n, m, k, nout = tp.size, 8, 32, 16
    ag = AllGatherGemm(comm, n * m, k, torch.bfloat16)
    rs = GemmReduceScatter(comm, n * m, nout, torch.bfloat16)
    x, w = rand(m, k, gen), rand(nout, k, gen)
    raises = _worker.expect_raises
    raises(InvalidArgumentError, "does not fit", lambda: ag(rand(m, k + 16, gen), w))
    raises(InvalidArgumentError, "does not fit", lambda: ag(rand(m + 1, k, gen), w))
    raises(InvalidArgumentError, "weight", lambda: ag(x, rand(nout, k + 16, gen)))
    raises(InvalidArgumentError, "bare FP8", lambda: ag(x.to(E4M3), w))
    raises(InvalidArgumentError, "share one dtype", lambda: ag(x, w.float()))
    raises(InvalidArgumentError, "out must be", lambda: ag(x, w, out=torch.empty(3, 3)))
    raises(UnsupportedHardwareError, "FP8 outputs", lambda: ag(x, w, out_dtype=E4M3))
    raises(InvalidArgumentError, "multiple of the TP size", lambda: rs(rand(n * m - 1, k, gen), w))
    raises(InvalidArgumentError, "needs out_scale", lambda: _fp8_rs_without_scale(comm, n, k, gen))
    raises(ConfigError, "compute_lanes", lambda: _bypassing(ag, "compute_lanes", 9, x, w))
    # Several weights: every one is checked before the op, the last one included.
    raises(InvalidArgumentError, "(weight 2): weight", lambda: ag(x, [w, w, rand(nout, 16, gen)]))
    raises(InvalidArgumentError, "(weight 1): gemm: the bias", lambda: _bad_bias(ag, x, w))
    raises(InvalidArgumentError, "list/tuple of 2", lambda: ag(x, [w, w], out=[None]))
    if DEVICE.type == "cuda":
        raises(InvalidArgumentError, "cuda", lambda: ag(x.cpu(), w.cpu()))
    # The ring method: the same argument rules, and its own.
    ring = GemmReduceScatter(comm, n * m, nout, torch.bfloat16, method="ring", buffer=rs.buffer)
    y = rand(n * m, k, gen)
    raises(
        InvalidArgumentError, "multiple of the TP size", lambda: ring(rand(n * m - 1, k, gen), w)
    )
    raises(InvalidArgumentError, "must be [", lambda: ring(y, rand(nout, k + 16, gen)))
    raises(InvalidArgumentError, "out must be", lambda: ring(y, w, out=torch.empty(3, 3)))
    raises(
        InvalidArgumentError,
        "method must be",
        lambda: GemmReduceScatter(comm, n, 16, torch.bfloat16, method="tree"),
    )
    raises(
        InvalidArgumentError,
        "ring_subchunks",
        lambda: GemmReduceScatter(comm, n, 16, torch.bfloat16, method="ring", ring_subchunks=5),
    )
    raises(ConfigError, "ring_subchunks", lambda: _bypassing(ring, "ring_subchunks", 7, y, w))
    raises(
        InvalidArgumentError,
        "pieces must be 1..4",
        lambda: AllGatherGemm(comm, n * m, k, torch.bfloat16, pieces=0),
    )
    raises(ConfigError, "pieces must be in [1, 4]", lambda: _bypassing(ag, "pieces", 5, x, w))
    raises(ConfigError, "pieces must be in [1, 4]", lambda: _bypassing(rs, "pieces", 0, y, w))
    raises(
        InvalidArgumentError,
        "pieces apply to the pipelined method",
        lambda: GemmReduceScatter(comm, n, 16, torch.bfloat16, method="ring", pieces=2),
    )
    raises(
        InvalidArgumentError,
        "needs out_scale",
        lambda: _fp8_rs_without_scale(comm, n, k, gen, "ring"),
    )
    raises(
        InvalidArgumentError,
        "pull_shards applies to the ring method",
        lambda: GemmReduceScatter(comm, n, 16, torch.bfloat16, pull_shards=True),
    )
    assert not comm.failed
    # Still usable, with matching results.
    want, _ = all_gather_gemm_reference(x, w, group=tp.group)
    close(ag(x, w), want, "ag_gemm after rejected calls")
    close(rs(y, w), gemm_reduce_scatter_reference(y, w, group=tp.group), "gemm_rs after rejects")
    want = gemm_reduce_scatter_reference(y, w, group=tp.group)
    close_ring(ring(y, w), want, "ring gemm_rs after rejects", n, torch.bfloat16)
    ag.destroy()
    raises(StateError, "destroyed", lambda: ag(x, w))
    rs.destroy()
    raises(StateError, "destroyed", lambda: ring(y, w))


def mismatch(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Ranks calling an op with arguments that differ (sizes, pieces, schedules, methods) get
    a typed error from the op-record check (host transport; best effort on cuda), and the
    communicator is failed (NOTE [failed transport]): each case runs on a new one."""
    n, m, k, nout = tp.size, 8, 32, 16
    first = tp.rank == 0
    x, w, y = rand(m, k, gen), rand(nout, k, gen), rand(n * m, k, gen)
    transport = comm.transport
    comm.destroy()

    def case(match: str, call: Callable[[Communicator], object]) -> None:
        c = Communicator(tp, transport, timeout_s=30)
        _worker.expect_raises(StateError, match, lambda: call(c))
        _worker.expect_raises(StateError, "failed earlier", lambda: call(c))  # even new ops
        assert c.failed and match in (c.failure or ""), c.failure
        c.destroy()

    def ag(c: Communicator, **settings: object) -> AllGatherGemm:
        """An AG+GEMM whose settings differ by rank AFTER its (collective) construction."""
        op = AllGatherGemm(c, n * m, k, torch.bfloat16)
        for name, value in settings.items():
            setattr(op, name, value)
        return op

    def rs(c: Communicator, method: str = "pipelined", **settings: object) -> GemmReduceScatter:
        """The same for a GEMM+RS; the ring on the pipelined method's buffer."""
        piped = GemmReduceScatter(c, n * m, nout, torch.bfloat16)
        op = piped
        if method == "ring":
            op = GemmReduceScatter(
                c, n * m, nout, torch.bfloat16, method=method, buffer=piped.buffer
            )
        for name, value in settings.items():
            setattr(op, name, value)
        return op

    short = rand(m - first, k, gen)
    case("different sizes", lambda c: ag(c)(short, w))
    case("different sizes", lambda c: ag(c, pieces=2 if first else 1)(x, w))  # in the record
    case("different sizes", lambda c: ag(c, pull_shards=first)(x, w))  # so is the schedule
    case("different sizes", lambda c: rs(c, pieces=3 if first else 2)(y, w))
    # The ring against the pipelined method on one buffer, and the ring's pulls against pushes.
    case("collective mismatch", lambda c: rs(c, method="ring" if first else "pipelined")(y, w))
    case("different sizes", lambda c: rs(c, method="ring", pull_shards=first)(y, w))


def _fp8_rs_without_scale(
    comm: Communicator, n: int, k: int, gen: torch.Generator, method: str = "pipelined"
) -> None:
    rs = GemmReduceScatter(comm, n * 4, 16, E4M3, method=method)
    try:
        rs(fp8(rand(n * 4, k, gen), 1.0), fp8(rand(16, k, gen), 1.0))
    finally:
        rs.destroy()


def _bypassing(op: object, setting: str, value: int, x: torch.Tensor, w: torch.Tensor) -> None:
    """``op(x, w)`` with ``op.<setting> = value`` set past the constructor's check (the core
    must refuse it), then the setting restored."""
    kept = getattr(op, setting)
    setattr(op, setting, value)
    try:
        op(x, w)  # type: ignore[operator]
    finally:
        setattr(op, setting, kept)


def _bad_bias(ag: AllGatherGemm, x: torch.Tensor, w: torch.Tensor) -> None:
    ag(x, [w, w], bias=[None, torch.ones(w.shape[0], device=DEVICE)])  # float32 bias: refused


def timeout(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """A rank that never joins an AG+GEMM: the others raise CommTimeoutError naming the op."""
    ag = AllGatherGemm(comm, tp.size * 4, 16, torch.bfloat16)
    _absent_rank(tp, ag.buffer, "ag_gemm", lambda: ag(rand(4, 16, gen), rand(16, 16, gen)))
    ag.destroy()


def timeout_pull(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """The same for AG+GEMM with pulls: on cuda its waits are a handshake kernel's (NOTE
    [handshakes]), which the watchdog must release too."""
    ag = AllGatherGemm(comm, tp.size * 4, 16, torch.bfloat16, pull_shards=True)
    _absent_rank(tp, ag.buffer, "ag_gemm", lambda: ag(rand(4, 16, gen), rand(16, 16, gen)))
    ag.destroy()


def timeout_ring(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """The same for a ring GEMM+RS."""
    n = tp.size
    rs = GemmReduceScatter(comm, n * 4, 16, torch.bfloat16, method="ring")
    _absent_rank(tp, rs.buffer, "gemm_rs_ring", lambda: rs(rand(n * 4, 16, gen), rand(16, 16, gen)))
    rs.destroy()


def ring_then_pipelined(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Issue 32's repro: a ring GEMM+RS on which one rank stalls past the deadline, then a
    pipelined GEMM+RS on the same buffer (as initialize_ub() shares it)."""
    n, m, k, nout = tp.size, 4, 16, 16
    rs = GemmReduceScatter(comm, n * m, nout, torch.bfloat16)
    ring = GemmReduceScatter(comm, n * m, nout, torch.bfloat16, method="ring", buffer=rs.buffer)
    x, w = rand(n * m, k, gen), rand(nout, k, gen)
    _timeout_then_next(
        comm, tp, ring.buffer, "gemm_rs_ring", first=lambda: ring(x, w), second=lambda: rs(x, w)
    )
    fresh = Communicator(tp, comm.transport, timeout_s=30)
    rs = GemmReduceScatter(fresh, n * m, nout, torch.bfloat16)
    close(rs(x, w), gemm_reduce_scatter_reference(x, w, group=tp.group), "on a new communicator")
    fresh.destroy()


def pieces_then_one(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """The same for an AG+GEMM in three pieces, then in one, on the same buffer."""
    n, m, k, nout = tp.size, 4, 16, 16
    ag = AllGatherGemm(comm, n * m, k, torch.bfloat16, pieces=3)
    x, w = rand(m, k, gen), rand(nout, k, gen)

    def in_one_piece() -> object:
        ag.pieces = 1
        return ag(x, w)

    _timeout_then_next(comm, tp, ag.buffer, "ag_gemm", first=lambda: ag(x, w), second=in_one_piece)
    fresh = Communicator(tp, comm.transport, timeout_s=30)
    ag = AllGatherGemm(fresh, n * m, k, torch.bfloat16)
    want, _ = all_gather_gemm_reference(x, w, group=tp.group)
    close(ag(x, w), want, "on a new communicator")
    fresh.destroy()


def _timeout_then_next(
    comm: Communicator,
    tp: TorchBootstrap,
    buffer: SymmetricBuffer,
    op: str,
    *,
    first: Callable[[], object],
    second: Callable[[], object],
) -> None:
    """The last rank stalls (1.5 s) past the 1 s deadline of the first op: every rank raises
    a timeout in it (the others waiting for the stalled rank; the stalled rank because they
    failed: at once, through their poisoned flags, NOTE [poisoned flags], or waiting for data
    they never sent); then NO rank returns a result from the second op on the same buffer,
    nor from an op on another buffer: each raises at once, naming the first fault (NOTE
    [failed transport]). The communicator is destroyed at the end."""
    other = comm.create_buffer(4096)
    buffer.timeout_s = 1.0
    stalled = tp.rank == tp.size - 1
    # The stalled rank's fault may name its failed peer instead of the op.
    fault = (op, "communicator failed") if stalled else (op,)
    if stalled:
        time.sleep(1.5)
    try:
        first()
        buffer.synchronize()
    except CommTimeoutError as exc:
        assert any(f in str(exc) for f in fault) and "timed out" in str(exc), str(exc)
    else:
        raise AssertionError(f"{op} with a stalled rank did not time out")
    buffer.timeout_s = 30.0  # another wait would take this long
    ones = torch.ones(4, device=DEVICE)
    for label, call in (
        ("the next op", second),
        ("another buffer", lambda: other.all_gather(ones)),
    ):
        t0 = time.monotonic()
        try:
            got = call()
            buffer.synchronize()
        except CommTimeoutError as exc:
            assert "failed earlier" in str(exc) and any(f in str(exc) for f in fault), str(exc)
        else:
            raise AssertionError(f"{label} after a timeout returned a result: {got}")
        assert time.monotonic() - t0 < 5.0, f"{label} after a timeout waited again"
    assert comm.failed and any(f in (comm.failure or "") for f in fault), comm.failure
    comm.destroy()


def _absent_rank(tp: TorchBootstrap, buffer: object, op: str, call: Callable[[], object]) -> None:
    buffer._core.timeout_s = 1.0  # type: ignore[attr-defined]
    absent = tp.size - 1
    if tp.rank == absent:
        time.sleep(3.0)
        return
    t0 = time.monotonic()
    try:
        call()
        buffer.synchronize()  # type: ignore[attr-defined]
    except CommTimeoutError as exc:
        assert time.monotonic() - t0 < 6.0
        assert op in str(exc) and f"rank {tp.rank}" in str(exc), str(exc)
    else:
        raise AssertionError(f"{op} with an absent rank did not time out")


def plans(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """NOTE [op plans] over several ranks: FP8 AG+GEMM (every rank its own scale_inv, new on
    every call) and several weights (BF16 and FP8). A call with the planned signature takes
    the fast path (the checked path's function is not called) and returns, bit for bit, what
    an op without a plan returns for the same operands (checked); changed metadata or
    arguments take the checked path and raise what that op raises; the op stays usable."""
    checked = _worker.count_calls(ag_module, "weight_transposed")
    for use_fp8, widths in ((True, (48,)), (True, (48, 16, 32)), (False, (48, 16, 32))):
        _plans_case(comm, tp, gen, use_fp8, widths, checked)


def _plans_case(  # noqa: PLR0917
    comm: Communicator,
    tp: TorchBootstrap,
    gen: torch.Generator,
    use_fp8: bool,
    widths: tuple[int, ...],
    checked: list[int],
) -> None:
    n, m, k = tp.size, 8, 32
    dtype = E4M3 if use_fp8 else torch.bfloat16

    def prep(t: torch.Tensor, scale: float) -> object:
        return fp8(t, scale) if use_fp8 else t

    op = AllGatherGemm(comm, n * m, k, dtype)
    fresh = AllGatherGemm(comm, n * m, k, dtype)  # its plan is dropped before every call
    ws = [prep(rand(width, k, gen, 0.1), 64.0 * (i + 1)) for i, width in enumerate(widths)]
    several = len(ws) > 1
    weight = ws if several else ws[0]
    what = f"plans fp8={use_fp8} weights={len(ws)}"
    for i in range(4):
        xs = prep(rand(m, k, gen), 4.0 * (1 + tp.rank) * (i + 1))  # new scale_invs
        before = len(checked)
        got = op(xs, weight, keep_gathered=True)
        assert len(checked) == before + (i == 0), f"{what}: call {i} took the checked path"
        got = got if several else (got,)
        scales = op.gathered_scale_invs().clone() if use_fp8 else None
        fresh._plan = None
        want = fresh(xs, weight, keep_gathered=True)
        want = want if several else (want,)
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(g, w), f"{what}: call {i} weight {j}: fast != checked"
            ref, _ = all_gather_gemm_reference(xs, ws[j], group=tp.group)
            close(g, ref, f"{what}: call {i} weight {j}", use_fp8)
        if use_fp8:
            assert torch.equal(scales, fresh.gathered_scale_invs()), f"{what}: scale_invs"
    # Changes of metadata or arguments: the checked path's typed errors, on every rank.
    bad_w = [*ws[:-1], prep(rand(widths[-1], k + 16, gen), 1.0)]
    tiny = torch.empty(1, 1, device=DEVICE)
    for args, kwargs in (
        ((prep(rand(m, k + 16, gen), 1.0), weight), {}),
        ((prep(rand(n * m + 1, k, gen), 1.0), weight), {}),
        ((xs, bad_w if several else bad_w[0]), {}),
        ((xs, weight), {"weight_layout": "kk"}),
        ((xs, weight), {"out": [tiny] * len(ws) if several else tiny}),
        ((xs.rowwise_data if use_fp8 else xs.to(E4M3), weight), {}),
    ):
        fresh._plan = None
        _worker.same_error(lambda: op(*args, **kwargs), lambda: fresh(*args, **kwargs))  # noqa: B023
    before = len(checked)
    got = op(xs, weight)  # still planned, and usable
    assert len(checked) == before, f"{what}: the plan did not survive rejected calls"
    for j, g in enumerate(got if several else (got,)):
        close(g, all_gather_gemm_reference(xs, ws[j], group=tp.group)[0], what, use_fp8)
    op.destroy()
    fresh.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, launch, DEVICE, tp = _worker.setup(sys.argv)
    assert tp._order == list(range(tp.size)), "the references assume group-rank order"
    gen = torch.Generator().manual_seed(4321 + launch.rank)
    comm = Communicator(tp, transport, timeout_s=30)
    {
        "correctness": correctness,
        "delayed": delayed,
        "negative": negative,
        "plans": plans,
        "timeout": timeout,
        "timeout_pull": timeout_pull,
        "timeout_ring": timeout_ring,
        "mismatch": mismatch,
        "ring_then_pipelined": ring_then_pipelined,
        "pieces_then_one": pieces_then_one,
    }[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

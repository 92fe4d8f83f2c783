"""Bulk overlap ops against their references (plain collective + plain GEMM).

Usage: bulk_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: correctness, delayed, negative, plans, mismatch, timeout, backlog.

The collectives are compared bit for bit on both transports (the gathered bytes and scales;
the reduce-scatter sums in rank order with fp32 accumulation, as the reference does). The side
GEMMs are bit-exact on the host (the float64 reference GEMM); on cuda cuBLASLt may pick
another kernel under the reduce-scatter's SM target, so they are compared with a tolerance.
Every rank draws its own random inputs; outputs are poisoned before every call.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable

import _worker
import torch

import overlap.ops.bulk as bulk_module
from overlap.comm import Communicator, TorchBootstrap
from overlap.errors import CommTimeoutError, InvalidArgumentError, StateError
from overlap.gemm import gemm
from overlap.ops import (
    AllGatherBesideGemm,
    ReduceScatterBesideGemm,
    all_gather_beside_gemm_reference,
    all_gather_rows,
    reduce_scatter_beside_gemm_reference,
    reduce_scatter_rows,
)
from overlap.quantization import (
    cast_to_fp8,
)

DEVICE = torch.device("cpu")  # cuda:<local rank> on the cuda transport (set in main)
E4M3 = torch.float8_e4m3fn
fp8 = _worker.per_tensor_fp8
NAN = float("nan")


def rand(rows: int, cols: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=gen) * scale).to(torch.bfloat16).to(DEVICE)


def raw_fp8(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale_inv = cast_to_fp8(x.float(), torch.tensor([scale], device=x.device), fp8_dtype=E4M3)
    return data, scale_inv


def poisoned(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    if dtype == E4M3:
        return torch.full(shape, 0x7F, dtype=torch.uint8, device=DEVICE).view(E4M3)  # NaN
    return torch.full(shape, NAN, dtype=dtype, device=DEVICE)


def same_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got.contiguous().view(torch.uint8).cpu(), want.contiguous().view(torch.uint8).cpu()
    assert torch.equal(g, w), f"{what}: {(g != w).sum().item()} bytes differ"


def close(got: torch.Tensor, want: torch.Tensor, what: str, fp8_inputs: bool = False) -> None:
    """A side GEMM: bit-exact on the host, within bf16 (or FP8-GEMM) tolerance on cuda."""
    _worker.close(got, want, what, cuda=DEVICE.type == "cuda", fp8_inputs=fp8_inputs)


def trials(seed: int) -> list[tuple[int, int, tuple[int, int, int]]]:
    """(m per rank, K, side GEMM (m', k', n')): m not a multiple of 16 included; GEMM sizes
    multiples of 16 (FP8 GEMMs need K % 16 == 0)."""
    rng = random.Random(seed)
    out = [(1, 16, (16, 32, 16)), (rng.randrange(2, 40), 48, (32, 16, 48))]
    out += [(rng.randrange(2, 40), 32, (48, 64, 32))]
    if DEVICE.type == "cuda":
        out += [(rng.randrange(100, 300), 16 * rng.randrange(8, 40), (512, 768, 1024))]
        out += [(512, 1024, (2048, 1024, 1536))]
    return out


def side_operands(
    shape: tuple[int, int, int], use_fp8: bool, wgrad: bool, gen: torch.Generator
) -> tuple[object, object, dict]:
    """(a, b, GEMM keywords) of a side GEMM with op(a) [gm, gk], op(b) [gk, gn]: bf16 dgrad-
    like (b not transposed) or wgrad-like (a transposed); FP8 in the TN layout Hopper needs,
    as QuantizedTensors (dgrad) or raw FP8 data with its scale_inv (wgrad: columnwise data)."""
    gm, gk, gn = shape
    if not use_fp8:
        if wgrad:
            return rand(gk, gm, gen), rand(gk, gn, gen, 0.1), {"transa": True}
        return rand(gm, gk, gen), rand(gk, gn, gen, 0.1), {}
    a, b = rand(gm, gk, gen), rand(gn, gk, gen, 0.1)
    if wgrad:
        (ad, asi), (bd, bsi) = raw_fp8(a, 16.0), raw_fp8(b, 64.0)
        return ad, bd, {"transb": True, "a_scale_inv": asi, "b_scale_inv": bsi}
    return fp8(a, 16.0), fp8(b, 64.0), {"transb": True}


def correctness(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    group, n = tp.group, tp.size
    for trial, (m, k, (gm, gk, gn)) in enumerate(trials(11)):
        for use_fp8 in (False, True):
            # ---- all-gather beside a dgrad-like GEMM ----
            dtype = E4M3 if use_fp8 else torch.bfloat16
            ag = AllGatherBesideGemm(comm, n * m + trial, k, dtype)
            ag.buffer.put_split = 1 + (trial + use_fp8) % 3  # copies per peer: same result
            # Peers one after another or all at once (not part of the op record: ranks may differ).
            ag.buffer.serial_puts = (trial + tp.rank * (trial % 2)) % 4 < 2
            x = rand(m, k, gen)
            shared_scale = trial % 2 == 0  # else every rank its own scale_inv
            xs = fp8(x, 8.0 if shared_scale else 8.0 * (1 + tp.rank)) if use_fp8 else x
            a, b, kw = side_operands((gm, gk, gn), use_fp8, False, gen)
            bias = rand(1, gn, gen).view(-1) if trial == 1 else None
            out = poisoned((gm, gn), torch.bfloat16)
            got = ag(xs, a, b, out=out, bias=bias, gelu=bias is not None, **kw)
            assert got is out
            gathered, want = all_gather_beside_gemm_reference(
                xs, a, b, group=group, bias=bias, gelu=bias is not None, **kw
            )
            what = f"bulk all-gather trial {trial} fp8={use_fp8}"
            close(got, want, f"{what}: GEMM", use_fp8)
            same_bytes(ag.buffer.view(dtype, (n * m, k)), gathered, f"{what}: gathered")
            if use_fp8:
                scales = all_gather_rows(xs.rowwise_scale_inv.reshape(1), group)
                assert torch.equal(ag.gathered_scale_invs(), scales), "scale_invs"
                if shared_scale:
                    view = ag.gathered_input()
                    same_bytes(view.rowwise_data, gathered, f"{what}: view")
                    assert torch.equal(view.rowwise_scale_inv, scales[:1])
                else:
                    _worker.expect_raises(StateError, "different scale_inv", ag.gathered_input)
            else:
                same_bytes(ag.gathered_input(), gathered, f"{what}: view")
            ag.destroy()
            # ---- reduce-scatter beside a wgrad-like GEMM ----
            for out_dtype in (torch.bfloat16, E4M3) if use_fp8 else (torch.bfloat16,):
                # Pieces (NOTE [bulk_rs pieces]): more than m rows included (m = 1: one piece).
                pieces = 1 + (trial + 2 * use_fp8 + (out_dtype == E4M3)) % 4
                rs = ReduceScatterBesideGemm(
                    comm, n * m + n * trial, k, torch.bfloat16, pieces=pieces
                )
                rs.buffer.put_split = 1 + trial % 3
                rs.buffer.serial_puts = (trial + use_fp8) % 2 == 0
                rs.reduce_max_blocks = (0, 8, 64)[trial % 3]  # grid bound: same result
                partial = rand(n * m, k, gen, 3.0)
                a, b, kw = side_operands((gm, gk, gn), use_fp8, True, gen)
                accumulate = trial == 1 and not use_fp8  # wgrad into a float32 main_grad
                main_grad = torch.randn(gm, gn, generator=gen).to(DEVICE) if accumulate else None
                gemm_kw = dict(kw, beta=1.0) if accumulate else kw
                fp8_out = out_dtype == E4M3
                extra: dict = {}
                ref_extra: dict = {}
                if fp8_out:
                    extra = {"out_scale": torch.tensor([4.0], device=DEVICE)}
                    ref_extra = dict(extra, out_amax=torch.full((1,), NAN, device=DEVICE))
                    extra["out_amax"] = torch.full((1,), NAN, device=DEVICE)
                    extra["out_scale_inv"] = torch.full((1,), NAN, device=DEVICE)
                out = poisoned((m, k), out_dtype)
                gemm_out = main_grad.clone() if accumulate else poisoned((gm, gn), torch.bfloat16)
                got, y = rs(partial, a, b, out=out, gemm_out=gemm_out, **extra, **gemm_kw)
                assert got is out and y is gemm_out
                want, want_y = reduce_scatter_beside_gemm_reference(
                    partial,
                    a,
                    b,
                    group=group,
                    out_dtype=out_dtype,
                    out=main_grad.clone() if accumulate else None,
                    **ref_extra,
                    **gemm_kw,
                )
                what = (
                    f"bulk reduce-scatter trial {trial} fp8={use_fp8} out={out_dtype} "
                    f"pieces={pieces}"
                )
                same_bytes(got, want, f"{what}: output")
                close(y, want_y, f"{what}: GEMM", use_fp8)
                if fp8_out:
                    assert torch.equal(extra["out_amax"], ref_extra["out_amax"]), "amax"
                    assert extra["out_scale_inv"].item() == 0.25, extra["out_scale_inv"]
                rs.destroy()


def delay(seconds: float) -> None:
    if DEVICE.type == "cuda":
        torch.cuda._sleep(int(seconds * 1.5e9))
    else:
        time.sleep(seconds)


def delayed(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """The backward of a column-parallel layer, six times back to back with a deliberately
    slow rank (invariant 8): gather the input beside dgrad, then reduce-scatter dgrad's partial
    sums beside wgrad, whose GEMM reads the gathered input from the all-gather's buffer. A
    fast rank's next all-gather must not overwrite that input while a slow rank's wgrad still
    reads it, nor its reduce-scatter pushes a slot a slow rank still sums."""
    n, m, k, nout = tp.size, 24, 32, 48
    ag = AllGatherBesideGemm(comm, n * m, k, torch.bfloat16)
    rs = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16)
    slow = tp.size - 1
    xs = [rand(m, k, gen) for _ in range(6)]
    dys = [rand(n * m, nout, gen) for _ in range(6)]
    w = rand(nout, k, gen, 0.1)
    got = []
    side = torch.cuda.Stream(DEVICE) if DEVICE.type == "cuda" else None
    for i in range(6):
        # Odd iterations on a side stream (cuda): the ops follow the caller's current stream.
        with torch.cuda.stream(side) if side is not None and i % 2 else contextlib.nullcontext():
            if tp.rank == slow:
                delay(0.04 * (i % 3))
            x = xs[i].clone()
            dgrad = ag(x, dys[i], w)  # dX partial [n m, k] = dY @ W
            x.fill_(NAN)  # stream order: the op has read its shard by now
            gathered = ag.gathered_input()
            if tp.rank == slow:
                delay(0.03)
            rs.pieces = 1 + i % 4  # several epochs per op (NOTE [bulk_rs pieces])
            dx, dw = rs(dgrad, dys[i], gathered, transa=True)  # dW [nout, k] = dY^T @ X
            got.append((gathered.clone(), dgrad.clone(), dx.clone(), dw.clone()))
            dgrad.fill_(NAN)
    if side is not None:
        torch.cuda.current_stream(DEVICE).wait_stream(side)
    for i, (gathered, dgrad, dx, dw) in enumerate(got):
        want_gathered = all_gather_rows(xs[i], tp.group)
        same_bytes(gathered, want_gathered, f"gathered input {i} (delayed rank)")
        close(dgrad, gemm(dys[i], w), f"dgrad {i} (delayed rank)")
        same_bytes(dx, reduce_scatter_rows(dgrad, group=tp.group), f"dx {i} (delayed rank)")
        close(dw, gemm(dys[i], want_gathered, transa=True), f"dw {i} (delayed rank)")
    ag.destroy()
    rs.destroy()


def negative(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Rejected calls raise typed errors before communicating; the ops stay usable. (Calls
    that do communicate, with arguments that differ across ranks: ``mismatch``.)"""
    n, m, k = tp.size, 8, 32
    ag = AllGatherBesideGemm(comm, n * m, k, torch.bfloat16)
    rs = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16)
    x, a, b = rand(m, k, gen), rand(16, 32, gen), rand(32, 16, gen)
    raises = _worker.expect_raises
    raises(InvalidArgumentError, "does not fit", lambda: ag(rand(m, k + 16, gen), a, b))
    raises(InvalidArgumentError, "does not fit", lambda: ag(rand(n * m + 1, k, gen), a, b))
    raises(InvalidArgumentError, "inner dimensions", lambda: ag(x, a, rand(16, 16, gen)))
    raises(InvalidArgumentError, "bare FP8", lambda: ag(x.to(E4M3), a, b))
    raises(InvalidArgumentError, "multiple of", lambda: rs(rand(n * m - 1, k, gen), a, b))
    raises(
        InvalidArgumentError,
        "needs out_scale",
        lambda: rs(rand(n * m, k, gen), a, b, out_dtype=E4M3),
    )
    ag(x, a, b)
    # NOTE [bulk independence]: wgrad may not read the gathered input of its own buffer.
    raises(
        InvalidArgumentError,
        "overlaps the symmetric buffer",
        lambda: ag(x, ag.gathered_input(), rand(k, 16, gen)),
    )
    partial = rand(n * m, k, gen)
    raises(
        InvalidArgumentError,
        "overlaps the reduce-scatter's input",
        lambda: rs(partial, rand(n * m, 16, gen), rand(16, k, gen), gemm_out=partial),
    )
    if DEVICE.type == "cuda":
        raises(InvalidArgumentError, "cuda", lambda: ag(x.cpu(), a, b))
    assert not comm.failed
    # Still usable, with matching results.
    y = ag(x, a, b)
    gathered, want = all_gather_beside_gemm_reference(x, a, b, group=tp.group)
    close(y, want, "GEMM after rejected calls")
    same_bytes(ag.gathered_input(), gathered, "gathered after rejected calls")
    out, y = rs(partial, a, b)
    same_bytes(out, reduce_scatter_rows(partial, group=tp.group), "reduce-scatter after rejects")
    close(y, gemm(a, b), "GEMM after rejected calls (rs)")
    ag.destroy()
    raises(StateError, "destroyed", lambda: ag(x, a, b))
    rs.destroy()


def mismatch(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Ranks calling a bulk op with arguments that differ get a typed error from the op-record
    check (host transport; best effort on cuda), and the communicator is failed (NOTE [failed
    transport]): each case runs on a new one, whose side GEMM still ran."""
    n, m, k = tp.size, 8, 32
    a, b = rand(16, 32, gen), rand(32, 16, gen)
    transport = comm.transport
    comm.destroy()

    def short_shard(c: Communicator) -> Callable[[], object]:
        ag = AllGatherBesideGemm(c, n * m, k, torch.bfloat16)
        short = rand(m - (tp.rank == 0), k, gen)
        return lambda: ag(short, a, b)

    def pieces(c: Communicator) -> Callable[[], object]:
        rs = ReduceScatterBesideGemm(c, n * m, k, torch.bfloat16)
        rs.pieces = 2 if tp.rank == 0 else 1  # in the op record (NOTE [bulk_rs pieces])
        partial = rand(n * m, k, gen)
        return lambda: rs(partial, a, b)

    for case in (short_shard, pieces):
        c = Communicator(tp, transport, timeout_s=30)
        call = case(c)
        _worker.expect_raises(StateError, "different sizes", call)
        _worker.expect_raises(StateError, "failed earlier", call)
        assert c.failed and "different sizes" in (c.failure or ""), c.failure
        c.destroy()


def timeout(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """A rank that never joins: the others raise CommTimeoutError naming the op and rank; the
    side GEMM, which waits for nothing, still produced its result."""
    rs = ReduceScatterBesideGemm(comm, tp.size * 4, 16, torch.bfloat16)
    rs.buffer._core.timeout_s = 1.0
    absent = tp.size - 1
    if tp.rank == absent:
        time.sleep(3.0)
    else:
        a, b = rand(32, 16, gen), rand(16, 48, gen)
        y = poisoned((32, 48), torch.bfloat16)
        t0 = time.monotonic()
        try:
            rs(rand(tp.size * 4, 16, gen), a, b, gemm_out=y)
            rs.buffer.synchronize()
        except CommTimeoutError as exc:
            assert time.monotonic() - t0 < 6.0
            msg = str(exc)
            assert "bulk_reduce_scatter" in msg and f"rank {tp.rank}" in msg, msg
        else:
            raise AssertionError("bulk reduce-scatter with an absent rank did not time out")
        close(y, gemm(a, b), "side GEMM of a timed-out reduce-scatter")
    rs.destroy()


def backlog(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """NOTE [monotone release] (csrc/comm/cuda/watchdog.h): the last rank takes part in two
    ops, then stays away while the others issue eight more back to back, four of them bulk
    reduce-scatters whose four pieces await four values on one flag, before any learns of the
    timeout. The cuda watchdog once released its pending waits by storing each one's value, out
    of order (dropping the satisfied waits of the first ops reorders its list), and so lowered
    flags below waits it no longer watched: the GPU never drained and the next host sync never
    returned (the layers' timeout scenario). Every rank must raise, and the host syncs and the
    destroys that follow must return."""
    n, m, k = tp.size, 8, 16
    ag = AllGatherBesideGemm(comm, n * m, k, torch.bfloat16)
    rs = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16, pieces=4)
    for op in (ag, rs):
        op.buffer._core.timeout_s = 1.0
    a, b = rand(32, 16, gen), rand(16, 48, gen)
    x, partial = rand(m, k, gen), rand(n * m, k, gen)
    ag(x, a, b)
    rs(partial, a, b)
    if tp.rank == n - 1:
        time.sleep(4.0)
    else:
        t0 = time.monotonic()
        try:
            for _ in range(4):
                ag(x, a, b)
                rs(partial, a, b)
            comm.synchronize()
        except CommTimeoutError as exc:
            assert "timed out" in str(exc), str(exc)
        else:
            raise AssertionError("ops with an absent rank did not time out")
        assert time.monotonic() - t0 < 1.0 + 5.0, "the timeout came too late"
    torch.distributed.barrier(group=tp.group)
    t0 = time.monotonic()
    with contextlib.suppress(CommTimeoutError):
        comm.synchronize()  # returns: every wait was released
    ag.destroy()
    rs.destroy()
    comm.destroy()
    assert time.monotonic() - t0 < 5.0, "the device did not drain"


def plans(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """NOTE [op plans] over several ranks: each bulk op, BF16 and FP8 (the side GEMM's
    QuantizedTensors, or raw FP8 data with its scale_inv, new on every call). A call with the
    planned signature takes the fast path (the side GEMM's checks are not called) and returns,
    bit for bit, what an op without a plan returns (checked); changed metadata or arguments
    take the checked path and raise what that op raises; the op stays usable."""
    checked = _worker.count_calls(bulk_module, "plan_side_gemm")
    for use_fp8 in (False, True):
        _plans_all_gather(comm, tp, gen, use_fp8, checked)
        _plans_reduce_scatter(comm, tp, gen, use_fp8, checked)


def _plans_all_gather(
    comm: Communicator, tp: TorchBootstrap, gen: torch.Generator, use_fp8: bool, checked: list
) -> None:
    n, m, k = tp.size, 8, 32
    dtype = E4M3 if use_fp8 else torch.bfloat16
    op = AllGatherBesideGemm(comm, n * m, k, dtype)
    fresh = AllGatherBesideGemm(comm, n * m, k, dtype)  # its plan is dropped before every call
    what = f"plans bulk all-gather fp8={use_fp8}"
    for i in range(4):
        x = rand(m, k, gen)
        xs = fp8(x, 8.0 * (i + 1)) if use_fp8 else x  # one scale on every rank, new per call
        a, b, kw = side_operands((32, 16, 48), use_fp8, False, gen)
        before = len(checked)
        y = op(xs, a, b, **kw)
        assert len(checked) == before + (i == 0), f"{what}: call {i} took the checked path"
        view = op.gathered_input()
        data = (view.rowwise_data if use_fp8 else view).clone()
        fresh._plan = None
        want = fresh(xs, a, b, **kw)
        assert torch.equal(y, want), f"{what}: call {i}: fast != checked"
        fresh_view = fresh.gathered_input()
        same_bytes(data, fresh_view.rowwise_data if use_fp8 else fresh_view, what)
        gathered, ref = all_gather_beside_gemm_reference(xs, a, b, group=tp.group, **kw)
        close(y, ref, f"{what}: call {i}", use_fp8)
        same_bytes(data, gathered, f"{what}: call {i}: gathered")
    # Changes of metadata or arguments: the checked path's typed errors, on every rank.
    other = rand(m, k + 16, gen)
    for args, extra in (
        ((fp8(other, 1.0) if use_fp8 else other, a, b), {}),
        ((xs, a, rand(8, 16, gen)), {}),  # inner dimensions (the core checks them)
        ((xs, a, b), {"beta": 1.0}),
        ((xs, a, b), {"out": torch.empty(1, 1, device=DEVICE)}),
        ((xs.rowwise_data if use_fp8 else xs.to(E4M3), a, b), {}),
    ):
        fresh._plan = None
        kwargs = {**kw, **extra}
        _worker.same_error(lambda: op(*args, **kwargs), lambda: fresh(*args, **kwargs))  # noqa: B023
    before = len(checked)
    close(op(xs, a, b, **kw), ref, f"{what}: after rejected calls", use_fp8)
    assert len(checked) == before, f"{what}: the plan did not survive rejected calls"
    op.destroy()
    fresh.destroy()


def _plans_reduce_scatter(
    comm: Communicator, tp: TorchBootstrap, gen: torch.Generator, use_fp8: bool, checked: list
) -> None:
    n, m, k = tp.size, 8, 32
    op = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16)
    fresh = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16)
    what = f"plans bulk reduce-scatter fp8={use_fp8}"
    for i in range(4):
        partial = rand(n * m, k, gen, 3.0)
        a, b, kw = side_operands((48, 64, 32), use_fp8, True, gen)  # new scale_invs
        before = len(checked)
        out, y = op(partial, a, b, **kw)
        assert len(checked) == before + (i == 0), f"{what}: call {i} took the checked path"
        fresh._plan = None
        want, want_y = fresh(partial, a, b, **kw)
        assert torch.equal(out, want) and torch.equal(y, want_y), f"{what}: fast != checked"
        ref, ref_y = reduce_scatter_beside_gemm_reference(partial, a, b, group=tp.group, **kw)
        same_bytes(out, ref, f"{what}: call {i}: output")
        close(y, ref_y, f"{what}: call {i}: GEMM", use_fp8)
    for args, extra in (
        ((rand(n * m + n, k, gen), a, b), {}),
        ((partial.float(), a, b), {}),
        ((partial, a, b), {"out_dtype": E4M3}),
        ((partial, a, b), {"out": torch.empty(1, 1, dtype=torch.bfloat16, device=DEVICE)}),
        ((partial, a, b), {"gemm_out": torch.empty(1, 1, dtype=torch.bfloat16, device=DEVICE)}),
    ):
        fresh._plan = None
        kwargs = {**kw, **extra}
        _worker.same_error(lambda: op(*args, **kwargs), lambda: fresh(*args, **kwargs))  # noqa: B023
    before = len(checked)
    out, _ = op(partial, a, b, **kw)
    same_bytes(out, ref, f"{what}: after rejected calls")
    assert len(checked) == before, f"{what}: the plan did not survive rejected calls"
    op.destroy()
    fresh.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, launch, DEVICE, tp = _worker.setup(sys.argv)
    assert tp._order == list(range(tp.size)), "the references assume group-rank order"
    gen = torch.Generator().manual_seed(9876 + launch.rank)
    comm = Communicator(tp, transport, timeout_s=30)
    {
        "correctness": correctness,
        "delayed": delayed,
        "negative": negative,
        "plans": plans,
        "mismatch": mismatch,
        "timeout": timeout,
        "backlog": backlog,
    }[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

"""The fused AG+GEMM (NOTE [fused ag_gemm]): one waiting GEMM over the pulled shards.
Usage: fused_ag_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: correctness, negative, kernels.

On the host transport the waiting GEMM is the transport's default (each group's wait, then
the float64-accurate reference GEMM): outputs match the reference bit for bit, so CI checks
the groups, their order, pointers, flags and values. On cuda it is the CUTLASS kernel
(NOTE [waiting gemm]); outputs are compared within bfloat16 tolerance, gathered data bit for
bit. Outputs are poisoned before every call.
"""

from __future__ import annotations

import sys

import _worker
import torch

from overlap import gemm
from overlap.comm import Communicator, TorchBootstrap
from overlap.errors import InvalidArgumentError, UnsupportedHardwareError
from overlap.ops import AllGatherGemm, all_gather_gemm_reference

DEVICE = torch.device("cpu")  # cuda:<local rank> on the cuda transport (set in main)
POISON = float("nan")


def rand(rows: int, cols: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=gen) * scale).to(torch.bfloat16).to(DEVICE)


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-exact on the host; on cuda within bfloat16 tolerance of the reference."""
    _worker.close(got, want, what, cuda=DEVICE.type == "cuda")


def trials() -> list[tuple[int, int, int]]:
    """(m per rank, K, N), K and N multiples of 8 (the kernel's rule); on cuda also shards
    below and above the small-tile bound (NOTE [waiting gemm tiles]) and m not a multiple of
    the tiles."""
    shapes = [(1, 16, 16), (5, 32, 48), (24, 64, 40)]
    if DEVICE.type == "cuda":
        shapes += [(200, 512, 776), (256, 1024, 768), (300, 2048, 1024), (1024, 1024, 512)]
    return shapes


def correctness(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    n = tp.size
    for trial, (m, k, nout) in enumerate(trials()):
        pieces = min(m, 1 + trial % 3)  # groups per peer shard: same result
        ag = AllGatherGemm(
            comm, n * m + 8 * trial, k, torch.bfloat16, pull_shards=True, fused_gemm=True,
            pieces=pieces,
        )  # fmt: skip
        what = f"fused ag_gemm trial {trial} (m {m}, k {k}, n {nout}, pieces {pieces})"
        for call in range(3):  # back to back: each op's flag values above the last's
            x = rand(m, k, gen)
            w = rand(nout, k, gen, 0.1)
            alpha = 1.0 if call != 1 else 0.5
            out = torch.full((n * m, nout), POISON, dtype=torch.bfloat16, device=DEVICE)
            got = ag(x, w, out=out, alpha=alpha)
            assert got is out
            want, gathered = all_gather_gemm_reference(x, w, group=tp.group, alpha=alpha)
            close(got, want, f"{what} call {call}")
            assert torch.equal(ag.gathered_input(), gathered), f"{what}: gathered input"
        # Several weights (Q, K, V): every chunk's group for each weight, one kernel.
        widths = (nout, 8 * (1 + trial % 3), 32)
        ws = [rand(width, k, gen, 0.1 * (i + 1)) for i, width in enumerate(widths)]
        x = rand(m, k, gen)
        outs = [torch.full((n * m, c), POISON, dtype=torch.bfloat16, device=DEVICE) for c in widths]
        got3 = ag(x, ws, out=outs)
        for i, wi in enumerate(ws):
            want, _ = all_gather_gemm_reference(x, wi, group=tp.group)
            close(got3[i], want, f"{what} weight {i} of 3")
        ag.destroy()
    # Fused and chunked ops on one buffer, one after the other: the flags only grow.
    m, k, nout = 8, 32, 16
    fused = AllGatherGemm(comm, n * m, k, torch.bfloat16, pull_shards=True, fused_gemm=True)
    kinds = [
        fused,
        AllGatherGemm(comm, n * m, k, torch.bfloat16, pull_shards=True, buffer=fused.buffer),
        AllGatherGemm(comm, n * m, k, torch.bfloat16, buffer=fused.buffer, pieces=2),
    ]
    for i in range(6):
        op = kinds[i % 3]
        x, w = rand(m, k, gen), rand(nout, k, gen)
        want, _ = all_gather_gemm_reference(x, w, group=tp.group)
        close(op(x, w), want, f"op {i} ({'fused' if op.fused_gemm else 'chunked'}) on one buffer")
    fused.destroy()


def kernels(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """Every waiting-kernel candidate (NOTE [waiting gemm tiles]), forced one at a time, gives
    the reference's result on shapes whose tiles do not divide them; then the measured choice
    (NOTE [waiting gemm choice]) is recorded for the problem it ran. On the host the override
    changes nothing (the transport's default runs the groups) but is accepted all the same."""
    n = tp.size
    names = gemm.waiting_kernels()
    cuda = DEVICE.type == "cuda"
    assert not cuda or len(names) == 5, names
    forced = ["untuned", *names] if cuda else ["untuned", *names[:1]]
    # (m per rank, K, N, pieces): a 2-CTA cluster's pair straddles a shard's end, N not a
    # multiple of 128 or 256, pieces of a shard as groups, 200 rows (small tiles untuned).
    shapes = [(300, 512, 776, 2), (200, 256, 264, 1)] if cuda else [(5, 32, 48, 2)]
    ops = [
        AllGatherGemm(comm, n * m, k, torch.bfloat16, pull_shards=True, fused_gemm=True, pieces=p)
        for m, k, _, p in shapes
    ]
    previous = ""
    try:
        for name in forced:
            assert gemm.set_waiting_kernel(name) == previous
            previous = name
            for ag, (m, k, nout, p) in zip(ops, shapes, strict=True):
                x, w = rand(m, k, gen), rand(nout, k, gen, 0.1)
                out = torch.full((n * m, nout), POISON, dtype=torch.bfloat16, device=DEVICE)
                want, _ = all_gather_gemm_reference(x, w, group=tp.group)
                close(ag(x, w, out=out), want, f"kernel {name!r}, m {m} k {k} n {nout} pieces {p}")
    finally:
        gemm.set_waiting_kernel("")
    # More groups than one kernel launch takes (kWaitingMaxGroups, 32): (1 + (n - 1) * 4) x 7.
    m, k = shapes[0][0], shapes[0][1]
    many = AllGatherGemm(
        comm, n * m, k, torch.bfloat16, pull_shards=True, fused_gemm=True, pieces=4
    )
    x = rand(m, k, gen)
    ws = [rand(16 * (i + 1), k, gen, 0.1) for i in range(7)]
    for i, (got, wi) in enumerate(zip(many(x, ws), ws, strict=True)):
        want, _ = all_gather_gemm_reference(x, wi, group=tp.group)
        close(got, want, f"weight {i} of 7, 4 pieces ({(1 + (n - 1) * 4) * 7} groups)")
    many.destroy()
    m, k, nout, _ = shapes[-1]  # one piece: the problem reads "<m> x <n> (m x n)"
    x, w = rand(m, k, gen), rand(nout, k, gen, 0.1)
    want, _ = all_gather_gemm_reference(x, w, group=tp.group)

    def recorded() -> list[dict[str, object]]:
        return [c for c in gemm.waiting_kernel_choices() if f"{m} x {nout} (m x n)" in c["problem"]]

    # Autotuning off: the untuned rule, recorded as such; on again: the next call tunes.
    previous = gemm.set_autotune_config(gemm.AutotuneConfig(enabled=False))
    try:
        close(ops[-1](x, w), want, "the untuned kernel")
    finally:
        gemm.set_autotune_config(previous)
    if cuda:
        (c,) = recorded()
        assert not c["tuned"] and c["note"] == "autotuning is disabled", c
        assert c["kernel"] == "64x128 ping-pong", c  # the rule: at most 256 rows a shard
    close(ops[-1](x, w), want, "the measured kernel")
    choices = gemm.waiting_kernel_choices()
    if cuda:
        ran = recorded()
        assert len(ran) == 1, ran
        c = ran[0]
        assert c["tuned"], c
        assert c["kernel"] in names and c["candidates"] == list(names), c
        assert len(c["all_ms"]) == len(names) and min(t for t in c["all_ms"] if t >= 0) > 0, c
        assert c["estimate_ms"] >= min(t for t in c["all_ms"] if t >= 0), c
    else:
        assert choices == [], choices  # the host never chooses a kernel
    for ag in ops:
        ag.destroy()


def negative(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    """What the waiting kernel cannot run raises before any communication; the op stays
    usable."""
    n, m, k, nout = tp.size, 8, 32, 16
    raises = _worker.expect_raises
    raises(
        InvalidArgumentError,
        "set pull_shards=True",
        lambda: AllGatherGemm(comm, n * m, k, torch.bfloat16, fused_gemm=True),
    )
    ag = AllGatherGemm(comm, n * m, k, torch.bfloat16, pull_shards=True, fused_gemm=True)
    x, w = rand(m, k, gen), rand(nout, k, gen)
    bias = rand(1, nout, gen).view(-1)
    raises(UnsupportedHardwareError, "no beta, bias or GELU", lambda: ag(x, w, bias=bias))
    raises(UnsupportedHardwareError, "no beta, bias or GELU", lambda: ag(x, w, gelu=True))
    raises(
        UnsupportedHardwareError,
        "bfloat16 into bfloat16 only",
        lambda: ag(x, w, out_dtype=torch.float32),
    )
    raises(
        UnsupportedHardwareError,
        "weight_layout='nk'",
        lambda: ag(x, w.t().contiguous(), weight_layout="kn"),
    )
    assert not comm.failed
    want, _ = all_gather_gemm_reference(x, w, group=tp.group)
    close(ag(x, w), want, "fused ag_gemm after rejected calls")
    ag.destroy()
    f32 = AllGatherGemm(comm, n * m, k, torch.float32, pull_shards=True, fused_gemm=True)
    xf, wf = x.float(), w.float()
    raises(UnsupportedHardwareError, "bfloat16 into bfloat16 only", lambda: f32(xf, wf))
    f32.destroy()
    e4m3 = torch.float8_e4m3fn
    q = AllGatherGemm(comm, n * m, k, e4m3, pull_shards=True, fused_gemm=True)
    xq, wq = _worker.per_tensor_fp8(x, 8.0), _worker.per_tensor_fp8(w, 64.0)
    raises(UnsupportedHardwareError, "bfloat16 into bfloat16 only", lambda: q(xq, wq))
    q.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, launch, DEVICE, tp = _worker.setup(sys.argv)
    gen = torch.Generator().manual_seed(97 + launch.rank)
    comm = Communicator(tp, transport, timeout_s=30)
    {"correctness": correctness, "negative": negative, "kernels": kernels}[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

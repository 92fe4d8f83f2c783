"""CUDA graphs that capture communication ops (NOTE [graph capture] in graph_log.h).

Usage: graphs_worker.py <scenario> <tp_size> cuda
Scenarios:
  replay   several ops (AG+GEMM bf16, FP8 and fused, GEMM+RS, a buffer all-gather and
           reduce-scatter) captured once and replayed with fresh inputs, eager ops in between,
           a deliberately slow rank before some replays: every result matches its reference.
  refused  ops captured with plain torch.cuda.graph are refused with a typed error that
           points at overlap.comm.CudaGraph, and the buffers stay usable; replay before capture
           and after a buffer was destroyed raise StateError.
"""

from __future__ import annotations

import sys

import _worker
import torch

from overlap._native import native
from overlap.comm import Communicator, CudaGraph, TorchBootstrap
from overlap.errors import StateError, UnsupportedHardwareError
from overlap.ops import (
    AllGatherBesideGemm,
    AllGatherGemm,
    GemmReduceScatter,
    ReduceScatterBesideGemm,
    all_gather_beside_gemm_reference,
    all_gather_gemm_reference,
    all_gather_rows,
    gemm_reduce_scatter_reference,
    reduce_scatter_beside_gemm_reference,
)

E4M3 = torch.float8_e4m3fn
fp8 = _worker.per_tensor_fp8
DEVICE = torch.device("cpu")


def rand(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(DEVICE)


def close(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-2) -> None:
    g, w = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item()
    assert err <= tol, f"{what}: relative error {err} > {tol}"


class Ops:
    """The ops under test with static inputs (a graph reads and writes fixed addresses)."""

    def __init__(self, comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
        n = tp.size
        self.n, self.m, self.k, self.nout = n, 136, 256, 192  # m not a multiple of 128
        m, k, nout = self.m, self.k, self.nout
        self.ag = AllGatherGemm(comm, n * m, k, torch.bfloat16, compute_lanes=2)
        # Pulls (a captured handshake runs as memory operations, NOTE [handshakes]), FP8:
        # the scale_invs travel as the handshake's words; 3 pulls per peer.
        self.ag8 = AllGatherGemm(comm, n * m, k, E4M3, pieces=3, pull_shards=True)
        # The fused AG+GEMM (NOTE [fused ag_gemm]): its waiting GEMM eagerly, the chunked pulls
        # when captured; both beside each other's local flags. Builds without the kernel skip it.
        self.agf = (
            AllGatherGemm(comm, n * m, k, torch.bfloat16, pull_shards=True, fused_gemm=True)
            if native().gemm.waiting_gemm_built()
            else None
        )
        self.rs = GemmReduceScatter(comm, n * m, nout, torch.bfloat16, compute_lanes=2, pieces=2)
        # The ring with pulls: a handshake in begin_op, then one flag per piece.
        self.ring = GemmReduceScatter(
            comm, n * m, nout, torch.bfloat16, compute_lanes=2, method="ring", pull_shards=True
        )
        # Bulk ops beside side GEMMs: a signal lane's event edges (NOTE [bulk signal lane]),
        # reduce-scatter pieces sent peer-major (NOTE [bulk_rs pieces]).
        self.bag = AllGatherBesideGemm(comm, n * m, k, torch.bfloat16)
        self.brs = ReduceScatterBesideGemm(comm, n * m, k, torch.bfloat16, pieces=2)
        self.sa, self.sb = rand(160, 96, gen=gen), rand(96, 128, gen=gen, scale=0.1)
        self.bag_out = torch.empty(160, 128, dtype=torch.bfloat16, device=DEVICE)
        self.brs_out = torch.empty(m, k, dtype=torch.bfloat16, device=DEVICE)
        self.brs_gemm_out = torch.empty(160, 128, dtype=torch.bfloat16, device=DEVICE)
        self.buf = comm.create_buffer(n * m * k * 2, "graphs-collectives")
        self.x = rand(m, k, gen=gen)
        self.x8 = fp8(rand(m, k, gen=gen), 8.0 * (1 + tp.rank))
        self.y = rand(n * m, k, gen=gen)
        self.w = rand(nout, k, gen=gen, scale=0.1)
        self.w8 = fp8(rand(nout, k, gen=gen, scale=0.1), 64.0)
        self.z = rand(n * m, nout, gen=gen)
        self.gather_out = torch.empty(n * m, k, dtype=torch.bfloat16, device=DEVICE)
        self.rs_out = torch.empty(m, nout, dtype=torch.bfloat16, device=DEVICE)
        self.ring_out = torch.empty(m, nout, dtype=torch.bfloat16, device=DEVICE)

    def run(self) -> dict[str, torch.Tensor]:
        """Every op once (eagerly or into a capture)."""
        return {
            "ag": self.ag(self.x, self.w),
            "ag8": self.ag8(self.x8, self.w8),
            **({"agf": self.agf(self.x, self.w)} if self.agf is not None else {}),
            "rs": self.rs(self.y, self.w),
            "ring": self.ring(self.y, self.w, out=self.ring_out),
            "bulk_ag": self.bag(self.x, self.sa, self.sb, out=self.bag_out),
            "bulk_rs": self.brs(
                self.y, self.sa, self.sb, out=self.brs_out, gemm_out=self.brs_gemm_out
            )[0],
            "all_gather": self.buf.all_gather(self.x, self.gather_out),
            "reduce_scatter": self.buf.reduce_scatter(self.z, self.rs_out),
        }

    def refill(self, gen: torch.Generator) -> None:
        self.x.copy_(rand(self.m, self.k, gen=gen))
        self.x8.rowwise_data.copy_(fp8(rand(self.m, self.k, gen=gen), 1.0).rowwise_data)
        self.y.copy_(rand(self.n * self.m, self.k, gen=gen))
        self.z.copy_(rand(self.n * self.m, self.nout, gen=gen))

    def check(self, got: dict[str, torch.Tensor], tp: TorchBootstrap, what: str) -> None:
        g = tp.group
        want_ag = all_gather_gemm_reference(self.x, self.w, group=g)[0]
        close(got["ag"], want_ag, f"{what} ag")
        if self.agf is not None:
            close(got["agf"], want_ag, f"{what} ag fused")
        want8, _ = all_gather_gemm_reference(self.x8, self.w8, group=g)
        close(got["ag8"], want8, f"{what} ag fp8", 2e-2)
        assert torch.equal(
            self.ag8.gathered_scale_invs(), all_gather_rows(self.x8.rowwise_scale_inv.reshape(1), g)
        ), what
        want_rs = gemm_reduce_scatter_reference(self.y, self.w, group=g)
        close(got["rs"], want_rs, f"{what} rs")
        close(got["ring"], want_rs, f"{what} ring (pulls)", 2e-2)
        gathered, want_side = all_gather_beside_gemm_reference(self.x, self.sa, self.sb, group=g)
        close(got["bulk_ag"], want_side, f"{what} bulk_ag GEMM")
        assert torch.equal(self.bag.gathered_input(), gathered), f"{what} bulk_ag gathered"
        want_brs, _ = reduce_scatter_beside_gemm_reference(self.y, self.sa, self.sb, group=g)
        assert torch.equal(got["bulk_rs"], want_brs), f"{what} bulk_rs"
        close(self.brs_gemm_out, want_side, f"{what} bulk_rs GEMM")
        assert torch.equal(got["all_gather"], all_gather_rows(self.x, g)), f"{what} all_gather"
        want = self.z.float()
        torch.distributed.all_reduce(want, group=g)
        mine = want.view(tp.size, -1, self.nout)[tp.rank]
        close(got["reduce_scatter"], mine, f"{what} reduce_scatter")

    def destroy(self) -> None:
        for op in (self.ag, self.ag8, self.rs, self.ring, self.bag, self.brs, self.buf):
            op.destroy()
        if self.agf is not None:
            self.agf.destroy()


def replay(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    ops = Ops(comm, tp, gen)
    ops.check(ops.run(), tp, "eager warm-up")
    graph = CudaGraph()
    with graph.capture():
        captured = ops.run()
    # Epochs: one per collective and bulk all-gather, kPieceEpochs (5) per AG+GEMM, GEMM+RS
    # and bulk reduce-scatter (NOTE [ag_gemm pieces]), 4 (n - 1) made odd per ring GEMM+RS
    # (NOTE [ring sub-epochs]); all_gather's copy-out is not an op.
    ring = 4 * (tp.size - 1) + 1 - (4 * (tp.size - 1)) % 2
    five_epoch_ops = 4 if ops.agf is None else 5  # + the fused AG+GEMM, captured as pulls
    assert graph.ops == 3 + five_epoch_ops * 5 + ring, graph.ops
    slow = tp.size - 1
    for i in range(4):
        ops.refill(gen)
        if i % 2 and tp.rank == slow:
            torch.cuda._sleep(int(0.05 * 1.5e9))  # invariant 8 across replays
        graph.replay()
        ops.check(captured, tp, f"replay {i}")
        if i == 1:  # eager ops between replays keep the epochs in step
            ops.refill(gen)
            ops.check(ops.run(), tp, "eager between replays")
    torch.cuda.synchronize()
    comm.synchronize()
    ops.destroy()
    _worker.expect_raises(StateError, "destroyed", graph.replay)


def refused(comm: Communicator, tp: TorchBootstrap, gen: torch.Generator) -> None:
    ops = Ops(comm, tp, gen)
    ops.check(ops.run(), tp, "eager")
    plain = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(plain):
            ops.ag(ops.x, ops.w)
    except UnsupportedHardwareError as exc:
        assert "overlap.CudaGraph" in str(exc) or "CudaGraph" in str(exc), str(exc)
    else:
        raise AssertionError("a plain torch.cuda.graph capture of an overlap op was accepted")
    _worker.expect_raises(StateError, "before capture", CudaGraph().replay)
    ops.refill(gen)
    ops.check(ops.run(), tp, "eager after the refused capture")
    ops.destroy()


def main() -> None:
    global DEVICE
    scenario, transport, launch, DEVICE, tp = _worker.setup(sys.argv)
    assert transport == "cuda", "CUDA graphs need the cuda transport"
    gen = torch.Generator().manual_seed(99 + launch.rank)
    comm = Communicator(tp, transport, timeout_s=30)
    {"replay": replay, "refused": refused}[scenario](comm, tp, gen)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

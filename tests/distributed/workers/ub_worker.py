"""initialize_ub on a real TP group: the ops of the standard GEMM names against their
references (plain collective + plain GEMM), buffer accounting equal on every rank, destroy.

Usage: ub_worker.py <scenario> <tp_size> [host|cuda]
Scenarios: process_group (the TP group as a torch ProcessGroup), bootstrap (as the
overlap.comm.Bootstrap of tp_subgroup), device_mesh (the "tp" dimension of a 2-D DeviceMesh),
mpi4py (as an mpi4py communicator).
"""

from __future__ import annotations

import sys

import _worker
import torch

from overlap import destroy_ub, get_ub, initialize_ub
from overlap.errors import ConfigError, InvalidArgumentError, StaleBufferError, StateError
from overlap.ops import RsMethod, all_gather_gemm_reference, gemm_reduce_scatter_reference
from overlap.ops.bulk import bulk_rs_defaults
from overlap.ub import GEMM_NAMES, UbConfig, Userbuffers
from overlap.ub.handle import plan_buffer

TOKENS_PER_RANK, HIDDEN, QKV_OUT, FFN = 6, 16, 24, 32  # tiny: CI has 2 cores


def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-exact on the host; within bf16 tolerance on cuda (chunked GEMMs may differ)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    g, w = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    if got.device.type == "cpu":
        assert torch.equal(g, w), f"{what}: max |diff| {(g - w).abs().max()}"
    else:
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2, msg=what)


def main() -> None:
    s = _worker.setup(sys.argv)
    tp, device = s.tp, s.device
    mesh_dim = None
    if s.scenario == "process_group":
        group: object = tp.group
    elif s.scenario == "bootstrap":
        group = tp
    elif s.scenario == "device_mesh":
        from torch.distributed.device_mesh import init_device_mesh

        # A mesh of gloo groups on both transports: it only carries the rendezvous bytes.
        dims = (s.launch.world_size // tp.size, tp.size)
        mesh = init_device_mesh("cpu", dims, mesh_dim_names=("dp", "tp"))
        _worker.expect_raises(
            ConfigError,
            "needs mesh_dim=",
            lambda: initialize_ub((8 * tp.size, 8), mesh, transport=s.transport, register=False),
        )
        group, mesh_dim = mesh, "tp"
    elif s.scenario == "mpi4py":
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        group = world.Split(world.Get_rank() // tp.size, world.Get_rank())
    else:
        raise ValueError(f"unknown scenario {s.scenario}")
    tokens = TOKENS_PER_RANK * tp.size
    _worker.expect_raises(
        ConfigError,
        f"not divisible by the TP size {tp.size}",
        lambda: initialize_ub(
            (tokens + 1, HIDDEN), group, transport=s.transport, mesh_dim=mesh_dim, register=False
        ),
    )
    # A UbConfig made for any TP size: the bulk reduce-scatter gets this group's defaults.
    any_tp = initialize_ub(
        (tokens, HIDDEN),
        group,
        ub_cfgs=UbConfig(tokens, HIDDEN),
        transport=s.transport,
        mesh_dim=mesh_dim,
        register=False,
    )
    wgrad = any_tp.get("qkv_wgrad")
    assert (wgrad.gemm_sm_margin, wgrad.pieces) == bulk_rs_defaults(tp.size), wgrad.pieces
    assert f"pieces={wgrad.pieces} " in any_tp.describe()
    any_tp.destroy()
    ub = initialize_ub(
        (tokens, HIDDEN), group, torch.bfloat16, transport=s.transport, mesh_dim=mesh_dim
    )
    assert isinstance(ub, Userbuffers) and ub.tp == tp.size
    # NOTE [ub tp 2]: at TP 2 proj/fc2 fprop default to the ring with pulls.
    rs_method = RsMethod.RING if tp.size == 2 else RsMethod.PIPELINED
    for name in ("proj_fprop", "fc2_fprop"):
        op = ub.get(name)
        assert op.method is rs_method and op.pull_shards == (tp.size == 2), (name, op.method)

    def close_rs(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        if rs_method is RsMethod.RING:  # its own rounding (NOTE [gemm_rs_ring numerics])
            _worker.close_ring(got, want, what, tp.size, 2.0**-8, cuda=device.type == "cuda")
        else:
            close(got, want, what)

    totals = {int(b) for b in tp.allgather_bytes(str(ub.total_bytes).encode())}
    assert totals == {ub.total_bytes} and ub.total_bytes > 0, totals
    # total_bytes counts what is allocated: cuda regions are whole 2 MiB (NOTE [allocation
    # granularity]), host ones exactly the size asked for.
    granule = 2 << 20 if device.type == "cuda" else 1
    root = ub.buffer
    assert root is not None and root.allocated_bytes % granule == 0, root.allocated_bytes
    assert root.nbytes <= root.allocated_bytes < root.nbytes + granule, root.allocated_bytes
    assert ub.total_bytes == root.allocated_bytes
    # NOTE [userbuffer memory]: every op runs on a window of the one buffer, planned without a
    # communicator as allocated here, within 2 * T * H * 2 bytes.
    windows = {id(b): b for b in (ub.get(n).buffer for n in GEMM_NAMES if ub.is_overlapped(n))}
    assert all(w.root is root and w.allocated_bytes == 0 for w in windows.values())
    assert root.nbytes == plan_buffer(ub.config, tp.size)[1] <= ub.bound_bytes
    gen = torch.Generator().manual_seed(1234 + tp.rank)  # rank-specific activations
    shared = torch.Generator().manual_seed(99)  # weights equal on every rank

    def rand(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g).to(torch.bfloat16).to(device)

    w_qkv = rand(QKV_OUT, HIDDEN, shared) * 0.1  # [3H / tp, H]: this rank's column shard
    w_fc2 = rand(HIDDEN, FFN, shared) * 0.1  # [H, ffn / tp]: this rank's row shard
    for trial in range(3):  # consecutive calls on the shared buffers
        for rows in (TOKENS_PER_RANK, TOKENS_PER_RANK - 1):
            x = rand(rows, HIDDEN, gen)
            got = get_ub("qkv_fprop")(x, w_qkv)
            want, _ = all_gather_gemm_reference(x, w_qkv, group=tp.group)
            close(got, want, f"qkv_fprop trial {trial} rows {rows}")
            y = rand(rows * tp.size, FFN, gen)
            got = get_ub("fc2_fprop")(y, w_fc2)
            close_rs(got, gemm_reduce_scatter_reference(y, w_fc2, group=tp.group), "fc2_fprop")
            z = rand(rows * tp.size, HIDDEN, gen)
            w_proj = rand(HIDDEN, HIDDEN, shared) * 0.1
            got = ub.get("proj_fprop")(z, w_proj)
            close_rs(got, gemm_reduce_scatter_reference(z, w_proj, group=tp.group), "proj_fprop")
    # Beyond the configured tokens: rejected on every rank before any communication.
    too_many = rand(TOKENS_PER_RANK + 1, HIDDEN, gen)
    _worker.expect_raises(
        InvalidArgumentError, "tp * m <=", lambda: get_ub("qkv_fprop")(too_many, w_qkv)
    )
    big = rand(tokens + tp.size, HIDDEN, gen)
    _worker.expect_raises(
        InvalidArgumentError, "max_tokens", lambda: get_ub("proj_fprop")(big, w_proj)
    )
    x = rand(TOKENS_PER_RANK, HIDDEN, gen)  # still usable
    want, _ = all_gather_gemm_reference(x, w_qkv, group=tp.group)
    close(get_ub("qkv_fprop")(x, w_qkv), want, "qkv_fprop after rejected calls")
    # Shared bytes across kinds (NOTE [userbuffer memory]): a gathered input kept past a
    # GEMM+RS, whose peers pushed into or pulled from the same bytes, raises on every rank.
    got = get_ub("qkv_fprop")(x, w_qkv, keep_gathered=True)
    want, x_full = all_gather_gemm_reference(x, w_qkv, group=tp.group)
    close(got, want, "qkv_fprop keeping the gathered input")
    close(get_ub("qkv_fprop").gathered_input(), x_full, "the kept gathered input")
    z = rand(TOKENS_PER_RANK * tp.size, HIDDEN, gen)
    close_rs(
        ub.get("proj_fprop")(z, w_proj),
        gemm_reduce_scatter_reference(z, w_proj, group=tp.group),
        "proj_fprop after a kept gather",
    )
    _worker.expect_raises(
        StaleBufferError, "overwritten since", lambda: get_ub("qkv_fprop").gathered_input()
    )
    if s.transport == "cuda":
        ub.comm.synchronize()
    tp.barrier()
    destroy_ub()
    destroy_ub()
    assert ub.destroyed
    _worker.expect_raises(StateError, "initialize_ub", lambda: get_ub("qkv_fprop"))


if __name__ == "__main__":
    _worker.run(main)

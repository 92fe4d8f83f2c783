"""Worker (run under mpirun): the baseline collectives our userbuffers must beat.

On GPUs: NCCL all-gather and reduce-scatter bus bandwidth for 8-256 MB next to overlap's
cuda-transport all-gather (the data by copy engines, no SM; two one-block handshake kernels)
and reduce-scatter (docs/design.md §6 target: ours >= 95% of NCCL), plus the amax kernel's
bandwidth. On the host transport: gloo all-gather next to overlap's own host-transport
all-gather and reduce-scatter, and the bootstrap's allgather latency.

Times are GPU times (a spin kernel queues each timed call behind the start event, so the
host's enqueueing is not counted; benchmarks/common.py), for NCCL and for us alike; our
all-gather is also timed with the host's enqueueing included (``ours_allgather_e2e_ms``).
overlap's collectives are timed the way the overlap ops use them: the all-gather leaves its
result in the symmetric buffer (read through a view), and the reduce-scatter's input is
already in the buffer (where a GEMM writes its partial sums); both are complete ops,
including the acknowledgement handshake that makes buffer reuse safe.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common import device_barrier, format_table, max_over_ranks, time_op, write_json
from overlap.comm import Communicator, TorchBootstrap, TransportKind
from overlap.info import summary
from overlap.launch import init_torch_distributed
from overlap.quantization import amax

MB = 1 << 20


def bench_collectives(sizes_mb: list[int], cuda: bool, iters: int) -> list[dict]:
    world = dist.get_world_size()
    comm = Communicator(TorchBootstrap(), TransportKind.CUDA if cuda else TransportKind.HOST)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    align = device_barrier() if cuda else None  # time_op(queued=True, align=...)
    rows = []
    for size_mb in sizes_mb:
        total = size_mb * MB  # bytes of the gathered output / of the reduce-scatter input
        shard = torch.randn(total // 2 // world, dtype=torch.bfloat16, device=device)
        full = torch.empty(shard.numel() * world, dtype=torch.bfloat16, device=device)
        if cuda:
            ag = time_op(
                lambda f=full, s=shard: dist.all_gather_into_tensor(f, s),
                cuda=True,
                iters=iters,
                queued=True,
                align=align,
            )
            rs = time_op(
                lambda f=full, s=shard: dist.reduce_scatter_tensor(s, f),
                cuda=True,
                iters=iters,
                queued=True,
                align=align,
            )
        else:
            parts = list(full.chunk(world))
            ag = time_op(lambda p=parts, s=shard: dist.all_gather(p, s), cuda=False, iters=iters)
            rs = None  # gloo has no reduce-scatter
        buf = comm.create_buffer(full.nbytes)
        in_buffer = buf.view(torch.bfloat16, full.shape)
        in_buffer.copy_(torch.randn(full.shape, device=device).to(torch.bfloat16))

        def time_ag(queued: bool = cuda, s: torch.Tensor = shard, b=buf) -> float:
            """Our in-buffer all-gather of ``s`` in b's current mode, max over ranks."""
            return max_over_ranks(
                time_op(
                    lambda: b.all_gather_into([(s, 0)]),
                    cuda=cuda,
                    iters=iters,
                    queued=queued,
                    align=align,
                )
            )

        # NOTE [put split] / [pull gather] / [sm puts]: the all-gather by pushes and by pulls
        # at 1, 2 and 4 copy-engine lanes per peer (no SM), and with a share of the bytes moved
        # by SM copy kernels. The best copy-engine-only time is the headline (it is what the
        # overlap ops use); the best with SMs is reported beside it.
        # NOTE [serial puts]: suffix "s", the peers one after another on one set of lanes.
        by_split = {}
        for mode in ("push", "pull") if cuda else ("push",):
            for split in (1, 2, 4) if cuda else (1,):
                for serial in (False, True):
                    buf.put_split = split
                    buf.pull_gather = mode == "pull"
                    buf.serial_puts = serial
                    by_split[f"{mode}{split}{'s' if serial else ''}"] = time_ag()
        buf.serial_puts = True  # the default
        by_sm = {}
        for percent, blocks in ((50, 8), (50, 16), (70, 16), (100, 16), (100, 32)) if cuda else ():
            buf.put_split, buf.pull_gather, buf.sm_share = 2, False, (percent, blocks)
            by_sm[f"sm{percent}%x{blocks}"] = time_ag()
        buf.sm_share = (0, 0)
        # The same op timed with the host's enqueueing included (the start event recorded on
        # an idle GPU): what a host-bound caller would see.
        buf.put_split, buf.pull_gather = 1, False
        ours_ag_e2e = time_ag(queued=False)
        best_split = min(by_split, key=by_split.get)
        ours_ag = by_split[best_split]
        ours_rs = time_op(
            lambda f=in_buffer, s=shard, b=buf: b.reduce_scatter(f, s),
            cuda=cuda,
            iters=iters,
            queued=cuda,
            align=align,
        )
        buf.synchronize()
        del in_buffer
        buf.destroy()
        ag = max_over_ranks(ag)
        rs = max_over_ranks(rs) if rs is not None else None
        ours_rs = max_over_ranks(ours_rs)
        factor = (world - 1) / world * total / 1e9  # bus bytes in GB
        row = {
            "size_mb": size_mb,
            "allgather_ms": ag,
            "allgather_busbw_gbps": factor / (ag / 1e3),
            "reducescatter_ms": rs,
            "reducescatter_busbw_gbps": factor / (rs / 1e3) if rs else None,
            "ours_allgather_ms": ours_ag,
            "ours_allgather_ms_by_split": by_split,
            "ours_allgather_best_split": best_split,
            "ours_allgather_ms_with_sms": by_sm,
            "ours_allgather_e2e_ms": ours_ag_e2e,
            "ours_allgather_sm_best": min(by_sm, key=by_sm.get) if by_sm else None,
            "ours_vs_lib_allgather_with_sms": ag / min(by_sm.values()) if by_sm else None,
            "ours_allgather_busbw_gbps": factor / (ours_ag / 1e3),
            "ours_reducescatter_ms": ours_rs,
            "ours_reducescatter_busbw_gbps": factor / (ours_rs / 1e3),
        }
        row["ours_vs_lib_allgather"] = ag / ours_ag
        row["ours_vs_lib_reducescatter"] = rs / ours_rs if rs else None
        rows.append(row)
    comm.destroy()
    return rows


def bench_amax(cuda: bool, iters: int) -> list[dict]:
    device = "cuda" if cuda else "cpu"
    rows = []
    for numel in (1 << 24, 1 << 28) if cuda else (1 << 20,):
        x = torch.randn(numel, dtype=torch.bfloat16, device=device)
        out = torch.empty(1, device=device)
        ms = time_op(lambda x=x, out=out: amax(x, out), cuda=cuda, iters=iters, queued=cuda)
        rows.append({"numel": numel, "ms": ms, "read_gbps": x.nbytes / 1e9 / (ms / 1e3)})
    return rows


def bench_bootstrap(iters: int) -> dict:
    boot = TorchBootstrap()
    payload = bytes(64)
    ms = time_op(lambda: boot.allgather_bytes(payload), cuda=False, iters=iters)
    return {"payload_bytes": len(payload), "allgather_ms": max_over_ranks(ms)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    launch = init_torch_distributed("nccl" if args.cuda else "gloo")
    iters = 20
    sizes = [8, 32, 128, 256] if args.cuda else ([1, 8, 32] if args.full else [1, 8])
    t0 = time.time()
    result = {
        "benchmark": "baseline_collectives",
        "transport": "cuda" if args.cuda else "host",
        "world_size": launch.world_size,
        "host": platform.node(),
        "overlap_build": summary(),
        "gpu": torch.cuda.get_device_name() if args.cuda else None,
        "collectives": bench_collectives(sizes, args.cuda, iters),
        "bootstrap": bench_bootstrap(iters),
        "amax": bench_amax(args.cuda, iters) if launch.rank == 0 else None,
    }
    dist.barrier()
    dist.destroy_process_group()
    if launch.rank != 0:
        return
    result["seconds"] = time.time() - t0
    write_json(args.out / "baseline_collectives.json", result)
    lib = "NCCL" if args.cuda else "gloo"
    print(
        f"\n{lib} collectives, {launch.world_size} ranks (bf16, median of {iters}, max over ranks)"
    )
    print(
        format_table(
            result["collectives"],
            [
                ("size_mb", "MB"),
                ("allgather_ms", "AG ms"),
                ("allgather_busbw_gbps", "AG busbw GB/s"),
                ("reducescatter_ms", "RS ms"),
                ("reducescatter_busbw_gbps", "RS busbw GB/s"),
            ],
        )
    )
    transport = "cuda" if args.cuda else "host"
    print(
        f"\noverlap {transport}-transport collectives, {launch.world_size} ranks "
        f"(in-buffer; ratio = {lib} time / ours, >= 0.95 is the target)"
    )
    print(
        format_table(
            result["collectives"],
            [
                ("size_mb", "MB"),
                ("ours_allgather_ms", "AG ms"),
                ("ours_allgather_busbw_gbps", "AG busbw GB/s"),
                ("ours_vs_lib_allgather", "AG ratio"),
                ("ours_allgather_best_split", "mode"),
                ("ours_vs_lib_allgather_with_sms", "AG ratio w/ SMs"),
                ("ours_allgather_sm_best", "SM mode"),
                ("ours_allgather_e2e_ms", "AG e2e ms"),
                ("ours_reducescatter_ms", "RS ms"),
                ("ours_reducescatter_busbw_gbps", "RS busbw GB/s"),
                ("ours_vs_lib_reducescatter", "RS ratio"),
            ],
        )
    )
    print(f"\nbootstrap allgather of 64 B: {result['bootstrap']['allgather_ms']:.3f} ms")
    print("\namax kernel (rank 0)")
    print(
        format_table(
            result["amax"], [("numel", "elements"), ("ms", "ms"), ("read_gbps", "read GB/s")]
        )
    )


if __name__ == "__main__":
    main()

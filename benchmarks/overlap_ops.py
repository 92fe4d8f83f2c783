"""Worker (run under mpirun): the comm-GEMM overlap ops against their floor (DESIGN.md §6).

Per op x shape x dtype, in one run on the same devices (median of ``--iters`` timed runs after
warm-up, CUDA events on GPUs / wall clock on the host transport, max over ranks):

* ``T_gemm``: the best of the whole GEMM and the ``tp`` chunked GEMMs, no communication;
* ``T_comm``: the library collective alone (NCCL on GPUs, gloo on the host);
* ``T_seq``: the collective, then the GEMM (:mod:`overlap.ops.reference`);
* ``T_ours``: :class:`~overlap.ops.AllGatherGemm` / :class:`~overlap.ops.GemmReduceScatter`,
  the best over compute lanes (1, 2), copies per peer (put_split 1, 2) and, for AG+GEMM,
  pushes at once or staggered; every variant is in the JSON;
* torch's async-TP (``torch.ops.symm_mem.fused_*``), or "n/a" where it fails;
* ``T_ours / floor`` with ``floor = max(T_gemm, T_comm)`` and the overlap efficiency
  ``1 - (T_ours - T_gemm) / (T_seq - T_gemm)``.

Quick default: DESIGN.md §6 shapes at M = 8192, TP = world size: fc1 and qkv (AG+GEMM), fc2
and proj (GEMM+RS), bf16 and fp8. ``--full`` adds M = 16384. Without ``--cuda``: the host
transport with tiny shapes (a CPU smoke run of the same code).

    python -m benchmarks.overlap_ops --launch 4 --cuda --out bench_results    # 4 GPUs
    python -m benchmarks.overlap_ops --launch 4 --out bench_results           # host transport

``--launch N`` starts N ranks under mpirun (overlap.launch.mpirun_command: the no-multicast
variables of DESIGN.md §7 included); without it, the script is the per-rank worker.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import format_table, max_over_ranks, plot_times, time_op, write_json
from overlap.comm import Communicator, TorchBootstrap, TransportKind
from overlap.gemm import gemm
from overlap.info import summary
from overlap.launch import init_torch_distributed, mpirun_command
from overlap.ops import (
    AllGatherGemm,
    GemmReduceScatter,
    all_gather_gemm_reference,
    all_gather_rows,
    gemm_reduce_scatter_reference,
)
from overlap.quantization import CurrentScalingConfig, QuantizedTensor, make_quantizer

HIDDEN, FFN, QKV = 8192, 28672, 10240  # Llama-3-70B-like (DESIGN.md §6)


def suite(tp: int, tokens: list[int], cuda: bool) -> list[dict[str, Any]]:
    """(op, name, M, K, N): AG+GEMM gives K = hidden and the local N; GEMM+RS the local K."""
    if not cuda:  # tiny CPU shapes: the host GEMM is a float64 reference
        return [
            {"op": "ag_gemm", "shape": "tiny", "M": 32 * tp, "K": 64, "N": 64},
            {"op": "gemm_rs", "shape": "tiny", "M": 32 * tp, "K": 64, "N": 64},
        ]
    rows = []
    for m in tokens:
        rows += [
            {"op": "ag_gemm", "shape": "fc1", "M": m, "K": HIDDEN, "N": 2 * FFN // tp},
            {"op": "ag_gemm", "shape": "qkv", "M": m, "K": HIDDEN, "N": QKV // tp},
            {"op": "gemm_rs", "shape": "fc2", "M": m, "K": FFN // tp, "N": HIDDEN},
            {"op": "gemm_rs", "shape": "proj", "M": m, "K": HIDDEN // tp, "N": HIDDEN},
        ]
    return rows


def operand(x: torch.Tensor, fp8: bool) -> torch.Tensor | QuantizedTensor:
    if not fp8:
        return x
    return make_quantizer(CurrentScalingConfig(), columnwise=False).quantize(x)


def data_of(x: torch.Tensor | QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(x, QuantizedTensor):
        return x.rowwise_data, x.rowwise_scale_inv
    return x, None


def best_gemm(a: torch.Tensor | QuantizedTensor, w, tp: int, timer) -> float:
    """min(whole GEMM, tp chunked GEMMs into one output)."""
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    out = torch.empty((ad.shape[0], wd.shape[0]), dtype=torch.bfloat16, device=ad.device)
    kw = {"transb": True, "a_scale_inv": asi, "b_scale_inv": wsi, "out": out}
    m = ad.shape[0] // tp

    def chunked() -> None:
        for j in range(tp):
            gemm(ad[j * m : (j + 1) * m], wd, row_offset=j * m, **kw)

    return min(timer(lambda: gemm(ad, wd, **kw)), timer(chunked))


def torch_async_tp(row: dict, a, w, group_name: str) -> Callable[[], object]:
    """torch's fused op for this row (the caller reports "n/a" when it raises)."""
    sm = torch.ops.symm_mem
    ad, asi = data_of(a)
    wd, wsi = data_of(w)
    fp8 = asi is not None
    if row["op"] == "ag_gemm":
        if fp8:
            return lambda: sm.fused_all_gather_scaled_matmul(
                ad, [wd.t()], asi, [wsi], 0, group_name, [None], [None], [torch.bfloat16], [True]
            )
        return lambda: sm.fused_all_gather_matmul(ad, [wd.t()], 0, group_name)
    if fp8:
        shape = [ad.shape[0], wd.shape[0]]
        return lambda: sm.fused_scaled_matmul_reduce_scatter(
            ad, wd.t(), asi, wsi, "sum", 0, 0, group_name, shape, None, None, torch.bfloat16, True
        )
    return lambda: sm.fused_matmul_reduce_scatter(ad, wd.t(), "sum", 0, group_name)


def bench_row(row: dict, fp8: bool, comm: Communicator, cuda: bool, iters: int) -> dict:
    tp = comm.group.size
    group = comm.group.group
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(1 + dist.get_rank())
    m_all, k, n = row["M"], row["K"], row["N"]

    def timer(fn: Callable[[], object]) -> float:
        return max_over_ranks(time_op(fn, cuda=cuda, warmup=3 if cuda else 1, iters=iters))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    out: dict[str, Any] = dict(row, dtype="fp8" if fp8 else "bf16", tp=tp)
    w = operand(randn(n, k) * 0.05, fp8)
    variants: dict[str, float] = {}
    if row["op"] == "ag_gemm":
        shard = operand(randn(m_all // tp, k), fp8)
        full = operand(randn(m_all, k), fp8)
        out["T_gemm"] = best_gemm(full, w, tp, timer)
        out["T_comm"] = timer(lambda: all_gather_rows(data_of(shard)[0], group))
        out["T_seq"] = timer(lambda: all_gather_gemm_reference(shard, w, group=group))
        y = torch.empty((m_all, n), dtype=torch.bfloat16, device=device)
        for lanes in (1, 2):
            op = AllGatherGemm(comm, m_all, k, data_of(shard)[0].dtype, compute_lanes=lanes)
            for split in (1, 2) if cuda else (1,):
                for staggered in (False, True):
                    op.buffer.put_split = split
                    op.staggered_puts = staggered
                    name = f"lanes{lanes}-split{split}" + ("-staggered" if staggered else "")
                    variants[name] = timer(lambda op=op: op(shard, w, out=y))
            op.destroy()
    else:
        x = operand(randn(m_all, k), fp8)
        out["T_gemm"] = best_gemm(x, w, tp, timer)
        partial = randn(m_all, n)
        shard_out = torch.empty((m_all // tp, n), dtype=torch.bfloat16, device=device)
        if cuda:
            out["T_comm"] = timer(
                lambda: dist.reduce_scatter_tensor(shard_out, partial, group=group)
            )
        else:  # gloo has no reduce-scatter: the all-gather the exact reference sums after
            out["T_comm"] = timer(lambda: all_gather_rows(partial.unsqueeze(0), group))
        out["T_seq"] = timer(
            lambda: gemm_reduce_scatter_reference(x, w, group=group, exact=not cuda)
        )
        for lanes in (1, 2):
            op = GemmReduceScatter(comm, m_all, n, torch.bfloat16, compute_lanes=lanes)
            for split in (1, 2) if cuda else (1,):
                op.buffer.put_split = split
                variants[f"lanes{lanes}-split{split}"] = timer(
                    lambda op=op: op(x, w, out=shard_out)
                )
            op.destroy()
    best = min(variants, key=variants.get)
    out["T_ours_by_variant"] = variants
    out["best_variant"] = best
    out["T_ours"] = variants[best]
    out["T_torch"] = "n/a"
    if cuda:
        try:
            fn = torch_async_tp(row, shard if row["op"] == "ag_gemm" else x, w, group.group_name)
            out["T_torch"] = timer(fn)
        except Exception as exc:  # any failure of torch's op is reported as n/a
            out["torch_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    floor = max(out["T_gemm"], out["T_comm"])
    out["floor"] = floor
    out["ours_over_floor"] = out["T_ours"] / floor
    gain = out["T_seq"] - out["T_gemm"]
    out["efficiency"] = 1 - (out["T_ours"] - out["T_gemm"]) / gain if gain > 0 else None
    return out


def enable_torch_symm_mem(group: Any) -> None:
    """Older torch needs this before its fused ops; newer torch deprecates it (no-op)."""
    import warnings

    try:
        from torch.distributed import _symmetric_memory as symm_mem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
    except Exception as exc:  # torch's async-TP is then reported as n/a
        print(f"[overlap_ops] torch symmetric memory unavailable: {exc}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--full", action="store_true", help="also M = 16384")
    parser.add_argument("--iters", type=int, default=None, help="default: 20 (cuda), 3 (host)")
    parser.add_argument("--dtypes", default="bf16,fp8")
    parser.add_argument("--launch", type=int, default=0, help="start N ranks under mpirun")
    args = parser.parse_args()
    if args.launch:
        argv = [a for i, a in enumerate(sys.argv[1:]) if not _is_launch_arg(sys.argv[1:], i)]
        cmd = mpirun_command(
            args.launch,
            [sys.executable, "-u", "-m", "benchmarks.overlap_ops", *argv],
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            tag_output=False,
        )
        sys.exit(subprocess.call(cmd, env=os.environ.copy()))
    args.iters = args.iters or (20 if args.cuda else 3)
    launch = init_torch_distributed("nccl" if args.cuda else "gloo")
    t0 = time.time()
    boot = TorchBootstrap()
    comm = Communicator(boot, TransportKind.CUDA if args.cuda else TransportKind.HOST)
    if args.cuda:
        enable_torch_symm_mem(boot.group)
    tokens = [8192, 16384] if args.full else [8192]
    rows = []
    for row in suite(boot.size, tokens, args.cuda):
        for dtype in args.dtypes.split(","):
            rows.append(bench_row(row, dtype == "fp8", comm, args.cuda, args.iters))
            if launch.rank == 0:
                r = rows[-1]
                print(
                    f"[overlap_ops] {r['op']} {r['shape']} M={r['M']} {r['dtype']}: ours "
                    f"{r['T_ours']:.3f} ms, floor {r['floor']:.3f} ms",
                    flush=True,
                )
    comm.destroy()
    dist.barrier()
    dist.destroy_process_group()
    if launch.rank != 0:
        return
    result = {
        "benchmark": "overlap_ops",
        "transport": "cuda" if args.cuda else "host",
        "world_size": launch.world_size,
        "host": platform.node(),
        "overlap_build": summary(),
        "gpu": torch.cuda.get_device_name() if args.cuda else None,
        "iters": args.iters,
        "rows": rows,
        "seconds": time.time() - t0,
    }
    write_json(args.out / "overlap_ops.json", result)
    print(
        f"\ncomm-GEMM overlap, TP = {launch.world_size}, ms (median of {args.iters}, max over "
        f"ranks); floor = max(T_gemm, T_comm); eff = 1 - (ours - gemm) / (seq - gemm)"
    )
    print(
        format_table(
            rows,
            [
                ("op", "op"),
                ("shape", "shape"),
                ("M", "M"),
                ("dtype", "dtype"),
                ("T_gemm", "T_gemm"),
                ("T_comm", "T_comm"),
                ("T_seq", "T_seq"),
                ("T_torch", "torch"),
                ("T_ours", "T_ours"),
                ("best_variant", "best"),
                ("ours_over_floor", "ours/floor"),
                ("efficiency", "eff"),
            ],
        )
    )
    plot = plot_times(
        rows,
        ("op", "shape", "dtype"),
        [("T_seq", "sequential (NCCL + GEMM)"), ("T_torch", "torch async-TP"), ("T_ours", "ours")],
        args.out / "overlap_ops.png",
        f"overlap ops, TP = {launch.world_size}: time / floor (dashed: the 1.10 target)",
    )
    print(f"\nJSON: {args.out / 'overlap_ops.json'} ({result['seconds']:.0f} s)")
    if plot is not None:
        print(f"plot: {plot}")


def _is_launch_arg(argv: list[str], i: int) -> bool:
    """``--launch N`` / ``--launch=N`` (the launcher's own option, not the workers')."""
    return argv[i].startswith("--launch") or (i > 0 and argv[i - 1] == "--launch")


if __name__ == "__main__":
    main()

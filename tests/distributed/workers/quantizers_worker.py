"""Sequence-parallel FP8 shards sharing one scale over the TP group (docs/design.md §3,
invariant 3).

Usage: quantizers_worker.py <tp_size>

Every rank quantizes its own shard with per-tensor scaling and the TP group as amax group
(given at the call: a raw torch ProcessGroup, the overlap Bootstrap, or an explicit adapter),
then all-gathers the FP8 bytes over a host-transport symmetric buffer. The gathered bytes and
the shared scale_inv must equal quantizing the whole gathered tensor; another TP group of the
same job must get its own scale.
"""

from __future__ import annotations

import pickle
import sys

import _worker
import torch
import torch.distributed as dist

from overlap.comm import Communicator, TorchBootstrap, tp_subgroup
from overlap.launch import init_torch_distributed
from overlap.quantization import (
    BlockScalingQuantizer,
    CurrentScalingQuantizer,
    DelayedScalingConfig,
    DelayedScalingQuantizer,
    HybridQuantizer,
    ProcessGroupAmaxReducer,
    QuantizedTensor,
)


def gather_hp(tp: TorchBootstrap, x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x, group=tp.group)
    return torch.cat([parts[g] for g in tp._order])


def check(comm: Communicator, tp: TorchBootstrap, world_rank: int, tp_size: int) -> None:
    group_id = world_rank // tp_size
    gen = torch.Generator().manual_seed(100 + world_rank)
    # Magnitudes differ by rank and by TP group: local scales would all differ.
    x = (torch.randn(48, 256, generator=gen) * 2.0 ** (2 * tp.rank + 5 * group_id)).bfloat16()
    whole = gather_hp(tp, x)
    buf = comm.create_buffer(1 << 20, "fp8-shards")
    makers = {
        "current": CurrentScalingQuantizer,
        "delayed": lambda: DelayedScalingQuantizer(DelayedScalingConfig(history_len=4)),
        "hybrid": lambda: HybridQuantizer(CurrentScalingQuantizer(), BlockScalingQuantizer()),
    }
    groups = {
        "process-group": tp.group,
        "bootstrap": tp,
        "adapter": ProcessGroupAmaxReducer(tp.group),
    }
    for name, make in makers.items():
        for gname, group in groups.items():
            q = make()
            reference = make()
            calls = 2 if name == "delayed" else 1  # delayed: prime the history first
            for _ in range(calls):
                t: QuantizedTensor = q.quantize(x, amax_group=group, columnwise=False)
                want = reference.quantize(whole, columnwise=False)
            pickle.dumps(q)  # the group was never stored on the quantizer
            gathered = buf.all_gather(t.rowwise_data.view(torch.uint8))
            assert torch.equal(gathered, want.rowwise_data.view(torch.uint8)), (
                f"{name}/{gname}: gathered FP8 shards differ from quantizing the whole tensor"
            )
            assert torch.equal(t.rowwise_scale_inv, want.rowwise_scale_inv), (name, gname)
            # Other TP groups (their own magnitudes) have other scales.
            everyone = [torch.empty(1) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, t.rowwise_scale_inv)
            for r, s in enumerate(everyone):
                same_group = r // tp_size == group_id
                assert torch.equal(s, t.rowwise_scale_inv) == same_group, (name, gname, r)
    buf.destroy()


def main() -> None:
    tp_size = int(sys.argv[1])
    launch = init_torch_distributed("gloo")
    tp = tp_subgroup(TorchBootstrap(), tp_size)
    comm = Communicator(tp, "host", timeout_s=30)
    check(comm, tp, launch.rank, tp_size)
    comm.destroy()


if __name__ == "__main__":
    _worker.run(main)

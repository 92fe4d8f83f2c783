"""Multi-rank: per-tensor FP8 shards of a TP group share one scale (docs/design.md §3,
invariant 3)."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers


@pytest.mark.mpi
@pytest.mark.parametrize(("nprocs", "tp"), [(2, 2), (4, 2)], ids=["np2-tp2", "np4-tp2"])
def test_sequence_parallel_shards_share_one_scale(nprocs: int, tp: int) -> None:
    run_workers("quantizers_worker.py", nprocs, [str(tp)])

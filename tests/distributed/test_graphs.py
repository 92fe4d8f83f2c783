"""Multi-rank: CUDA graphs capturing communication ops (cuda transport only)."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", ["replay", "refused"], ids=lambda s: s)
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cuda_graph_of_comm_ops(scenario: str, nprocs: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < nprocs:
        pytest.skip(f"needs {nprocs} GPUs, {gpu_count()} visible")
    run_workers("graphs_worker.py", nprocs, [scenario, str(nprocs), "cuda"])

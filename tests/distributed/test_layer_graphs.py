"""Multi-rank: graphed layers (overlap.layers.make_graphed_callables) against the same layers
run eagerly (workers/layer_graphs_worker.py has the scenarios). CUDA graphs need GPUs: the
cuda transport, one GPU per rank; tests/unit/test_layer_graphs.py checks the arguments on CPU.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

SCENARIOS = "equal,multi,fused,accumulate,guards"


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("nprocs", "tp"), [(2, 2), (4, 4), (4, 2)], ids=["np2-tp2", "np4-tp4", "np4-tp2"]
)
def test_cuda_graphed_layers(nprocs: int, tp: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < nprocs:
        pytest.skip(f"needs {nprocs} GPUs, {gpu_count()} visible")
    run_workers("layer_graphs_worker.py", nprocs, [SCENARIOS, str(tp), "cuda"], timeout_s=600)

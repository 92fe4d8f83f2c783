"""Multi-rank: buffer managers gather quantized shards with their scale_inv (docs/design.md §3,
invariants 1, 2, 3, 5), on both transports.

The host transport runs everywhere (CI); the cuda transport needs one GPU per rank.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

LAYOUTS = [(2, 2), (4, 4), (4, 2)]  # (ranks, TP size): (4, 2) is two TP groups of two
SCENARIOS = ["formats", "shared_consumers", "pipeline", "current_sp", "staleness", "negative"]


def _id(n: int, tp: int) -> str:
    return f"np{n}-tp{tp}"


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s)
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_buffers(scenario: str, nprocs: int, tp: int) -> None:
    run_workers("buffers_worker.py", nprocs, [scenario, str(tp), "host"])


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s)
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_cuda_buffers(scenario: str, nprocs: int, tp: int) -> None:
    _require_gpus(nprocs)
    run_workers("buffers_worker.py", nprocs, [scenario, str(tp), "cuda"])


def _require_gpus(n: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs, {gpu_count()} visible")

"""Multi-rank: the bulk overlap ops (a collective beside an unrelated GEMM) against their
references, on both transports.

The host transport runs everywhere (CI); the cuda transport needs one GPU per rank.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

LAYOUTS = [(2, 2), (4, 4), (4, 2)]  # (ranks, TP size): (4, 2) is two TP groups of two
SCENARIOS = ["correctness", "delayed", "negative", "plans"]


def _id(n: int, tp: int) -> str:
    return f"np{n}-tp{tp}"


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s)
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_bulk_ops(scenario: str, nprocs: int, tp: int) -> None:
    run_workers("bulk_worker.py", nprocs, [scenario, str(tp), "host"])


@pytest.mark.mpi
def test_host_bulk_op_mismatch_fails_the_communicator() -> None:
    run_workers("bulk_worker.py", 2, ["mismatch", "2", "host"])


@pytest.mark.mpi
def test_host_bulk_op_absent_rank_times_out() -> None:
    run_workers("bulk_worker.py", 2, ["timeout", "2", "host"])


# "backlog" (NOTE [monotone release]) is cuda-only: the host transport raises at its first
# wait, and it was the cuda watchdog's release that hung.
@pytest.mark.mpi
@pytest.mark.parametrize("scenario", [*SCENARIOS, "timeout", "backlog"], ids=lambda s: s)
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cuda_bulk_ops(scenario: str, nprocs: int) -> None:
    _require_gpus(nprocs)
    tp = nprocs if scenario not in ("timeout", "backlog") else 2
    run_workers("bulk_worker.py", nprocs, [scenario, str(tp), "cuda"])


@pytest.mark.mpi
def test_cuda_bulk_ops_in_two_tp_groups() -> None:
    _require_gpus(4)
    run_workers("bulk_worker.py", 4, ["correctness", "2", "cuda"])


def _require_gpus(n: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs, {gpu_count()} visible")

"""Multi-rank: initialize_ub / get_ub / destroy_ub on a real TP group, on both transports.

The host transport runs everywhere (CI); the cuda transport needs one GPU per rank.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

GROUPS = ["process_group", "bootstrap", "device_mesh", "mpi4py"]


@pytest.mark.mpi
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g)
def test_host_ub(group: str) -> None:
    run_workers("ub_worker.py", 2, [group, "2", "host"])


@pytest.mark.mpi
def test_host_ub_in_two_tp_groups() -> None:
    run_workers("ub_worker.py", 4, ["bootstrap", "2", "host"])


@pytest.mark.mpi
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g)
def test_cuda_ub(group: str) -> None:
    _require_gpus(2)
    run_workers("ub_worker.py", 2, [group, "2", "cuda"])


def _require_gpus(n: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs, {gpu_count()} visible")

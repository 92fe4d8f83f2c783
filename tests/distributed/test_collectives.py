"""Multi-rank: symmetric buffers and collectives on both transports (invariants 7 and 8).

The host transport runs everywhere (CI); the cuda transport needs one GPU per rank.
"""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

LAYOUTS = [(2, 2), (4, 4), (4, 2)]  # (ranks, TP size): (4, 2) is two TP groups of two


def _id(n: int, tp: int) -> str:
    return f"np{n}-tp{tp}"


SCENARIOS = ["correctness", "delayed", "negative", "views"]


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", [*SCENARIOS, "mismatch"], ids=lambda s: s)
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_collectives(scenario: str, nprocs: int, tp: int) -> None:
    run_workers("collectives_worker.py", nprocs, [scenario, str(tp), "host"])


@pytest.mark.mpi
def test_absent_rank_times_out_with_a_typed_error() -> None:
    run_workers("collectives_worker.py", 2, ["timeout", "2", "host"])


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("scenario", "nprocs", "tp"),
    [
        ("dtype_mismatch", 2, 2),  # what changes the bytes exchanged is in the op record
        ("out_of_step", 2, 2),  # NOTE [op sequence]: raised before any data moves
        ("alias", 2, 2),  # reduce_scatter in/out inside the buffer: refused before the op
        ("create_errors", 2, 2),  # sizes refused on every rank; shared memory reserved
    ],
    ids=str,
)
def test_host_fail_safe(scenario: str, nprocs: int, tp: int) -> None:
    run_workers("collectives_worker.py", nprocs, [scenario, str(tp), "host"])


@pytest.mark.mpi
@pytest.mark.slow
def test_create_destroy_cycles_leak_nothing() -> None:
    run_workers("collectives_worker.py", 2, ["lifecycle", "2", "host"])


# NOTE: the op-record check (op_protocol.cpp) is best effort on cuda, where hosts run ahead of
# their GPUs, so the "mismatch", "dtype_mismatch" and "out_of_step" scenarios are host-only.
@pytest.mark.mpi
@pytest.mark.parametrize(
    "scenario", [*SCENARIOS, "timeout", "lifecycle", "alias", "create_errors"], ids=lambda s: s
)
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cuda_collectives(scenario: str, nprocs: int) -> None:
    _require_gpus(nprocs)
    tp = nprocs if scenario not in ("timeout", "lifecycle", "create_errors") else 2
    run_workers("collectives_worker.py", nprocs, [scenario, str(tp), "cuda"])


@pytest.mark.mpi
def test_cuda_queued_work_is_not_a_timeout() -> None:
    """GPU work queued ahead of an op does not count against the op's deadline."""
    _require_gpus(2)
    run_workers("collectives_worker.py", 2, ["queued", "2", "cuda"])


@pytest.mark.mpi
def test_cuda_collectives_in_two_tp_groups() -> None:
    _require_gpus(4)
    run_workers("collectives_worker.py", 4, ["correctness", "2", "cuda"])


def _require_gpus(n: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < n:
        pytest.skip(f"needs {n} GPUs, {gpu_count()} visible")

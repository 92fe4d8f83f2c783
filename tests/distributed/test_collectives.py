"""Multi-rank: symmetric buffers and collectives on the host transport (invariants 7 and 8)."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

LAYOUTS = [(2, 2), (4, 4), (4, 2)]  # (ranks, TP size): (4, 2) is two TP groups of two


def _id(n: int, tp: int) -> str:
    return f"np{n}-tp{tp}"


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", ["correctness", "delayed", "negative"], ids=lambda s: s)
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_collectives(scenario: str, nprocs: int, tp: int) -> None:
    run_workers("collectives_worker.py", nprocs, [scenario, str(tp)])


@pytest.mark.mpi
def test_absent_rank_times_out_with_a_typed_error() -> None:
    run_workers("collectives_worker.py", 2, ["timeout", "2"])


@pytest.mark.mpi
@pytest.mark.slow
def test_create_destroy_cycles_leak_nothing() -> None:
    run_workers("collectives_worker.py", 2, ["lifecycle", "2"])

"""Multi-rank: the mpi4py and torch.distributed (gloo) bootstrap adapters."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

CASES = [
    pytest.param(adapter, n, tp, id=f"{adapter}-np{n}-tp{tp}")
    for adapter in ("mpi", "gloo")
    for n, tp in ((2, 2), (4, 2), (4, 4))
]


@pytest.mark.mpi
@pytest.mark.parametrize(("adapter", "nprocs", "tp_size"), CASES)
def test_bootstrap_exchange_and_subgroups(adapter: str, nprocs: int, tp_size: int) -> None:
    run_workers("bootstrap_worker.py", nprocs, [adapter, str(tp_size)])

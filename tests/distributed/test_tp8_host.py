"""Eight ranks on the host transport (issue 33 until an 8-GPU machine runs it): TP 8, and two
TP 4 groups in a world of 8, through the collectives, the overlap ops, the bulk ops and the
layers. Nothing in the runtime or the layers is written for TP <= 4 (lane counts, buffer
layouts, handshake sizes); these runs check it where CI can (2 cores: 8 ranks oversubscribe
them, so each layout runs its scenarios' core once, not the whole matrix of the TP 2 / 4
tests)."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers

LAYOUTS = [(8, 8), (8, 4)]  # (ranks, TP size): (8, 4) is two TP groups of four


def _id(n: int, tp: int) -> str:
    return f"np{n}-tp{tp}"


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_collectives_on_eight_ranks(nprocs: int, tp: int) -> None:
    run_workers("collectives_worker.py", nprocs, ["correctness", str(tp), "host"], timeout_s=600)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_overlap_ops_on_eight_ranks(nprocs: int, tp: int) -> None:
    run_workers("overlap_ops_worker.py", nprocs, ["correctness", str(tp), "host"], timeout_s=600)


@pytest.mark.mpi
@pytest.mark.slow
def test_host_bulk_ops_at_tp8() -> None:
    run_workers("bulk_worker.py", 8, ["correctness", "8", "host"], timeout_s=600)


@pytest.mark.mpi
@pytest.mark.slow
def test_host_fused_ag_at_tp8() -> None:
    """The fused AG+GEMM's groups (NOTE [fused ag_gemm]) at TP 8: with three pieces and three
    weights an op has 66 (on a GPU, three waiting kernels: kWaitingMaxGroups is 32); the host
    checks their order, flags and values."""
    run_workers("fused_ag_worker.py", 8, ["correctness", "8", "host"], timeout_s=600)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize(("nprocs", "tp"), LAYOUTS, ids=[_id(*lay) for lay in LAYOUTS])
def test_host_layers_on_eight_ranks(nprocs: int, tp: int) -> None:
    """Every layer scenario of test_layers.py (TP 8 widens the test dims: workers/
    layers_worker.py main())."""
    scenarios = "modules,switches,fp8,pipeline,train_eval,negative"
    run_workers("layers_worker.py", nprocs, [scenarios, str(tp), "host"], timeout_s=900)

"""Issue 32's soak suite (workers/soak_worker.py): a randomized sequence of ops, methods,
sizes, dtypes and knobs over several buffers, with random delays, stalls past the deadline
and a killed rank; every result is checked, or every error is typed. Plain processes, no
mpirun: mpirun would end the job when a rank dies.

CI runs a short version on the host transport (3 ranks, 300 ops, 2 stalls, a kill; about 8 s
on 2 cores); a GPU machine runs 10,000 ops on the cuda transport."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_local_ranks


def test_host_soak() -> None:
    out = run_local_ranks("soak_worker.py", 3, ["host", "300", "1", "2", "1"], killed=[2])
    assert "soak rank=0" in out and "soak rank=1" in out


@pytest.mark.gpu(2)
def test_cuda_soak_10000_ops() -> None:
    out = run_local_ranks(
        "soak_worker.py", 2, ["cuda", "10000", "1", "5", "1"], killed=[1], timeout_s=900
    )
    assert "soak rank=0" in out

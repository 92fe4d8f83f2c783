"""Issue 32's soak suite (workers/soak_worker.py): a randomized sequence of ops, methods,
sizes, dtypes and knobs over several buffers, with random delays, stalls past the deadline
and a killed rank; every result is checked, or every error is typed. Plain processes, no
mpirun: mpirun would end the job when a rank dies.

CI runs a short version on the host transport (3 ranks, 300 ops, 2 stalls, a kill; about 8 s
on 2 cores); a GPU machine runs 10,000 ops on the cuda transport, and a short sequence of
every op kind (no stall, no kill) under compute-sanitizer's memcheck and racecheck."""

from __future__ import annotations

import shutil

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
    print("\n".join(line for line in out.splitlines() if "soak rank=" in line))  # the counts
    assert "soak rank=0" in out


@pytest.mark.gpu(2)
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_cuda_ops_under_compute_sanitizer(tool: str) -> None:
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer is not on PATH")
    prefix = [sanitizer, "--tool", tool, "--error-exitcode", "86", "--target-processes", "all"]
    if tool == "memcheck":
        prefix += ["--leak-check", "full"]
    # 40 ops draw every op kind at seed 3 (the soak's own count per kind is in its summary);
    # a 60 s deadline: the tools slow every kernel down many times.
    out = run_local_ranks(
        "soak_worker.py", 2, ["cuda", "40", "3", "0", "0", "60"], timeout_s=580, prefix=prefix
    )
    # memcheck ends with "ERROR SUMMARY: 0 errors", racecheck with "RACECHECK SUMMARY: 0
    # hazards displayed (0 errors, 0 warnings)": one clean summary per rank.
    clean = "ERROR SUMMARY: 0 errors" if tool == "memcheck" else "0 hazards displayed (0 errors"
    assert out.count(clean) == 2 and "Program hit" not in out, out[-4000:]

"""Multi-rank: the fused AG+GEMM (NOTE [fused ag_gemm]) against the reference, on both
transports. The host transport runs the waiting GEMM's default (each group's wait, then the
reference GEMM) everywhere (CI); the cuda transport runs the CUTLASS kernel and needs one
Hopper GPU per rank and a build with CUTLASS's headers."""

from __future__ import annotations

import pytest

from tests.distributed.launcher import run_workers


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", ["correctness", "negative", "kernels"])
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_host_fused_ag(scenario: str, nprocs: int) -> None:
    run_workers("fused_ag_worker.py", nprocs, [scenario, str(nprocs), "host"])


@pytest.mark.mpi
@pytest.mark.parametrize("scenario", ["correctness", "negative", "kernels"])
@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_cuda_fused_ag(scenario: str, nprocs: int) -> None:
    from tests.conftest import gpu_count

    if gpu_count() < nprocs:
        pytest.skip(f"needs {nprocs} GPUs, {gpu_count()} visible")
    from overlap._native import native

    if not native().gemm.waiting_gemm_built():
        pytest.skip("built without CUTLASS's headers (no waiting GEMM; OVERLAP_CUTLASS_DIR)")
    run_workers("fused_ag_worker.py", nprocs, [scenario, str(nprocs), "cuda"])

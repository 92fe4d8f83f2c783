"""GPU smoke test: the extension sees the GPUs, the cuBLASLt it loaded, and runs a kernel."""

from __future__ import annotations

import pytest

import overlap
from overlap.info import summary

torch = pytest.importorskip("torch")


@pytest.mark.gpu
def test_module_reports_cuda_devices_and_cublaslt() -> None:
    info = overlap.build_info()
    print(summary())
    assert info["cuda_compiled"]
    assert info["device_count"] == torch.cuda.device_count()
    assert info["driver_version"] >= info["cudart_build_version"] // 1000 * 1000
    assert info["cublaslt_version"] >= 130000
    for d in info["devices"]:
        assert d["compute_capability"] >= (9, 0), "overlap targets Hopper and newer"
        assert d["sm_count"] > 0 and d["total_memory"] > 0
    assert overlap.cuda_available()


@pytest.mark.gpu(2)
def test_all_gpu_pairs_have_peer_access() -> None:
    """Userbuffers map peer memory: every pair of local GPUs must reach each other."""
    info = overlap.build_info()
    for d in info["devices"]:
        assert all(d["peer_access"]), f"GPU {d['ordinal']} lacks P2P: {d['peer_access']}"

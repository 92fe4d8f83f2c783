"""Build facts: CUDA compiled when the toolchain is there, no libcuda link, clear reporting."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import overlap
from overlap._native import native
from overlap.info import summary


def _nvcc_available() -> bool:
    return shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()


def test_build_info_reports_a_consistent_picture() -> None:
    info = overlap.build_info()
    assert info["device_count"] == len(info["devices"])
    if info["cuda_compiled"]:
        assert info["cuda_archs"]
        assert info["cublaslt_version"] >= 120000
        assert Path(info["cublaslt_loaded_library"]).name.startswith("libcublasLt")
        if info["device_count"] == 0:
            assert info["device_error"], "no GPU must come with the reason"
            assert not overlap.cuda_available()
    else:
        assert info["no_cuda_reason"]
        assert "ABSENT" in summary()


def test_cuda_sources_are_compiled_when_nvcc_is_present() -> None:
    if not _nvcc_available():
        pytest.skip("nvcc not on this machine: a host-only build is expected")
    assert overlap.build_info()["cuda_compiled"], overlap.build_info()["no_cuda_reason"]


def test_extension_does_not_link_libcuda() -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf not available")
    so = Path(native().__file__)
    dynamic = subprocess.run(
        ["readelf", "-d", str(so)], capture_output=True, text=True, check=True
    ).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed, dynamic
    assert not any("libcuda.so" in line for line in needed), needed


def test_require_cuda_explains_why_on_a_machine_without_gpus() -> None:
    if overlap.cuda_available():
        pytest.skip("this machine has a usable GPU")
    with pytest.raises(
        overlap.UnsupportedHardwareError, match=r"the widget needs (CUDA|a CUDA GPU)"
    ):
        overlap.require_cuda("the widget")


def test_the_host_cost_probe_compiles(tmp_path: Path) -> None:
    """benchmarks/native/host_cost_probe.cu (docs/performance-log.md [gemm workspace]) stays
    buildable: compiled, not linked (no GPU needed), against the cuBLASLt headers the build
    found."""
    if not _nvcc_available():
        pytest.skip("nvcc not on this machine")
    import site

    roots = [Path(p) / "nvidia" / v / "include" for p in site.getsitepackages()
             for v in ("cu13", "cu12")] + [Path("/usr/local/cuda/include")]  # fmt: skip
    include = next((r for r in roots if (r / "cublasLt.h").exists()), None)
    if include is None:
        pytest.skip("no cublasLt.h found")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    probe = Path(__file__).resolve().parents[2] / "benchmarks" / "native" / "host_cost_probe.cu"
    done = subprocess.run(
        [nvcc, "-std=c++17", "-arch=sm_90", f"-I{include}", "-c", str(probe), "-o",
         str(tmp_path / "probe.o")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_fused_ag_probe_compiles(tmp_path: Path) -> None:
    """benchmarks/native/fused_ag_probe.cu (docs/performance-log.md [fused ag_gemm probe])
    stays buildable: compiled, not linked, against the CUTLASS headers the build uses."""
    if not _nvcc_available():
        pytest.skip("nvcc not on this machine")
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("CUTLASS's headers (the nvidia-cutlass package) are not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "source"
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    probe = Path(__file__).resolve().parents[2] / "benchmarks" / "native" / "fused_ag_probe.cu"
    done = subprocess.run(
        [nvcc, "-std=c++17", "-O1", "-DNDEBUG", "-arch=sm_90a", "--expt-relaxed-constexpr",
         f"-I{source / 'include'}", f"-I{source / 'tools' / 'util' / 'include'}", "-c",
         str(probe), "-o", str(tmp_path / "probe.o")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

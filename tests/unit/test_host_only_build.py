"""A build without CUDA (OVERLAP_BUILD_CUDA=OFF) configures, compiles, imports and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not available")
    return found


@pytest.mark.slow
def test_host_only_build_imports_and_reports_no_cuda(tmp_path: Path) -> None:
    import pybind11

    build = tmp_path / "build"
    env = {**os.environ, "OVERLAP_BUILD_CUDA": "OFF"}
    configure = [
        _tool("cmake"),
        "-S",
        str(ROOT),
        "-B",
        str(build),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    log = subprocess.run(configure, env=env, capture_output=True, text=True)
    assert log.returncode == 0, log.stdout + log.stderr
    assert "CUDA support : OFF -- disabled by OVERLAP_BUILD_CUDA=OFF" in log.stdout
    built = subprocess.run(
        [_tool("cmake"), "--build", str(build), "-j", "2"], env=env, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Building CUDA" not in built.stdout

    # Assemble an importable package from the sources plus the host-only extension.
    pkg = tmp_path / "site" / "overlap"
    shutil.copytree(ROOT / "overlap", pkg, ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    (so,) = build.glob("_C*.so")
    shutil.copy(so, pkg / so.name)
    script = textwrap.dedent(
        """
        import sys
        # Bypass the editable install's import hook so that the copy under test is imported.
        sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        import torch, overlap
        assert overlap.__file__.startswith(sys.argv[1]), overlap.__file__
        from overlap.info import summary
        from overlap.quantization import amax
        info = overlap.build_info()
        assert info["cuda_compiled"] is False, info
        assert "OVERLAP_BUILD_CUDA=OFF" in info["no_cuda_reason"]
        assert "ABSENT" in summary()
        x = torch.randn(77)
        assert amax(x).item() == x.abs().max().item()
        from overlap.gemm import gemm
        a, b = torch.randn(16, 32), torch.randn(32, 8)
        assert torch.allclose(gemm(a, b), a @ b, rtol=1e-5, atol=1e-5)
        try:
            overlap.require_cuda("the test")
        except overlap.UnsupportedHardwareError as exc:
            assert "no CUDA support" in str(exc), exc
        else:
            raise AssertionError("require_cuda passed on a host-only build")
        print("HOST-ONLY OK")
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(pkg)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,
    )
    assert run.returncode == 0 and "HOST-ONLY OK" in run.stdout, run.stdout + run.stderr

"""Lint and format checks run as part of the tests: ruff for Python, clang-format for C++."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        if in_ci():
            pytest.fail(f"{name} is missing; scripts/setup_env.sh installs it")
        pytest.skip(f"{name} not installed")
    return found


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd[:3])} ...\n{res.stdout}\n{res.stderr}"


def test_ruff_lint() -> None:
    _run([_tool("ruff"), "check", "."])


def test_ruff_format() -> None:
    _run([_tool("ruff"), "format", "--check", "."])


def test_clang_format() -> None:
    sources = sorted(
        str(p.relative_to(ROOT))
        for ext in ("*.h", "*.cpp", "*.cu", "*.cuh")
        for p in (ROOT / "csrc").rglob(ext)
    )
    assert sources
    _run([_tool("clang-format"), "--dry-run", "-Werror", *sources])

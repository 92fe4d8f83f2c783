"""Runs a worker script under ``mpirun -np N`` and checks that every rank printed PASS.

Workers live in ``tests/distributed/workers/``; each rank prints ``PASS rank=<r>`` once it has
checked everything. A launch fails on a non-zero exit, a missing PASS line or a timeout, and
the failure message carries the command line and the last lines of the output.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from overlap.env import settings
from overlap.launch import format_command, mpirun_command
from tests.conftest import in_ci

WORKERS = Path(__file__).resolve().parent / "workers"
REPO_ROOT = Path(__file__).resolve().parents[2]
TAIL_LINES = 80


def _tail(text: str, n: int = TAIL_LINES) -> str:
    lines = text.splitlines()
    return "\n".join(lines[-n:])


def run_workers(
    worker: str,
    nprocs: int,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> str:
    """Launch ``workers/<worker>`` on ``nprocs`` ranks; return the combined output."""
    mpirun = shutil.which(settings().mpirun)
    if mpirun is None:
        message = f"{settings().mpirun} not found (apt-get install openmpi-bin)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    timeout_s = timeout_s or settings().test_np_timeout_s
    worker_env = {"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = mpirun_command(
        nprocs,
        [sys.executable, "-u", str(WORKERS / worker), *args],
        env=worker_env,
        mpirun=mpirun,
    )
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, **worker_env},
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(
            f"timed out after {timeout_s:.0f} s: {format_command(cmd)}\n--- output tail ---\n"
            f"{_tail(out)}"
        )
    passed = {int(r) for r in re.findall(r"PASS rank=(\d+)", out)}
    if proc.returncode != 0 or passed != set(range(nprocs)):
        pytest.fail(
            f"exit code {proc.returncode}, PASS from ranks {sorted(passed)} of {nprocs}: "
            f"{format_command(cmd)}\n--- output tail ---\n{_tail(out)}"
        )
    return out

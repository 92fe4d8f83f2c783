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
import time
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


def run_local_ranks(
    worker: str,
    nprocs: int,
    args: Sequence[str] = (),
    *,
    killed: Sequence[int] = (),
    timeout_s: float = 120.0,
    env: Mapping[str, str] | None = None,
    prefix: Sequence[str] = (),
) -> str:
    """Launch ``workers/<worker>`` as ``nprocs`` plain processes, without mpirun, so that a
    rank may die (mpirun would end the whole job): the ranks meet in ``torch.distributed``
    (gloo) through a FileStore (``_worker.local_setup``). Every rank but those in ``killed``
    must print ``PASS rank=<r>`` and exit 0; those in ``killed`` must die by SIGKILL. Returns
    the outputs, each line prefixed with ``[rank]``. ``prefix`` goes before the Python
    command line (a tool that runs it, such as ``compute-sanitizer``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="overlap-local-") as tmp:
        base = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "TEST_LOCAL_SIZE": str(nprocs),
            "TEST_LOCAL_STORE": os.path.join(tmp, "store"),
            **(env or {}),
        }
        procs = [
            subprocess.Popen(
                [*prefix, sys.executable, "-u", str(WORKERS / worker), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env={**base, "TEST_LOCAL_RANK": str(rank)},
            )
            for rank in range(nprocs)
        ]
        outs: list[str] = []
        deadline = time.monotonic() + timeout_s
        timed_out = False
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                out, _ = proc.communicate()
            outs.append(out)
    text = "\n".join(
        f"[{rank}] {line}" for rank, out in enumerate(outs) for line in out.splitlines()
    )
    codes = [p.returncode for p in procs]
    if timed_out:
        pytest.fail(f"{worker} {list(args)} timed out after {timeout_s:.0f} s\n{_tail(text)}")
    for rank, (code, out) in enumerate(zip(codes, outs, strict=True)):
        died = code == -signal.SIGKILL
        if not (died if rank in killed else code == 0 and f"PASS rank={rank}" in out):
            pytest.fail(f"{worker} {list(args)}: rank {rank} exit code {code}\n{_tail(text)}")
    return text

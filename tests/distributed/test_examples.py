"""The examples run as the README shows them: under mpirun, on the CPU here (host transport),
and their loss falls."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from overlap.env import settings
from overlap.launch import format_command, mpirun_command
from tests.distributed.launcher import REPO_ROOT


@pytest.mark.mpi
@pytest.mark.parametrize("flags", [[], ["--fp8"]], ids=["ub", "fp8"])
def test_mlp_block_example(flags: list[str]) -> None:
    mpirun = shutil.which(settings().mpirun)
    if mpirun is None:
        pytest.skip("mpirun not found")
    script = str(REPO_ROOT / "examples" / "mlp_block.py")
    cmd = mpirun_command(
        2, [sys.executable, script, "--steps", "4", *flags],
        env={"PYTHONPATH": str(REPO_ROOT), "CUDA_VISIBLE_DEVICES": ""}, mpirun=mpirun,
    )  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{format_command(cmd)}\n{out[-3000:]}"
    losses = [float(v) for v in re.findall(r"step \d+: loss ([0-9.]+)", out)]
    assert len(losses) == 4, out[-3000:]
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"

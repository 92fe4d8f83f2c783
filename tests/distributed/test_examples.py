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


def _train_gpt_against_one_process(nprocs: int, flags: list[str], env: dict[str, str]) -> None:
    """Run examples/train_gpt.py --compare under mpirun: it must exit cleanly, print a loss
    for every step, stay within 2% of the one-process losses, and its loss must fall."""
    mpirun = shutil.which(settings().mpirun)
    if mpirun is None:
        pytest.skip("mpirun not found")
    script = str(REPO_ROOT / "examples" / "train_gpt.py")
    cmd = mpirun_command(
        nprocs, [sys.executable, script, "--compare", *flags],
        env={"PYTHONPATH": str(REPO_ROOT), **env}, mpirun=mpirun,
    )  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{format_command(cmd)}\n{out[-3000:]}"
    losses = [float(v) for v in re.findall(r"step +\d+: loss ([0-9.]+)", out)]
    diff = re.search(r"largest relative loss difference to one process: ([0-9.]+)", out)
    steps = int(flags[flags.index("--steps") + 1])
    assert diff is not None and len(losses) == steps, out[-3000:]
    assert float(diff.group(1)) < 0.02, out[-3000:]
    assert min(losses[-3:]) < losses[0], f"the loss did not fall: {losses}"


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("nprocs", "flags"),
    [(2, ["--steps", "20"]), (4, ["--tp", "2", "--fp8", "--steps", "8"])],
    ids=["tp2-bf16-20steps", "tp2xdp2-fp8"],
)
def test_train_gpt_matches_one_process(nprocs: int, flags: list[str]) -> None:
    """The TP (and TP x DP) GPT trains like the same model on one process: the same losses
    within 2% (bf16 activations against float32 references; FP8 casts), and the loss falls."""
    _train_gpt_against_one_process(nprocs, flags, {"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.mpi
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_train_gpt_with_graphed_layers_matches_one_process(fp8: bool) -> None:
    """GPUs: the GPT with its layers replayed as CUDA graphs (``--cuda-graph``, one per
    visible GPU, up to 4) trains like the same model on one process, as the eager one does."""
    from tests.conftest import gpu_count

    n = min(gpu_count(), 4)
    if n < 2:
        pytest.skip(f"needs 2 GPUs, {gpu_count()} visible")
    flags = ["--cuda-graph", "--steps", "20", "--hidden", "1024", "--heads", "16", "--seq", "1024"]
    _train_gpt_against_one_process(n, flags + (["--fp8"] if fp8 else []), {})

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
    # The step lines first (stdout), then the end of stderr: the losses stay in the message.
    out = f"{done.stdout[-4000:]}\n--- stderr:\n{done.stderr[-2000:]}"
    assert done.returncode == 0, f"{format_command(cmd)}\n{out}"
    losses = [float(v) for v in re.findall(r"step +\d+: loss ([0-9.]+)", done.stdout)]
    diff = re.search(r"largest relative loss difference to one process: ([0-9.]+)", done.stdout)
    steps = int(flags[flags.index("--steps") + 1])
    assert diff is not None and len(losses) == steps, out
    assert float(diff.group(1)) < 0.02, out
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
@pytest.mark.parametrize(
    ("graphed", "fp8"),
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["eager-bf16", "eager-fp8", "graphed-bf16", "graphed-fp8"],
)
def test_train_gpt_on_gpus_matches_one_process(graphed: bool, fp8: bool) -> None:
    """GPUs: the GPT on every visible GPU (up to 4; TP over them, userbuffers), eagerly or with
    its layers replayed as CUDA graphs (``--cuda-graph``), trains like the same model on one
    process: 20 steps of losses within 2%, the loss falls, and it exits (NOTE [graph
    teardown])."""
    from tests.conftest import gpu_count

    n = min(gpu_count(), 4)
    if n < 2:
        pytest.skip(f"needs 2 GPUs, {gpu_count()} visible")
    # lr 5e-4: at the example's 3e-3 a model this wide diverges in its first steps (the loss
    # rose from 10.56 to 11.26 in 4 steps on 4 GPUs), and bf16 rounding then grows into a few
    # percent of loss between any two runs, graphed or not.
    flags = ["--steps", "20", "--hidden", "1024", "--heads", "16", "--seq", "1024",
             "--lr", "5e-4", "--vocab", "4096"]  # fmt: skip
    flags += ["--cuda-graph"] if graphed else []
    _train_gpt_against_one_process(n, flags + (["--fp8"] if fp8 else []), {})

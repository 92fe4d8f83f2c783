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


def _train_gpt_against_one_process(
    nprocs: int, flags: list[str], env: dict[str, str], tol: float = 0.02
) -> list[float]:
    """Run examples/train_gpt.py --compare under mpirun: it must exit cleanly, print a loss
    for every step, stay within ``tol`` (relative) of the one-process losses, and its loss
    must fall. Returns the losses."""
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
    assert float(diff.group(1)) < tol, out
    assert min(losses[-3:]) < losses[0], f"the loss did not fall: {losses}"
    return losses


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
def test_train_gpt_on_gpus_matches_one_process(fp8: bool) -> None:
    """GPUs: the GPT on every visible GPU (up to 4; TP over them, userbuffers), eagerly and
    with its layers replayed as CUDA graphs (``--cuda-graph``), trains like the same model on
    one process (20 steps; the loss falls) and exits (NOTE [graph teardown]); the graphed run's
    losses are the eager run's.

    Tolerances against the float32 one-process model: 2% in BF16, 5% in FP8, whose E4M3
    inputs carry 3 mantissa bits: on 4 H100s the FP8 runs (eager and graphed alike) drifted to
    2.8% of the reference by step 19 while BF16 stayed within 2%. Graphed against eager: 0.5%
    per step (the same kernels on the same data; they agreed to all four printed digits on
    every step in both dtypes), so a replay that reads a stale input, weight or scale fails here
    even where it would hide inside the reference tolerance."""
    from tests.conftest import gpu_count

    n = min(gpu_count(), 4)
    if n < 2:
        pytest.skip(f"needs 2 GPUs, {gpu_count()} visible")
    # lr 5e-4: at the example's 3e-3 a model this wide diverges in its first steps (the loss
    # rose from 10.56 to 11.26 in 4 steps on 4 GPUs), and bf16 rounding then grows into a few
    # percent of loss between any two runs, graphed or not.
    flags = ["--steps", "20", "--hidden", "1024", "--heads", "16", "--seq", "1024",
             "--lr", "5e-4", "--vocab", "4096"] + (["--fp8"] if fp8 else [])  # fmt: skip
    tol = 0.05 if fp8 else 0.02
    eager = _train_gpt_against_one_process(n, flags, {}, tol)
    graphed = _train_gpt_against_one_process(n, [*flags, "--cuda-graph"], {}, tol)
    worst = max(abs(g - e) / abs(e) for g, e in zip(graphed, eager, strict=True))
    assert worst < 0.005, f"graphed {graphed} against eager {eager}"

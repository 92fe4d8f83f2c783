"""The layer benchmark runs on the host transport (tiny shapes) and writes its outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.layers import TINY, summarize, summary_line
from tests.distributed.launcher import REPO_ROOT


@pytest.mark.mpi
def test_layers_benchmark_on_host(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.layers", "--launch", "2", "--out", str(tmp_path),
           "--iters", "2", "--warmup", "1"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "layers.json").read_text())
    rows = result["rows"]
    assert {(r["module"], r["dtype"]) for r in rows} == {
        (m, d) for m in ("qkv", "proj", "mlp") for d in ("bf16", "fp8")
    }
    for r in rows:
        assert r["ms_ub"] > 0 and r["ms_none"] > 0 and r["ub_bytes"] > 0, r
        # The one buffer of the handle, within 2 * T * H * 2 (NOTE [userbuffer memory]).
        assert r["ub_bytes"] <= 2 * r["tokens"] * TINY[0] * 2, r
        assert r["speedup"] == pytest.approx(r["ms_none"] / r["ms_ub"])
    assert result["summary"]["rows"] == 6 and result["summary"]["at_target"] is None
    assert (tmp_path / "layers.txt").read_text().startswith("tensor-parallel layers")


def test_layers_summary() -> None:
    rows = [{"speedup": s} for s in (1.2, 1.0, 1.3)]
    s = summarize(rows, cuda=True)
    assert (s["rows"], s["median_speedup"], s["min_speedup"], s["at_target"]) == (3, 1.2, 1.0, 2)
    assert "2/3 rows >= 1.15x" in summary_line(s)
    assert "not measured" in summary_line(summarize(rows, cuda=False))
    assert summary_line(summarize([], cuda=True)) == "no rows"


@pytest.mark.mpi
def test_transformer_benchmark_on_host(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.transformer", "--launch", "2", "--out",
           str(tmp_path), "--iters", "2", "--warmup", "1"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "transformer.json").read_text())
    rows = result["rows"]
    assert [r["dtype"] for r in rows] == ["bf16", "fp8"]
    for r in rows:
        assert r["ms_ours"] > 0 and r["ms_none"] > 0 and r["ms_floor"] > 0, r
        assert r["none_over_floor"] == r["ms_none"] / r["ms_floor"], r
        assert "transformer_engine" in r["na"]["te"] or r["na"]["te"], r["na"]
    assert rows[0]["ms_torch_eager"] > 0  # PyTorch's DTensor TP runs on gloo too
    assert "torchao" in rows[1]["na"]["torch_eager"] or rows[1]["na"]["torch_eager"]
    assert result["summary"]["rows"] == 2


def test_host_time_benchmark_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "host_time.json"
    cmd = [sys.executable, "-m", "benchmarks.host_time", "--iters", "3", "--json", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["module"], r["dtype"]) for r in rows} == {
        (m, d)
        for m in ("LayerNormLinear", "RowParallelLinear", "LayerNormMLP", "TransformerLayer")
        for d in ("bf16", "fp8")
    }
    assert all(r["host_us"] > 0 for r in rows)


@pytest.mark.parametrize(
    "launch", [pytest.param(None, id="one_rank"), pytest.param(2, id="np2", marks=pytest.mark.mpi)]
)
def test_host_time_ops_benchmark_on_cpu(tmp_path: Path, launch: int | None) -> None:
    """``--ops``: each op's whole call and its Python alone (the native op a no-op), one plain
    GEMM and torch's; under ``--launch 2`` the ops run on a group of two ranks."""
    out = tmp_path / "host_time_ops.json"
    cmd = [sys.executable, "-m", "benchmarks.host_time", "--ops", "--iters", "3", "--json",
           str(out), *(["--launch", str(launch)] if launch else [])]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r["op"]: r for r in json.loads(out.read_text())["rows"]}
    ops = ("ag_gemm", "ag_gemm_fp8", "ag_gemm_3w", "gemm_rs", "ag_beside_gemm", "rs_beside_gemm")
    assert set(rows) == {*ops, "gemm", "torch.mm"}
    assert all(rows[o]["host_us"] > 0 and rows[o]["python_us"] > 0 for o in ops), rows
    assert rows["gemm"]["host_us"] > 0 and rows["torch.mm"]["host_us"] > 0
    assert f"{launch or 1} rank(s)" in done.stdout


@pytest.mark.mpi
def test_ub_memory_benchmark_on_host() -> None:
    """benchmarks.ub_memory prints each handle's bytes per rank against 2 * T * H * 2."""
    cmd = [sys.executable, "-m", "benchmarks.ub_memory", "--launch", "2", "--hidden", "1024",
           "--tokens", "1024,2048", "--describe"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("tp=2 ")]
    assert len(rows) == 4, done.stdout[-3000:]
    # TP 2 (NOTE [userbuffer memory]): 1.5 S, BF16 and FP8 (the pipelined GEMM+RS a plan may
    # run instead of the ring, NOTE [plan alternates]), with S = T * H * 2.
    assert sum("0.75 x 2*T*H*2" in r for r in rows) == 4, rows
    assert "window #2: bulk_rs" in done.stdout and "total: " in done.stdout

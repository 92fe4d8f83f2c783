"""The overlap benchmark end to end on the host transport (what CI and the README's main command
run on a CPU machine): ``python -m benchmarks.overlap_ops --launch 4`` and ``benchmarks.run``
write their JSON, table and plot, print progress and the paths, and time every row."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from overlap.env import settings
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def _run(args: list[str]) -> subprocess.CompletedProcess:
    if shutil.which(settings().mpirun) is None:
        message = f"{settings().mpirun} not found (apt-get install openmpi-bin)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", *args]
    try:
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, (
        f"{' '.join(cmd)}\n--- stdout\n{done.stdout}\n--- stderr\n" + (done.stderr[-6000:])
    )
    return done


def _check_rows(rows: list[dict], variants: set[str], errors: set[str] = frozenset()) -> None:
    assert rows
    for r in rows:
        assert r["T_gemm"] == min(r["T_gemm_whole"], r["T_gemm_chunked"]) > 0
        assert r["T_comm"] > 0 and r["T_seq"] > 0
        assert set(r["T_ours_by_variant"]) == variants, r["T_ours_by_variant"]
        assert set(r["variant_errors"]) == errors, r["variant_errors"]
        assert r["T_ours"] == min(r["T_ours_by_variant"].values()) > 0
        assert r["floor"] == max(r["T_gemm"], r["T_comm"])
        assert r["ours_over_floor"] == pytest.approx(r["T_ours"] / r["floor"])
        # NOTE [pipeline floor]: our collective alone, plus one chunk's GEMM
        pipe = max(r["T_gemm"], r["T_gemm_chunked"] / r["tp"] + r["T_comm_ours"])
        assert r["T_comm_ours"] > 0 and r["pipeline_floor"] == pytest.approx(pipe)
        # NOTE [concurrent floor]: the faster GEMM form beside our copies of the row's bytes
        conc = min(r["T_concurrent_whole"], r["T_concurrent_chunked"])
        assert r["T_concurrent"] == conc > 0
        assert r["concurrent_over_floor"] == pytest.approx(conc / r["floor"])
        # NOTE [default variant]: timed whenever the selection kept it
        if r["default_variant"] in r["T_ours_by_variant"]:
            assert r["T_default"] == r["T_ours_by_variant"][r["default_variant"]]
            # NOTE [planned column]: the shape plan's own decision and figures, and its path
            plan = r["plan"]
            assert isinstance(plan["overlap"], bool), plan
            assert plan["op_ms"] > 0 and plan["sequential_ms"] > 0, plan
            # NOTE [plan alternates]: the default or a built alternate's variant, or T_seq
            paths = {"op": r["default_variant"]}
            paths |= {
                k: v for k, v in r["alternate_variants"].items() if v in r["T_ours_by_variant"]
            }
            assert set(plan["times_ms"]) == {*paths, "sequential"}, (plan, paths)
            assert plan["variant"] == paths.get(plan["path"]), plan
            ran = r["T_ours_by_variant"].get(plan["variant"])
            assert r["T_planned"] == (ran if plan["overlap"] else r["T_seq"])
        else:
            assert r["plan"] is None and r["T_planned"] is None
        # host transport: no torch async-TP (n/a with the reason), no TE reference
        assert r["T_torch"] is None and "CUDA" in r["torch_error"] and r["vs_torch"] is None
        assert r["T_te_ref"] is None and r["vs_te"] is None


def _check_bulk_rows(rows: list[dict], variants: set[str]) -> None:
    assert rows
    for r in rows:
        assert r["T_gemm"] == r["T_gemm_whole"] > 0 and r["T_gemm_chunked"] is None
        assert r["concurrent_over_floor"] is None  # the bulk op is the concurrent run itself
        assert r["T_comm"] > 0 and r["T_seq"] > 0
        assert set(r["T_ours_by_variant"]) == variants and not r["variant_errors"]
        assert r["T_ours"] == min(r["T_ours_by_variant"].values()) > 0
        assert r["floor"] == max(r["T_gemm"], r["T_comm"])
        assert r["ours_over_floor"] == pytest.approx(r["T_ours"] / r["floor"])
        # host transport: no NCCL side-stream baseline (n/a with the reason), no TE reference
        assert r["T_torch"] is None and "CUDA" in r["torch_error"] and r["vs_torch"] is None
        assert r["T_te_ref"] is None and r["vs_te"] is None


@pytest.mark.mpi
def test_quick_default_on_four_host_ranks(tmp_path: Path) -> None:
    done = _run(["benchmarks.overlap_ops", "--launch", "4", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "overlap_ops.json").read_text())
    assert result["suite"] == "quick" and result["transport"] == "host"
    assert result["timing"]["mode"] == "host" and result["timing"]["iters"] == 3
    rows = result["rows"]
    assert {(r["op"], r["shape"], r["tp"], r["dtype"]) for r in rows} == {
        ("ag_gemm", "fc1", 4, "bf16"),
        ("ag_gemm", "qkv", 4, "fp8"),
        ("gemm_rs", "fc2", 4, "bf16"),
        ("gemm_rs", "proj", 4, "fp8"),
        ("bulk_ag", "qkv", 4, "fp8"),
        ("bulk_rs", "fc1", 4, "bf16"),
    }
    on_host = {
        "ag_gemm": {"pipeline/lanes1-split1", "pipeline/lanes1-split1-staggered",
                    "pipeline/lanes2-split1", "pipeline/lanes2-split1-staggered",
                    "pipeline/lanes1-split1-staggered-pieces2",
                    "pipeline/lanes1-split1-staggered-pieces4",
                    "pipeline/lanes2-split1-staggered-pieces2",
                    "pipeline/lanes2-split1-staggered-pieces4",
                    "pull/lanes1", "pull/lanes2", "pull/lanes1-pieces2",
                    "pull/lanes2-pieces2"},
        "gemm_rs": {"pipeline/lanes1-split1", "pipeline/lanes2-split1",
                    "pipeline/lanes1-split1-pieces2", "pipeline/lanes2-split1-pieces2",
                    "ring/lanes1-subchunks2", "ring/lanes1-subchunks4",
                    "ring/lanes2-subchunks2", "ring/lanes2-subchunks4",
                    "ring/lanes1-subchunks2-pull", "ring/lanes1-subchunks4-pull",
                    "ring/lanes2-subchunks2-pull", "ring/lanes2-subchunks4-pull"},
    }  # fmt: skip
    # The waiting GEMM (NOTE [fused ag_gemm]) multiplies bfloat16 only.
    fused = {"fused/pieces1", "fused/pieces2", "fused/pieces1-kerneluntuned"}
    _check_rows(
        [r for r in rows if r["op"] == "ag_gemm" and r["dtype"] == "fp8"], on_host["ag_gemm"]
    )
    _check_rows(
        [r for r in rows if r["op"] == "ag_gemm" and r["dtype"] == "bf16"],
        on_host["ag_gemm"] | fused,
    )
    _check_rows([r for r in rows if r["op"] == "gemm_rs"], on_host["gemm_rs"])
    # bulk rows: dgrad's shapes beside the gather (K = hidden / 128, N = QKV / tp / 128)
    (bulk_ag,) = [r for r in rows if r["op"] == "bulk_ag"]
    assert (bulk_ag["M"], bulk_ag["K"], bulk_ag["N"]) == (32, 64, 32)
    _check_bulk_rows([bulk_ag], {"bulk/serial", "bulk"})
    _check_bulk_rows(
        [r for r in rows if r["op"] == "bulk_rs"],
        {f"bulk/{s}margin0-pieces{p}" for s in ("serial-", "") for p in (1, 2, 4)},
    )
    assert result["summary"]["rows"] == 4 == result["summary"]["rows_timed"]
    assert result["summary_bulk"]["rows"] == 2 == result["summary_bulk"]["rows_timed"]
    # initialize_ub's defaults: every AG+GEMM / GEMM+RS row's runs on the host transport, the
    # bulk reduce-scatter's SM margin only on GPUs
    assert result["summary"]["rows_with_default"] == 4
    assert result["summary_bulk"]["rows_with_default"] == 1
    assert {m["name"] for m in result["methods"]} >= on_host["ag_gemm"] | on_host["gemm_rs"]
    # progress on stderr (rank 0 only), table and paths on stdout
    progress = [line for line in done.stderr.splitlines() if line.startswith("[overlap_ops] ")]
    assert [p.split()[1] for p in progress] == [f"{i}/{len(rows)}" for i in range(1, 7)]
    assert all("ETA" in p for p in progress)
    table = (tmp_path / "overlap_ops.txt").read_text()
    assert "best variant" in table and "NCCL on a side stream" in table
    # host transport: the rows timed, nothing counted against the GPU targets (gloo's floor)
    assert "summary: 4/4 rows timed; none counted against the 1.10 x floor target" in table
    assert "bulk rows: 2/2 rows timed; none counted" in table
    assert f"JSON: {tmp_path / 'overlap_ops.json'}" in done.stdout
    assert f"table: {tmp_path / 'overlap_ops.txt'}" in done.stdout
    if (tmp_path / "overlap_ops.png").exists():
        assert f"plot: {tmp_path / 'overlap_ops.png'}" in done.stdout
    else:
        assert "matplotlib" in done.stdout


@pytest.mark.mpi
def test_full_suite_options_with_tp2_subgroups(tmp_path: Path) -> None:
    """--full with TP = 2 on 4 ranks (two TP groups at once), TE's shapes, a method filter."""
    _run(
        [
            "benchmarks.overlap_ops",
            "--launch=4",
            "--out",
            str(tmp_path),
            "--full",
            "--tp",
            "2,4",
            "--shapes",
            "proj,te4096",
            "--dtypes",
            "fp8",
            "--methods",
            "ag_gemm:*lanes1*,gemm_rs:*lanes2*",
            "--iters",
            "2",
        ]
    )
    result = json.loads((tmp_path / "overlap_ops.json").read_text())
    rows = result["rows"]
    assert result["suite"] == "full" and result["timing"]["iters"] == 2
    expect = {
        (op, shape, m, tp)
        for tp in (2, 4)
        for op, shape, m in [
            ("gemm_rs", "proj", 32),
            ("gemm_rs", "proj", 64),
            ("ag_gemm", "te4096", 32),
            ("gemm_rs", "te4096", 32),
        ]
    }
    assert {(r["op"], r["shape"], r["M"], r["tp"]) for r in rows} == expect
    assert [r["tp"] for r in rows] == sorted(r["tp"] for r in rows)  # grouped by TP size
    assert all(r["dtype"] == "fp8" for r in rows)
    _check_rows(
        [r for r in rows if r["op"] == "ag_gemm"],
        {
            "pipeline/lanes1-split1",
            "pipeline/lanes1-split1-staggered",
            "pipeline/lanes1-split1-staggered-pieces2",
            "pipeline/lanes1-split1-staggered-pieces4",
            "pull/lanes1",
            "pull/lanes1-pieces2",
        },
    )
    _check_rows(
        [r for r in rows if r["op"] == "gemm_rs"],
        {
            "pipeline/lanes2-split1",
            "pipeline/lanes2-split1-pieces2",
            "ring/lanes2-subchunks2",
            "ring/lanes2-subchunks4",
            "ring/lanes2-subchunks2-pull",
            "ring/lanes2-subchunks4-pull",
        },
    )


@pytest.mark.mpi
def test_broad_suite_rows_on_host_ranks(tmp_path: Path) -> None:
    """--suite broad (NOTE [broad suite] in benchmarks/overlap_suite.py): a few rows of two
    families at TP 2 (two groups at once) and 4, named <family>.<layer>, with initialize_ub's
    default timed beside the best and the summaries by communication / GEMM ratio, which on
    the host transport compare nothing (NOTE [ratio summaries])."""
    methods = "ag_gemm:pipeline/lanes?-split1-staggered,gemm_rs:pipeline/lanes1-split1"
    methods += ",gemm_rs:ring/lanes1-subchunks2-pull"
    args = ["--suite", "broad", "--tp", "2,4", "--families", "llama3.2-1b,gpt3-175b"]
    args += ["--tokens", "1024", "--shapes", "qkv,fc2", "--methods", methods, "--iters", "2"]
    _run(["benchmarks.overlap_ops", "--launch", "4", "--out", str(tmp_path), *args])
    result = json.loads((tmp_path / "overlap_ops.json").read_text())
    assert result["suite"] == "broad" and result["skipped_rows"] == []
    assert [f["name"] for f in result["model_families"]["families"]] == [
        "llama3.2-1b", "gpt3-175b",
    ]  # fmt: skip
    rows = result["rows"]
    assert {(r["shape"], r["tp"], r["dtype"]) for r in rows} == {
        (f"{fam}.{layer}", tp, d)
        for fam in ("llama3.2-1b", "gpt3-175b")
        for layer in ("qkv", "fc2")
        for tp in (2, 4)
        for d in ("bf16", "fp8")
    }
    assert all(r["M"] == 1024 // 256 and r["shape"] == f"{r['family']}.{r['layer']}" for r in rows)
    ag = [r for r in rows if r["op"] == "ag_gemm"]
    _check_rows(ag, {"pipeline/lanes1-split1-staggered", "pipeline/lanes2-split1-staggered"})
    rs = [r for r in rows if r["op"] == "gemm_rs"]
    _check_rows(rs, {"pipeline/lanes1-split1", "ring/lanes1-subchunks2-pull"})
    # initialize_ub's default of each row's layer is among the timed variants at both TP sizes
    assert all(r["T_default"] is not None for r in rows)
    assert {r["default_variant"] for r in rs if r["tp"] == 2} == {"ring/lanes1-subchunks2-pull"}
    ratio = result["summary_by_ratio"]
    assert not ratio["meaningful"] and "gloo" in ratio["note"]
    for tp in ("2", "4"):
        buckets = ratio["by_tp"][tp]["buckets"]
        assert sum(b["rows"] for b in buckets.values()) == 8 == ratio["by_tp"][tp]["all"]["rows"]
    table = (tmp_path / "overlap_ops.txt").read_text()
    assert "rows by T_comm / T_gemm: TP 2: " in table and "not compared (host transport" in table
    assert "gpt3-175b.fc2" in table


@pytest.mark.mpi
def test_methods_added_by_import_and_a_builder_failing_on_one_rank(tmp_path: Path) -> None:
    """--import registers methods on every rank; a builder that raises on rank 1 only makes
    that variant n/a (with rank 1's error) on every rank, and the sweep goes on."""
    _run(
        [
            "benchmarks.overlap_ops",
            "--launch",
            "4",
            "--out",
            str(tmp_path),
            "--import",
            "tests.distributed.bench_methods_plugin",
            "--methods",
            "test-*,gemm_rs:pipeline/lanes1-split?",
            "--shapes",
            "qkv,proj",
            "--ops",
            "ag_gemm,gemm_rs",
        ]
    )
    result = json.loads((tmp_path / "overlap_ops.json").read_text())
    rows = result["rows"]
    assert {(r["op"], r["shape"]) for r in rows} == {("ag_gemm", "qkv"), ("gemm_rs", "proj")}
    _check_rows([r for r in rows if r["op"] == "ag_gemm"], {"test-reference"})
    rs = [r for r in rows if r["op"] == "gemm_rs"]
    _check_rows(rs, {"pipeline/lanes1-split1", "test-reference/exact"}, {"test-broken"})
    for r in rs:
        error = r["variant_errors"]["test-broken"]
        assert error.startswith("rank 1: InvalidArgumentError") and "rank 1 only" in error
    names = {m["name"] for m in result["methods"]}
    assert names == {"test-reference", "test-reference/exact", "test-broken",
                     "pipeline/lanes1-split1", "pipeline/lanes1-split2"}  # fmt: skip


BAD = [
    (["--tp", "3"], "TP sizes [3] do not divide the world size 2"),
    (["--ops", "bulk_ag,gemm"], "unknown dtypes or ops ['gemm']"),
    (["--methods", "gemm_rs:nope*"], "--methods pattern 'gemm_rs:nope*' matches no variant"),
    (["--import", "benchmarks.no_such_module"], "No module named 'benchmarks.no_such_module'"),
    (["--suite", "broad", "--families", "gpt4"], "unknown families ['gpt4'] in this suite"),
]


@pytest.mark.mpi
@pytest.mark.parametrize(
    ("args", "message"), BAD, ids=["tp", "ops", "methods", "import", "families"]
)
def test_bad_selection_fails_cleanly(tmp_path: Path, args: list[str], message: str) -> None:
    if shutil.which(settings().mpirun) is None:
        pytest.skip("no mpirun")
    cmd = ["benchmarks.overlap_ops", "--launch", "2", "--out", str(tmp_path), *args]
    done = subprocess.run(
        [sys.executable, "-m", *cmd],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode != 0
    assert f"[overlap_ops] error: {message}" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "overlap_ops.json").exists()


@pytest.mark.mpi
@pytest.mark.slow
def test_main_command_on_the_host_transport(tmp_path: Path) -> None:
    """``python -m benchmarks.run`` (what scripts/bench.sh runs) without GPUs."""
    done = _run(["benchmarks.run", "--transport", "host", "--nprocs", "4", "--out", str(tmp_path)])
    names = ("overlap_ops.json", "overlap_ops.txt", "baseline_collectives.json")
    for name in (*names, "layers.json", "layers.txt", "transformer.json", "transformer.txt"):
        assert (tmp_path / name).exists(), name
    # The closing lines: every job's summary, then the paths.
    tail = done.stdout[done.stdout.rindex("[bench] overlap ops: ") :].splitlines()
    assert any(
        line.startswith("[bench] overlap ops: 4/4 rows timed; none counted") for line in tail
    )
    assert any(
        line.startswith("[bench] bulk overlap: 2/2 rows timed; none counted") for line in tail
    )
    assert f"[bench] overlap ops JSON: {tmp_path / 'overlap_ops.json'}" in tail
    assert any(line.startswith("[bench] overlap ops plot: ") for line in tail)
    assert any(line.startswith("[bench] layers: 6 rows") for line in tail), tail
    assert any(line.startswith("[bench] transformer layer: 2 rows") for line in tail), tail
    assert f"[bench] transformer layer JSON: {tmp_path / 'transformer.json'}" in tail


@pytest.mark.mpi
@pytest.mark.gpu(2)
def test_gpu_timelines_of_the_best_variant_and_torch(tmp_path: Path) -> None:
    """``--trace``: a CUPTI timeline per row of its fastest variant and torch's op, with every
    rank's kernels and copies, and per-call spans in the JSON."""
    methods = "ag_gemm:pipeline/lanes1-split1*,gemm_rs:pipeline/lanes2-split1"
    args = ["--launch", "2", "--cuda", "--out", str(tmp_path), "--ops", "ag_gemm,gemm_rs"]
    args += ["--dtypes", "fp8", "--methods", methods, "--iters", "3", "--passes", "1", "--trace"]
    done = _run(["benchmarks.overlap_ops", *args])
    result = json.loads((tmp_path / "overlap_ops.json").read_text())
    assert result["traces"] == str(tmp_path / "traces")
    assert f"GPU timelines: {tmp_path / 'traces'}" in done.stdout
    for r in result["rows"]:
        # NOTE [host-bound rows]: every call's enqueue time is measured on GPUs
        assert r["host_ms"] > 0 and r["host_ms_torch"] > 0, r
        assert set(r["host_ms_by_variant"]) == set(r["T_ours_by_variant"])
        best, theirs = f"ours {r['best_variant']}", f"torch {r['torch_op']}"
        trace = r["trace"]
        assert set(trace) == {best, theirs, "file"}, trace.keys()
        for name in (best, theirs):
            assert [b["rank"] for b in trace[name]["ranks"]] == [0, 1]
            for b in trace[name]["ranks"]:
                assert b["span_us"] > 0 and b["kernel_us"] > 0
                assert 0 <= b["idle_us"] <= b["span_us"]
            assert trace[name]["span_us"] == max(b["span_us"] for b in trace[name]["ranks"])
        text = Path(trace["file"]).read_text()
        assert f"== {best}" in text and f"== {theirs}" in text
        body = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["0"], ["1"])]
        kinds = {ln[5] for ln in body if len(ln) > 5}
        assert {"kernel", "memcpy"} <= kinds, kinds  # GEMMs and copy-engine pushes
        assert not any("spin_kernel" in ln for ln in text.splitlines())

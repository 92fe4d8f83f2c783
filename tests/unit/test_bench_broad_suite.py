"""The overlap benchmark's broad suite without ranks (issue 30, item 1): its rows from the model
families of benchmarks/data/model_families.json (NOTE [broad suite] in
benchmarks/overlap_suite.py), the selection options and their errors, the host transport's
twins, the summaries by communication / GEMM ratio (NOTE [ratio summaries] in
benchmarks/overlap_report.py) and the GPU-time estimate of ``--list``
(benchmarks/overlap_estimate.py). The end-to-end host run: tests/distributed/
test_bench_overlap_ops.py."""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import methods
from benchmarks import overlap_estimate as estimate
from benchmarks import overlap_report as report
from benchmarks import overlap_suite as suite

BROAD_ROWS_PER_TP = sum(len(f.tokens) for f in suite.FAMILIES) * 4 * 2  # x layers x dtypes


def _key(r: dict) -> tuple:
    return (r["op"], r["shape"], r["M"], r["tp"], r["dtype"])


def _broad(world: int = 4, **kw: object) -> suite.Suite:
    return suite.select_suite(world, suite="broad", cuda=True, **kw)


def test_families_span_the_issue_s_range_with_their_sources() -> None:
    fams = {f.name: f for f in suite.FAMILIES}
    assert len(fams) == 8
    assert min(f.hidden for f in fams.values()) == 2048
    assert max(f.hidden for f in fams.values()) == 16384
    assert {f.gated for f in fams.values()} == {True, False}  # SwiGLU and GELU MLPs
    assert any(f.kv_heads < f.q_heads for f in fams.values())  # GQA
    assert any(f.kv_heads == f.q_heads for f in fams.values())  # MHA
    assert min(min(f.tokens) for f in fams.values()) == 1024
    assert max(max(f.tokens) for f in fams.values()) == 32768
    assert all(f.source for f in fams.values())
    # published dimensions (the file names each source)
    llama8b = fams["llama3.1-8b"]
    assert (llama8b.hidden, llama8b.ffn, llama8b.q_heads, llama8b.kv_heads) == (4096, 14336, 32, 8)
    gpt3 = fams["gpt3-175b"]
    assert (gpt3.hidden, gpt3.ffn, gpt3.q_heads, gpt3.head_dim, gpt3.gated) == (
        12288, 49152, 96, 128, False,
    )  # fmt: skip
    assert (fams["llama3.1-405b"].hidden, fams["llama3.1-405b"].ffn) == (16384, 53248)


@pytest.mark.parametrize("tp", [2, 4])
def test_broad_rows_follow_llama_shape_s_conventions(tp: int) -> None:
    """AG+GEMM rows: K = hidden, the local N; GEMM+RS rows: the local K, N = hidden; fc1 of a
    gated MLP is twice the FFN; every row named <family>.<layer>, unique, aligned."""
    rows = _broad(tp_sizes=[tp]).rows
    assert len(rows) == BROAD_ROWS_PER_TP
    assert len({_key(r) for r in rows}) == len(rows)
    assert {r["family"] for r in rows} == {f.name for f in suite.FAMILIES}
    for r in rows:
        assert r["shape"] == f"{r['family']}.{r['layer']}" and r["tp"] == tp
        align = 16 if r["dtype"] == "fp8" else 8
        assert r["K"] % align == 0 and r["N"] % align == 0 and r["M"] % tp == 0
    got = {(r["shape"], r["M"], r["dtype"]): r for r in rows}
    qkv = got["llama3.1-8b.qkv", 4096, "fp8"]
    assert (qkv["op"], qkv["K"], qkv["N"]) == ("ag_gemm", 4096, (32 + 2 * 8) * 128 // tp)
    fc1 = got["llama3.1-8b.fc1", 1024, "bf16"]
    assert (fc1["op"], fc1["K"], fc1["N"]) == ("ag_gemm", 4096, 2 * 14336 // tp)
    proj = got["llama3.1-8b.proj", 32768, "bf16"]
    assert (proj["op"], proj["K"], proj["N"]) == ("gemm_rs", 4096 // tp, 4096)
    fc2 = got["qwen2.5-7b.fc2", 16384, "fp8"]
    assert (fc2["op"], fc2["K"], fc2["N"]) == ("gemm_rs", 18944 // tp, 3584)
    plain = got["gpt3-175b.fc1", 1024, "bf16"]  # GELU: no gate
    assert (plain["K"], plain["N"]) == (12288, 49152 // tp)
    mha = got["gpt-neox-20b.qkv", 1024, "bf16"]
    assert mha["N"] == 3 * 64 * 96 // tp
    # M = 32768 only up to hidden 4096 (benchmarks/data/model_families.json says why)
    assert {r["family"] for r in rows if r["M"] == 32768} == {
        f.name for f in suite.FAMILIES if f.hidden <= 4096
    }


def test_broad_suite_runs_tp_2_and_4_grouped_and_nothing_is_left_out_there() -> None:
    s = _broad()
    assert s.name == "broad" and not s.skipped
    assert len(s.rows) == 2 * BROAD_ROWS_PER_TP
    order = [r["tp"] for r in s.rows]
    assert order == sorted(order)  # grouped by TP size (one communicator per TP size)
    assert suite.build_suite(4, suite="broad", cuda=True) == list(s.rows)


def test_rows_that_do_not_split_or_align_are_left_out_with_the_reason() -> None:
    # Qwen2.5-7B's 28 query and 4 KV heads do not split over TP 8; its MLP rows still run
    s = _broad(8, tp_sizes=[8], families=["qwen2.5-7b"])
    assert {sk.shape for sk in s.skipped} == {"qwen2.5-7b.qkv", "qwen2.5-7b.proj"}
    assert all("28 q heads / 4 KV heads do not split over TP 8" in sk.reason for sk in s.skipped)
    assert {r["layer"] for r in s.rows} == {"fc1", "fc2"}
    assert len(s.rows) + len(s.skipped) == len(suite.FAMILIES[2].tokens) * 4 * 2
    # a width that is a multiple of 8, not of 16: FP8 rows are left out, bf16 rows run
    odd = suite.ModelFamily("odd", "test", 5128, 20512, 40, 40, 128, False, "GELU", (1024,))
    rows, skipped = suite.broad_rows(2, [odd])
    reasons = {(sk.shape, sk.dtype): sk.reason for sk in skipped}
    assert reasons["odd.fc1", "fp8"] == (
        "K = 5128 or N = 10256 is not a multiple of 16 (fp8 alignment)"
    )
    assert {dtype for _, dtype in reasons} == {"fp8"}
    assert {r["shape"] for r in rows} == {"odd.qkv", "odd.fc1", "odd.proj", "odd.fc2"}
    assert {(r["shape"], r["dtype"]) for r in rows}.isdisjoint(reasons)
    # GPT-3 13B's published width, 5140, is not even a multiple of 8 (16-byte bf16 rows)
    gpt3_13b = suite.ModelFamily("13b", "test", 5140, 20560, 40, 40, 128, False, "GELU", (1024,))
    rows, skipped = suite.broad_rows(2, [gpt3_13b])
    assert not rows and len(skipped) == 8
    assert {sk.reason.split(" is ")[1] for sk in skipped} == {
        "not a multiple of 8 (bf16 alignment)",
        "not a multiple of 16 (fp8 alignment)",
    }
    odd_ffn = suite.ModelFamily("ffn", "test", 4096, 14337, 32, 8, 128, True, "SiLU", (1024,))
    _, skipped = suite.broad_rows(2, [odd_ffn])
    assert {sk.shape for sk in skipped} == {"ffn.fc1", "ffn.fc2"}
    assert all(sk.reason == "the FFN (14337) or M (1024) does not split over TP 2"
               for sk in skipped)  # fmt: skip
    # the table and the listing group them by reason
    lines = suite.skipped_lines([sk.as_dict() for sk in skipped])
    assert lines == [
        "left out, the FFN (14337) or M (1024) does not split over TP 2: 4 rows (ag_gemm "
        "ffn.fc1 M=1024 tp=2 bf16, ag_gemm ffn.fc1 M=1024 tp=2 fp8, gemm_rs ffn.fc2 M=1024 "
        "tp=2 bf16, ...)"
    ]
    assert suite.skipped_lines(skipped, shown=4)[0].endswith("gemm_rs ffn.fc2 M=1024 tp=2 fp8)")


def test_broad_selection_options() -> None:
    s = _broad(tp_sizes=[4], families=["llama3.2-1b", "gpt3-175b"], tokens=[1024])
    assert {(r["family"], r["M"]) for r in s.rows} == {("llama3.2-1b", 1024), ("gpt3-175b", 1024)}
    assert len(s.rows) == 2 * 4 * 2
    by_layer = _broad(tp_sizes=[2], shapes=["fc2"], dtypes=["fp8"])
    assert {r["layer"] for r in by_layer.rows} == {"fc2"} and len(by_layer.rows) == 28
    assert {r["dtype"] for r in by_layer.rows} == {"fp8"}
    one = _broad(tp_sizes=[4], shapes=["llama3.1-405b.proj"], tokens=[16384])
    assert [_key(r) for r in one.rows] == [
        ("gemm_rs", "llama3.1-405b.proj", 16384, 4, d) for d in ("bf16", "fp8")
    ]
    assert {r["op"] for r in _broad(ops=["ag_gemm"]).rows} == {"ag_gemm"}
    # --tokens cuts the other suites too (before the host transport's scaling)
    full = suite.select_suite(4, full=True, cuda=False, tokens=[16384])
    assert {r["M"] for r in full.rows} == {64}  # 16384 / 256
    assert suite.select_suite(4, suite="full", cuda=True).rows == tuple(
        suite.build_suite(4, full=True, cuda=True)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"suite": "wide"}, r"unknown suite 'wide'; suites: \('quick', 'full', 'broad'\)"),
        ({"suite": "broad", "full": True}, "--full is the full suite: it does not go with"),
        ({"full": True, "families": ["gpt3-175b"]}, "--families selects model families of"),
        ({"families": ["gpt3-175b"]}, "--families selects model families of the broad"),
        ({"suite": "broad", "families": ["gpt4"]}, r"unknown families \['gpt4'\] in this suite"),
        ({"suite": "broad", "tokens": [2048]}, r"unknown tokens \[2048\] in this suite; tokens"),
        ({"suite": "full", "tokens": [1024]}, r"unknown tokens \[1024\] in this suite; tokens"),
        ({"suite": "broad", "shapes": ["gpt3-175b.fc3"]}, r"unknown shapes \['gpt3-175b.fc3'\]"),
        ({"suite": "broad", "ops": ["bulk_rs"]}, "leaves no row"),
        ({"suite": "broad", "tp_sizes": [3]}, r"TP sizes \[3\] do not divide the world size 4"),
    ],
)  # fmt: skip
def test_broad_selection_errors_say_what_was_wrong(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        suite.select_suite(4, cuda=True, **kwargs)


def test_a_selection_of_left_out_rows_only_says_so() -> None:
    with pytest.raises(ValueError, match=r"leaves no row \(4 left out: see --list\)"):
        suite.select_suite(
            8, suite="broad", cuda=True, tp_sizes=[8], families=["qwen2.5-7b"], shapes=["qkv"],
            tokens=[1024, 4096],
        )  # fmt: skip


def test_broad_host_rows_are_tiny_valid_twins() -> None:
    gpu = _broad().rows
    host = suite.select_suite(4, suite="broad", cuda=False).rows
    assert len(host) == len(gpu) and len({_key(r) for r in host}) == len(host)
    for g, h in zip(gpu, host, strict=True):
        assert (h["shape"], h["family"], h["layer"], h["tp"]) == (
            g["shape"], g["family"], g["layer"], g["tp"],
        )  # fmt: skip
        assert h["M"] % h["tp"] == 0 and h["M"] <= 128
        assert h["K"] % 16 == 0 and h["N"] % 16 == 0 and max(h["K"], h["N"]) <= 512
        # seconds on the CPU: a float64 GEMM of at most ~10 MFLOP
        assert 2 * h["M"] * h["K"] * h["N"] <= 10e6


def test_model_families_file_is_checked(tmp_path) -> None:
    data = json.loads(suite.MODEL_FAMILIES_FILE.read_text())
    assert data["provenance"] and suite.MODEL_FAMILIES_FILE.parent.name == "data"
    assert suite.load_model_families() == suite.FAMILIES
    fam = data["families"][0]
    for bad in (
        {"families": [{k: v for k, v in fam.items() if k != "ffn"}]},
        {"families": [fam, fam]},  # one name twice
        {"families": [{**fam, "hidden": 0}]},
        {"families": [{**fam, "hidden": 2048.0}]},
        {"families": [{**fam, "kv_heads": 5}]},  # 32 q heads in groups of 5
        {"families": [{**fam, "mlp": "moe"}]},
        {"families": [{**fam, "tokens": [4096, 1024]}]},
        {"families": []},
    ):
        path = tmp_path / "families.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not a valid model families file"):
            suite.load_model_families(path)


@pytest.mark.parametrize("tp", [2, 4])
def test_every_broad_row_has_a_registered_default_variant(tp: int) -> None:
    """NOTE [default variant]: a broad row's layer (not its <family>.<layer> shape) names its
    GEMM, so its default is the layer's."""
    names = {(v.op, v.name) for v in methods.registered()}
    for row in _broad(tp_sizes=[tp]).rows:
        default = methods.ub_default_variant(row["op"], row["layer"], tp)
        assert (row["op"], default) in names, row
        assert default == methods.ub_default_variant(row["op"], row["layer"], tp)


# --- the summaries by communication / GEMM ratio ---------------------------------------------


def _row(tp: int, gemm: float, comm: float, default: float, best: float, **over: object) -> dict:
    """A timed row (after add_metrics) with these times: T_seq = gemm + comm, torch 1.2 x the
    floor unless given."""
    floor = max(gemm, comm)
    row = {
        "op": "ag_gemm",
        "tp": tp,
        "T_gemm": gemm,
        "T_comm": comm,
        "T_seq": gemm + comm,
        "T_ours_by_variant": {"default": default, "other": best},
        "default_variant": "default",
        "T_torch": 1.2 * floor,
    }
    return report.add_metrics({**row, **over})


def test_ratio_buckets_include_their_bounds_in_the_middle_one() -> None:
    assert report.ratio_bucket({"T_gemm": 1.0, "T_comm": 0.49}) == "< 0.5"
    assert report.ratio_bucket({"T_gemm": 1.0, "T_comm": 0.5}) == "0.5-1.0"
    assert report.ratio_bucket({"T_gemm": 1.0, "T_comm": 1.0}) == "0.5-1.0"
    assert report.ratio_bucket({"T_gemm": 1.0, "T_comm": 1.01}) == "> 1.0"
    assert report.ratio_bucket({"T_gemm": None, "T_comm": 1.0}) is None


def test_ratio_summaries_count_medians_and_worst_per_tp_and_bucket() -> None:
    rows = [
        # TP 4, GEMM-bound (comm / GEMM 0.2): default/floor 1.05, 1.10, 1.15; best 1.02-1.06
        _row(4, 1.0, 0.2, 1.05, 1.02),
        _row(4, 1.0, 0.2, 1.10, 1.04),
        _row(4, 1.0, 0.2, 1.15, 1.06),
        # TP 4, balanced (0.8): the default slower than sequential (1.9 > 1.8) and than torch
        _row(4, 1.0, 0.8, 1.9, 1.2),
        # TP 4, comm-bound (2.0, floor 2.0): torch (2.4) faster than the default (2.6)
        _row(4, 1.0, 2.0, 2.6, 2.2, T_torch=2.4),
        # TP 2: one row, no torch time
        _row(2, 2.0, 0.5, 2.2, 2.1, T_torch=None),
        # TP 4, GEMM-bound, its default not timed (--methods left it out): best only
        _row(4, 1.0, 0.3, 1.2, 1.1, default_variant="not timed"),
    ]
    s = report.summarize_by_ratio(rows, host=False)
    assert s["meaningful"] and s["note"] is None
    assert s["buckets"] == ["< 0.5", "0.5-1.0", "> 1.0"] and list(s["by_tp"]) == ["2", "4"]
    tp4 = s["by_tp"]["4"]
    low = tp4["buckets"]["< 0.5"]
    assert (low["rows"], low["rows_with_default"], low["rows_timed"]) == (4, 3, 4)
    assert low["median_default_over_floor"] == pytest.approx(1.10)
    assert low["worst_default_over_floor"] == pytest.approx(1.15)
    assert low["median_best_over_floor"] == pytest.approx(
        statistics.median([1.02, 1.04, 1.06, 1.1])
    )
    assert low["worst_best_over_floor"] == pytest.approx(1.10)
    mid, high = tp4["buckets"]["0.5-1.0"], tp4["buckets"]["> 1.0"]
    assert (mid["rows"], mid["worst_default_over_floor"]) == (1, pytest.approx(1.9))
    assert (high["rows"], high["median_default_over_floor"]) == (1, pytest.approx(1.3))
    assert high["median_best_over_floor"] == pytest.approx(1.1)
    everything = tp4["all"]
    assert (everything["rows"], everything["rows_with_default"]) == (6, 5)
    assert everything["median_default_over_floor"] == pytest.approx(1.15)
    assert everything["worst_default_over_floor"] == pytest.approx(1.9)
    assert tp4["default"] == {
        "rows": 5,
        "slower_than_seq": 1,
        "rows_with_torch": 5,
        "faster_than_torch": 3,
        "share_faster_than_torch": pytest.approx(0.6),
    }
    assert tp4["best"]["rows"] == 6 and tp4["best"]["slower_than_seq"] == 0
    assert tp4["best"]["faster_than_torch"] == 5  # 2.2 < 2.4 too
    assert tp4["planned"]["rows"] == 0  # no row carries a plan
    tp2 = s["by_tp"]["2"]
    assert tp2["default"]["rows_with_torch"] == 0
    assert tp2["default"]["share_faster_than_torch"] is None
    assert tp2["buckets"]["< 0.5"]["rows"] == 1  # 0.5 / 2.0 = 0.25
    assert tp2["buckets"]["> 1.0"]["median_default_over_floor"] is None
    # the table's lines
    lines = report.ratio_summary_lines(s)
    assert lines[0].startswith("by T_comm / T_gemm") and "median <= 1.10, worst <= 1.25" in lines[0]
    assert (
        "  TP 4, T_comm/T_gemm < 0.5: 4 rows, default/floor median 1.100 worst 1.150 (3 timed), "
        "best/floor median 1.050 worst 1.100"
    ) in lines
    assert "  TP 2, T_comm/T_gemm > 1.0: 0 rows, default/floor -, best/floor -" in lines
    seq = next(ln for ln in lines if ln.startswith("  TP 4, default:"))
    assert "slower than sequential NCCL + cuBLASLt 1/5" in seq
    assert "faster than torch async-TP 3/5 (60%); best: " in seq


def test_ratio_summaries_count_the_planned_path_apart() -> None:
    """NOTE [planned column]: a plan that picked the sequential path over a default that was
    slower than sequential puts the row back at T_seq; one that kept a slower op counts."""
    plan_op = {"overlap": True, "op_ms": 1.0, "sequential_ms": 1.0}
    plan_seq = {"overlap": False, "op_ms": 2.0, "sequential_ms": 1.0}
    rows = [
        _row(4, 1.0, 0.8, 1.9, 1.2, plan=plan_seq),  # default 1.9 > T_seq 1.8: plan fixes it
        _row(4, 1.0, 0.8, 1.85, 1.2, plan=plan_op),  # kept the slower op: a plan's mistake
        _row(4, 1.0, 0.2, 1.05, 1.02, plan=plan_op),
    ]
    s = report.summarize_by_ratio(rows, host=False)
    tp4 = s["by_tp"]["4"]
    assert tp4["default"]["slower_than_seq"] == 2
    assert tp4["planned"]["rows"] == 3 and tp4["planned"]["slower_than_seq"] == 1
    mid = tp4["buckets"]["0.5-1.0"]
    assert mid["rows_with_planned"] == 2
    assert mid["worst_planned_over_floor"] == pytest.approx(1.85)
    assert mid["median_planned_over_floor"] == pytest.approx((1.8 + 1.85) / 2)
    text = "\n".join(report.ratio_summary_lines(s))
    assert "planned: slower than sequential NCCL + cuBLASLt 1/3" in text
    assert "planned/floor median" in text


def test_ratio_summaries_compare_nothing_on_the_host_transport() -> None:
    rows = [_row(4, 1.0, 3.0, 1.1, 1.0), _row(4, 1.0, 0.1, 1.1, 1.0)]
    s = report.summarize_by_ratio(rows, host=True)
    assert not s["meaningful"] and "gloo" in s["note"]
    assert s["by_tp"]["4"]["buckets"]["> 1.0"]["rows"] == 1  # the JSON keeps the counts
    (line,) = report.ratio_summary_lines(s)
    assert line.startswith("rows by T_comm / T_gemm: TP 4: < 0.5 1, 0.5-1.0 0, > 1.0 1")
    assert "not compared (host transport" in line and "median" not in line
    assert report.ratio_summary_lines(report.summarize_by_ratio([], host=False)) == []
    assert report.ratio_summary_lines(None) == []


def test_table_shows_ratio_summaries_and_rows_left_out() -> None:
    from benchmarks.common import timing_protocol

    rows = [{**_row(4, 1.0, 0.2, 1.05, 1.02), "shape": "gpt3-175b.fc1", "M": 1024, "K": 16,
             "N": 16, "dtype": "bf16"}]  # fmt: skip
    odd = suite.ModelFamily("odd", "test", 5140, 20560, 40, 40, 128, False, "GELU", (1024,))
    _, skipped = suite.broad_rows(2, [odd])
    meta = {
        "world_size": 4,
        "transport": "cuda",
        "timing": timing_protocol(cuda=True, queued=True, warmup=5, iters=20),
        "summary": report.summarize(rows),
        "summary_by_ratio": report.summarize_by_ratio(rows, host=False),
        "skipped_rows": [sk.as_dict() for sk in skipped],
    }
    text = report.table_text(rows, meta)
    assert "  TP 4, T_comm/T_gemm < 0.5: 1 rows, default/floor median 1.050" in text
    assert "left out, K = 5140 or N = 10280 is not a multiple of 16 (fp8 alignment)" in text
    assert "gpt3-175b.fc1" in text


def test_run_meta_names_the_suite_its_families_and_the_rows_left_out() -> None:
    s = _broad(8, tp_sizes=[8], families=["qwen2.5-7b", "gpt3-175b"], tokens=[1024])
    meta = report.run_meta(
        suite=s, cuda=True, world_size=8, environment={}, argv=[], timing={}, traces=None,
        variants=[],
    )  # fmt: skip
    assert meta["suite"] == "broad" and len(meta["skipped_rows"]) == 4
    fams = meta["model_families"]
    assert fams["file"] == "benchmarks/data/model_families.json"
    assert [f["name"] for f in fams["families"]] == ["qwen2.5-7b", "gpt3-175b"]
    assert all(f["source"] for f in fams["families"])
    quick = report.run_meta(
        suite=suite.select_suite(4, cuda=True), cuda=True, world_size=4, environment={},
        argv=[], timing={}, traces=None, variants=[],
    )  # fmt: skip
    assert quick["suite"] == "quick" and quick["model_families"] is None
    assert quick["skipped_rows"] == []


# --- the GPU-time estimate (--list) -----------------------------------------------------------


def test_estimate_counts_the_variants_each_row_times() -> None:
    rows = _broad(tp_sizes=[4], families=["llama3.1-8b"], tokens=[4096]).rows
    every = methods.registered()
    # at TP 4 on GPUs every registered variant of the op applies; on the host, no put splits
    ag4 = next(r for r in rows if r["op"] == "ag_gemm" and r["tp"] == 4)
    assert estimate.applicable_variants(ag4, every, cuda=True) == sum(
        v.op == "ag_gemm" for v in every
    )
    assert estimate.applicable_variants(ag4, every, cuda=False) < sum(
        v.op == "ag_gemm" for v in every
    )
    one = methods.select(["ag_gemm:pipeline/lanes2-split1-staggered"])
    assert estimate.applicable_variants(ag4, one, cuda=True) == 1


def test_estimate_grows_with_the_work_and_sums_by_tp() -> None:
    rows = _broad(tp_sizes=[2, 4], families=["llama3.1-405b"], tokens=[1024, 16384]).rows
    every = methods.registered()
    base = estimate.estimate_run(rows, every, warmup=5, iters=20, passes=2)
    assert base["seconds"] == pytest.approx(sum(base["by_tp"].values()))
    assert set(base["by_tp"]) == {"2", "4"} and len(base["rows"]) == len(rows)
    assert base["model"]["bf16_tflops"] == estimate.H100.bf16_tflops
    fewer = estimate.estimate_run(
        rows, methods.select(["*lanes1-split1*"]), warmup=5, iters=20, passes=2
    )
    one_pass = estimate.estimate_run(rows, every, warmup=5, iters=20, passes=1)
    heated = estimate.estimate_run(rows, every, warmup=5, iters=20, passes=2, heat_ms=50)
    assert fewer["seconds"] < base["seconds"] and one_pass["seconds"] < base["seconds"]
    assert heated["seconds"] > base["seconds"]
    # a bigger GEMM costs more: M = 16384 against 1024, bf16 against FP8
    by_key = {_key(r): e["est_s"] for r, e in zip(rows, base["rows"], strict=True)}
    shape = "llama3.1-405b.fc1"
    assert by_key["ag_gemm", shape, 16384, 4, "bf16"] > by_key["ag_gemm", shape, 1024, 4, "bf16"]
    assert by_key["ag_gemm", shape, 16384, 4, "bf16"] > by_key["ag_gemm", shape, 16384, 4, "fp8"]
    # the model's figures: 2 M K N / throughput, (tp - 1) / tp of the bytes over the bus
    row = {"op": "ag_gemm", "M": 8192, "K": 8192, "N": 8192, "tp": 4, "dtype": "bf16"}
    assert estimate.H100.gemm_ms(row) == pytest.approx(2 * 8192**3 / 600e9)
    assert estimate.H100.comm_ms(row) == pytest.approx(8192 * 8192 * 2 * 0.75 / 360e6)
    assert estimate.H100.comm_ms({**row, "dtype": "fp8"}) == pytest.approx(
        estimate.H100.comm_ms(row) / 2
    )


def test_listing_shows_rows_left_out_and_the_estimate() -> None:
    s = _broad(8, tp_sizes=[8], families=["qwen2.5-7b"], tokens=[1024])
    est = estimate.estimate_run(s.rows, methods.registered(), warmup=5, iters=20, passes=2)
    text = estimate.listing_text(s, est)
    assert text.startswith("broad suite: 4 rows (TP [8]), 4 left out")
    assert "est T_gemm" in text and "qwen2.5-7b.fc1" in text
    assert "left out, 28 q heads / 4 KV heads do not split over TP 8: 4 rows" in text
    assert "estimated GPU time on H100s: " in text and "not a measurement" in text
    host = estimate.listing_text(s, None)
    assert "est T_gemm" not in host and "estimated" not in host


def test_list_option_plans_a_run_without_ranks(tmp_path, capsys) -> None:
    """``--list`` prints the selection at ``--launch``'s world size and its GPU estimate, and
    starts nothing (no mpirun, no output files)."""
    from benchmarks import overlap_ops

    base = ["--launch", "8", "--cuda", "--out", str(tmp_path), "--suite", "broad", "--tp", "8"]
    assert overlap_ops.main([*base, "--families", "qwen2.5-7b", "--tokens", "1024", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("broad suite: 4 rows (TP [8]), 4 left out")
    assert "left out, 28 q heads / 4 KV heads do not split over TP 8" in out
    assert "estimated GPU time on H100s" in out and not any(tmp_path.iterdir())
    assert overlap_ops.main([*base, "--families", "gpt4", "--list"]) == 2
    assert "[overlap_ops] error: unknown families ['gpt4']" in capsys.readouterr().err
    host = ["--launch", "4", "--out", str(tmp_path), "--suite", "broad", "--tokens", "1024"]
    assert overlap_ops.main([*host, "--list"]) == 0
    out = capsys.readouterr().out
    assert "broad suite: 128 rows (TP [2, 4])" in out and "estimated" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--full", "--suite", "broad"], "--full is --suite full: it does not go with"),
        (["--tokens", "1k"], "--tokens takes whole numbers"),
        (["--suite", "wide"], "invalid choice: 'wide'"),
    ],
)
def test_suite_options_refused_by_the_parser(capsys, args: list[str], message: str) -> None:
    from benchmarks import overlap_ops

    with pytest.raises(SystemExit):
        overlap_ops.parse_args(["--out", "x", *args])
    assert message in capsys.readouterr().err

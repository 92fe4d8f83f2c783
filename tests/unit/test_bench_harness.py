"""The overlap benchmark's harness without ranks: the suite and its TE reference data, the
metrics, summary, table and plot (benchmarks/overlap_suite.py, overlap_report.py, plot.py) and
the command lines (overlap_ops.py, run.py). Timing: test_bench_timing.py; the methods
registry: test_bench_methods.py."""

from __future__ import annotations

import builtins
import json
import random
import statistics

import pytest

from benchmarks import overlap_report as report
from benchmarks import overlap_suite as suite
from benchmarks.common import plot_times, timing_protocol


def _key(r: dict) -> tuple:
    return (r["op"], r["shape"], r["M"], r["tp"], r["dtype"])


def test_quick_suite_is_a_few_rows_of_both_ops_and_dtypes_at_the_world_size() -> None:
    rows = suite.build_suite(4, full=False, cuda=True)
    assert 0 < len(rows) <= 8
    assert {r["op"] for r in rows} == {"ag_gemm", "gemm_rs", "bulk_ag", "bulk_rs"}
    assert {r["dtype"] for r in rows} == {"bf16", "fp8"}
    assert {r["tp"] for r in rows} == {4}
    assert {r["M"] for r in rows} == {8192}


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_full_suite_covers_design_shapes_and_te_shapes(world: int) -> None:
    rows = suite.build_suite(world, full=True, cuda=True)
    tps = sorted({t for t in (2, 4) if world % t == 0 and t <= world} | {world})
    assert sorted({r["tp"] for r in rows}) == tps
    assert len({_key(r) for r in rows}) == len(rows)  # no duplicate row
    for tp in tps:
        for m in (8192, 16384):
            for d in ("bf16", "fp8"):
                got = {r["shape"]: r for r in rows if r["tp"] == tp and r["M"] == m}
                assert set(got) >= {"fc1", "qkv", "fc2", "proj"}
                fc1 = next(
                    r for r in rows if _key(r) == ("ag_gemm", "fc1", m, tp, d)
                )  # AG+GEMM: K = hidden, local N
                assert (fc1["K"], fc1["N"]) == (8192, 2 * 28672 // tp)
                qkv = next(r for r in rows if _key(r) == ("ag_gemm", "qkv", m, tp, d))
                assert (qkv["K"], qkv["N"]) == (8192, 10240 // tp)
                fc2 = next(r for r in rows if _key(r) == ("gemm_rs", "fc2", m, tp, d))
                assert (fc2["K"], fc2["N"]) == (28672 // tp, 8192)
                proj = next(r for r in rows if _key(r) == ("gemm_rs", "proj", m, tp, d))
                assert (proj["K"], proj["N"]) == (8192 // tp, 8192)
        for hidden in (8192, 4096):
            te = [r for r in rows if r["tp"] == tp and r["shape"] == f"te{hidden}"]
            assert {(r["op"], r["dtype"]) for r in te} == {
                (op, d) for op in ("ag_gemm", "gemm_rs") for d in ("bf16", "fp8")
            }
            assert all((r["M"], r["K"], r["N"]) == (8192, hidden, hidden) for r in te)
        # bulk rows (NOTE [bulk rows]): the backward of qkv and fc1, K = hidden, local N
        bulk = {_key(r): r for r in rows if r["tp"] == tp and r["op"] in ("bulk_ag", "bulk_rs")}
        assert set(bulk) == {
            (op, name, m, tp, d)
            for op in ("bulk_ag", "bulk_rs")
            for name in ("qkv", "fc1")
            for m in (8192, 16384)
            for d in ("bf16", "fp8")
        }
        assert (
            bulk["bulk_rs", "fc1", 8192, tp, "fp8"]["K"],
            bulk["bulk_rs", "fc1", 8192, tp, "fp8"]["N"],
        ) == (8192, 2 * 28672 // tp)
        assert bulk["bulk_ag", "qkv", 16384, tp, "bf16"]["N"] == 10240 // tp
    # rows are grouped by TP size (one communicator per TP size)
    order = [r["tp"] for r in rows]
    assert order == sorted(order, key=tps.index)


def test_suite_filters_and_rejections() -> None:
    rows = suite.build_suite(4, full=True, cuda=True, tp_sizes=[2], shapes=["proj"])
    assert {(r["tp"], r["shape"]) for r in rows} == {(2, "proj")}
    assert {r["M"] for r in rows} == {8192, 16384}
    rows = suite.build_suite(4, full=False, cuda=True, dtypes=["fp8"])
    assert {r["dtype"] for r in rows} == {"fp8"}
    with pytest.raises(ValueError, match=r"TP sizes \[3\] do not divide the world size 4"):
        suite.build_suite(4, full=True, cuda=True, tp_sizes=[3])
    rows = suite.build_suite(4, full=True, cuda=True, ops=["bulk_rs"], shapes=["qkv"])
    assert {(r["op"], r["shape"]) for r in rows} == {("bulk_rs", "qkv")}
    with pytest.raises(ValueError, match=r"unknown dtypes or ops \['fp16'\]"):
        suite.build_suite(4, full=True, cuda=True, dtypes=["fp16"])
    with pytest.raises(ValueError, match=r"unknown dtypes or ops \['bulk'\]"):
        suite.build_suite(4, full=True, cuda=True, ops=["bulk"])
    with pytest.raises(ValueError, match=r"unknown shapes \['te8192'\]"):
        suite.build_suite(4, full=False, cuda=True, shapes=["te8192"])
    with pytest.raises(ValueError, match="leaves no row"):
        suite.build_suite(4, full=False, cuda=True, shapes=["fc1"], dtypes=["fp8"])


def test_host_rows_are_tiny_twins_of_the_gpu_rows() -> None:
    gpu = suite.build_suite(4, full=True, cuda=True)
    host = suite.build_suite(4, full=True, cuda=False)
    assert [_key(r)[:2] + _key(r)[3:] for r in gpu] == [_key(r)[:2] + _key(r)[3:] for r in host]
    for g, h in zip(gpu, host, strict=True):
        assert h["M"] % h["tp"] == 0 and h["M"] <= 64
        assert h["K"] % 16 == 0 and h["N"] % 16 == 0 and max(h["K"], h["N"]) <= 256
        assert h["M"] < g["M"] and h["K"] <= g["K"] and h["N"] <= g["N"]
    # the two token counts stay distinct rows
    assert len({_key(r) for r in host}) == len(host)


def test_te_reference_only_on_matching_gpu_rows() -> None:
    rows = suite.build_suite(4, full=True, cuda=True)
    with_ref = [r for r in rows if suite.te_reference(r, cuda=True)]
    assert {(r["op"], r["K"], r["dtype"]) for r in with_ref} == set(suite.TE_BEST_4XH200)
    assert all(r["tp"] == 4 and r["M"] == 8192 and r["shape"].startswith("te") for r in with_ref)
    assert (
        suite.te_reference(with_ref[0], cuda=True)
        == suite.TE_BEST_4XH200[(with_ref[0]["op"], with_ref[0]["K"], with_ref[0]["dtype"])]
    )
    # never on the host transport, never at TP = 2 (not what TE measured)
    host = suite.build_suite(4, full=True, cuda=False)
    assert not any(suite.te_reference(r, cuda=False) for r in host)
    two = suite.build_suite(2, full=True, cuda=True)
    assert not any(suite.te_reference(r, cuda=True) for r in two)
    # a Llama row with K == N (none in the suite) does not borrow TE's time
    fake = {"op": "ag_gemm", "shape": "fc1", "M": 8192, "K": 8192, "N": 8192, "tp": 4}
    assert suite.te_reference({**fake, "dtype": "bf16"}, cuda=True) is None
    # TE's own floor: on exactly the same rows, max of its T_gemm and T_comm (docs/design.md §6)
    assert set(suite.TE_FLOOR_4XH200) == set(suite.TE_BEST_4XH200)
    floors = {_key(r): suite.te_floor_reference(r, cuda=True) for r in rows}
    assert {k for k, v in floors.items() if v is not None} == {_key(r) for r in with_ref}
    te_fp8 = {"op": "gemm_rs", "shape": "te4096", "M": 8192, "K": 4096, "N": 4096, "tp": 4}
    assert suite.te_floor_reference({**te_fp8, "dtype": "fp8"}, cuda=True) == 0.19
    assert suite.te_floor_reference({**te_fp8, "dtype": "fp8", "tp": 2}, cuda=True) is None
    assert suite.te_floor_reference({**fake, "dtype": "bf16"}, cuda=True) is None


def test_te_reference_comes_from_the_data_file_with_its_source(tmp_path) -> None:
    """TE's times live in benchmarks/data/te_reference.json (with where each figure comes
    from), not in code; a malformed file is refused with its path."""
    data = json.loads(suite.TE_REFERENCE_FILE.read_text())
    assert suite.TE_REFERENCE_FILE.parent.name == "data"
    assert data["provenance"] and "docs/design.md §6" in " ".join(data["provenance"])
    assert "4xH200" in suite.TE_SOURCE and "not measured by this run" in suite.TE_SOURCE
    assert (suite.TE_TP, suite.TE_TOKENS) == (4, 8192)
    assert len(suite.TE_BEST_4XH200) == 8
    assert suite.TE_BEST_4XH200["ag_gemm", 8192, "bf16"] == (1.48, "ring")
    assert suite.TE_BEST_4XH200["gemm_rs", 4096, "fp8"] == (0.29, "ring")
    assert suite.TE_FLOOR_4XH200["ag_gemm", 4096, "fp8"] == (0.18, 0.11)
    assert suite.load_te_reference() == suite.TE
    row = data["rows"][0]
    for bad in (
        {**data, "rows": [{k: v for k, v in row.items() if k != "te_comm_ms"}]},
        {**data, "rows": [row, row]},  # one key twice
        {**data, "rows": [{**row, "te_best_ms": 0}]},
        {**data, "rows": [{**row, "dtype": "fp16"}]},
        {k: v for k, v in data.items() if k != "source"},
    ):
        path = tmp_path / "te.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not a valid TE reference file"):
            suite.load_te_reference(path)


def _random_row(rng: random.Random, **over: object) -> dict:
    gemm_t, comm_t = rng.uniform(0.2, 3.0), rng.uniform(0.1, 1.0)
    row = {
        "op": "ag_gemm",
        "T_gemm": gemm_t,
        "T_comm": comm_t,
        "T_seq": gemm_t + comm_t * rng.uniform(0.8, 1.0),
        "T_ours_by_variant": {f"v{i}": rng.uniform(0.9, 1.5) * gemm_t for i in range(3)},
        "T_torch": rng.uniform(0.5, 4.0),
        "T_te_ref": rng.uniform(0.5, 4.0),
        "te_ref_floor": rng.uniform(0.3, 3.0),
    }
    row.update(over)
    return row


def test_metrics_follow_the_design_formulas() -> None:
    rng = random.Random()
    r = report.add_metrics(_random_row(rng))
    best = min(r["T_ours_by_variant"].values())
    assert r["T_ours"] == best and r["T_ours_by_variant"][r["best_variant"]] == best
    floor = max(r["T_gemm"], r["T_comm"])
    assert r["floor"] == floor
    assert r["ours_over_floor"] == pytest.approx(best / floor)
    eff = 1 - (best - r["T_gemm"]) / (r["T_seq"] - r["T_gemm"])
    assert r["efficiency"] == pytest.approx(eff)
    assert r["vs_torch"] == pytest.approx(best / r["T_torch"])
    assert r["vs_te"] == pytest.approx(best / r["T_te_ref"])
    assert r["te_ref_over_floor"] == pytest.approx(r["T_te_ref"] / r["te_ref_floor"])
    # absent peers and variants give None, not a crash or a made-up number
    r = report.add_metrics(
        _random_row(rng, T_torch=None, T_te_ref=None, te_ref_floor=None, T_ours_by_variant={})
    )
    assert r["T_ours"] is None and r["best_variant"] is None
    assert r["ours_over_floor"] is r["vs_torch"] is r["vs_te"] is r["efficiency"] is None
    assert r["te_ref_over_floor"] is None


def test_summary_counts_targets_and_peers() -> None:
    rng = random.Random()
    rows = [report.add_metrics(_random_row(rng)) for _ in range(9)]
    rows.append(report.add_metrics(_random_row(rng, T_torch=None, T_te_ref=None)))
    no_floor = report.add_metrics(_random_row(rng, te_ref_floor=None))  # TE's time, no floor
    s_more = report.summarize([*rows, no_floor])
    assert s_more["rows_with_te_ref"] == 10 and s_more["rows_with_te_ref_ratio"] == 9
    s = report.summarize(rows)
    ratios = [r["ours_over_floor"] for r in rows]
    assert s["rows"] == s["rows_timed"] == 10
    assert s["rows_within_target"] == sum(x <= 1.10 for x in ratios)
    assert s["median_ours_over_floor"] == pytest.approx(statistics.median(ratios))
    assert s["worst_ours_over_floor"] == max(ratios)
    assert s["rows_with_torch"] == s["rows_with_te_ref"] == 9
    assert s["rows_faster_than_torch"] == sum(r["T_ours"] < r["T_torch"] for r in rows[:9])
    assert s["rows_faster_than_te_ref"] == sum(r["T_ours"] < r["T_te_ref"] for r in rows[:9])
    nearer = sum(r["ours_over_floor"] < r["te_ref_over_floor"] for r in rows[:9])
    assert s["rows_with_te_ref_ratio"] == 9 and s["rows_nearer_floor_than_te_ref"] == nearer
    line = report.summary_line(s)
    assert f"nearer our floor than TE to its own: {nearer}/9" in line
    assert f"{s['rows_within_target']}/10" in line
    assert f"{s['rows_faster_than_torch']}/9" in line and "TE" in line
    bulk = report.summary_line(s, bulk=True)  # its torch column is NCCL on a side stream
    assert f"NCCL on a side stream: {s['rows_faster_than_torch']}/9" in bulk
    assert "TE" not in bulk and "async-TP" not in bulk
    main, side = report.split_rows([{"op": "bulk_rs"}, {"op": "ag_gemm"}, {"op": "bulk_ag"}])
    assert [r["op"] for r in main] == ["ag_gemm"] and [r["op"] for r in side] == [
        "bulk_rs",
        "bulk_ag",
    ]


def _check_target_counts(s: dict, name: str, ratios: list[float]) -> None:
    """The summary ``s`` counts ``ratios`` (times over the floor) under ``name``."""
    assert s[f"rows_with_{name}"] == len(ratios)
    assert s[f"rows_{name}_within_target"] == sum(x <= 1.10 for x in ratios)
    assert s[f"median_{name}_over_floor"] == pytest.approx(statistics.median(ratios))
    assert s[f"worst_{name}_over_floor"] == max(ratios)


def test_default_variant_is_timed_beside_the_best_and_counted_apart() -> None:
    """NOTE [default variant]: T_default is the time of the variant initialize_ub runs by
    default; rows without it (not timed, or no variant runs it) stay out of its counts."""
    rng = random.Random()
    rows = [report.add_metrics(_random_row(rng, default_variant="v1")) for _ in range(5)]
    for r in rows:
        assert r["T_default"] == r["T_ours_by_variant"]["v1"] >= r["T_ours"]
        assert r["default_over_floor"] == pytest.approx(r["T_default"] / r["floor"])
    untimed = report.add_metrics(_random_row(rng, default_variant="not timed"))
    unknown = report.add_metrics(_random_row(rng, default_variant=None))
    assert untimed["T_default"] is untimed["default_over_floor"] is unknown["T_default"] is None
    s = report.summarize([*rows, untimed, unknown])
    _check_target_counts(s, "default", [r["default_over_floor"] for r in rows])
    line = report.summary_line(s)
    assert f"initialize_ub's defaults: {s['rows_default_within_target']}/5 <= 1.10" in line
    assert "initialize_ub" not in report.summary_line(report.summarize([untimed, unknown]))


def test_planned_column_is_the_path_the_shape_plan_picked() -> None:
    """NOTE [planned column]: T_planned is T_default where the row's plan kept the op, the
    variant of an alternate setting where it picked one, T_seq where it picked the sequential
    path, and absent without a plan or a default time."""
    rng = random.Random()
    op = report.add_metrics(
        _random_row(rng, default_variant="v1", plan={"overlap": True, "op_ms": 1.0,
                                                     "sequential_ms": 2.0})
    )  # fmt: skip
    seq = report.add_metrics(
        _random_row(rng, default_variant="v1", plan={"overlap": False, "op_ms": 2.0,
                                                     "sequential_ms": 1.0})
    )  # fmt: skip
    none = report.add_metrics(_random_row(rng, default_variant="v1"))
    untimed = report.add_metrics(
        _random_row(rng, default_variant="not timed", plan={"overlap": True, "op_ms": 1.0,
                                                            "sequential_ms": 2.0})
    )  # fmt: skip
    alternate = report.add_metrics(
        _random_row(rng, default_variant="v1", plan={"path": "lanes=1", "variant": "v2",
                                                     "overlap": True, "op_ms": 2.0,
                                                     "sequential_ms": 2.0})
    )  # fmt: skip
    assert op["T_planned"] == op["T_default"] and seq["T_planned"] == seq["T_seq"]
    assert alternate["T_planned"] == alternate["T_ours_by_variant"]["v2"]  # NOTE [plan alternates]
    assert seq["planned_over_floor"] == pytest.approx(seq["T_seq"] / seq["floor"])
    assert none["T_planned"] is untimed["T_planned"] is None
    s = report.summarize([op, seq, none, untimed])
    _check_target_counts(s, "planned", [op["planned_over_floor"], seq["planned_over_floor"]])
    assert "planned by shape (the default on GPUs): " in report.summary_line(s)
    assert "planned" not in report.summary_line(report.summarize([none]))


def test_pipeline_floor_adds_one_chunk_gemm_to_our_collective() -> None:
    """NOTE [pipeline floor]: max(T_gemm, T_gemm_chunked / tp + T_comm_ours), for the rows
    that measured our collective (not bulk rows, which have no chunked GEMM)."""
    rng = random.Random()
    comm_bound = report.add_metrics(
        _random_row(rng, T_gemm=1.0, T_gemm_chunked=1.2, tp=4, T_comm_ours=0.9)
    )
    assert comm_bound["pipeline_floor"] == pytest.approx(1.2 / 4 + 0.9)
    gemm_bound = report.add_metrics(
        _random_row(rng, T_gemm=1.0, T_gemm_chunked=1.0, tp=2, T_comm_ours=0.2)
    )
    assert gemm_bound["pipeline_floor"] == 1.0
    ours = gemm_bound["T_ours"]
    assert gemm_bound["ours_over_pipeline_floor"] == pytest.approx(ours / 1.0)
    bulk = report.add_metrics(_random_row(rng, T_gemm_chunked=None, tp=4, T_comm_ours=None))
    assert bulk["pipeline_floor"] is bulk["ours_over_pipeline_floor"] is None


def test_concurrent_floor_is_counted_against_the_target_apart() -> None:
    """NOTE [concurrent floor]: T_concurrent (the GEMM beside our copies of its bytes)
    over the floor, and ours over it; rows without it (bulk rows) stay out of its counts."""
    rng = random.Random()
    rows = [
        report.add_metrics(_random_row(rng, T_concurrent=rng.uniform(0.9, 1.3))) for _ in range(7)
    ]
    for r in rows:
        assert r["concurrent_over_floor"] == pytest.approx(r["T_concurrent"] / r["floor"])
        assert r["ours_over_concurrent"] == pytest.approx(r["T_ours"] / r["T_concurrent"])
    bulk = report.add_metrics(_random_row(rng, op="bulk_rs"))
    assert bulk["concurrent_over_floor"] is bulk["ours_over_concurrent"] is None
    s = report.summarize([*rows, bulk])
    _check_target_counts(s, "concurrent", [r["concurrent_over_floor"] for r in rows])
    line = report.summary_line(s)
    assert f"no dependencies: {s['rows_concurrent_within_target']}/7 <= 1.10" in line
    assert "no dependencies" not in report.summary_line(report.summarize([bulk]))


def test_host_bound_rows_are_counted_where_enqueue_times_were_measured() -> None:
    """NOTE [host-bound rows]: a row counts as host-bound when enqueueing its best variant (or
    torch's op) took the host longer than the GPU's time for it; rows without host times (the
    host transport) are left out of the count and of the summary line."""
    rng = random.Random()
    slow = {"v0": 9.0, "v1": 9.0, "v2": 9.0}  # ms: longer than any GPU time of _random_row
    fast = {"v0": 0.01, "v1": 0.01, "v2": 0.01}
    rows = [
        report.add_metrics(_random_row(rng, host_ms_by_variant=slow, host_ms_torch=0.01)),
        report.add_metrics(_random_row(rng, host_ms_by_variant=fast, host_ms_torch=9.0)),
        report.add_metrics(_random_row(rng, host_ms_by_variant=fast, host_ms_torch=None)),
        report.add_metrics(_random_row(rng)),
    ]
    assert rows[0]["host_ms"] == 9.0 and rows[3]["host_ms"] is None
    s = report.summarize(rows)
    assert (s["rows_with_host_time"], s["rows_host_bound"]) == (3, 1)
    assert (s["rows_with_torch_host_time"], s["rows_torch_host_bound"]) == (2, 1)
    assert "host-bound (enqueue > GPU time): ours 1/3, torch 1/2" in report.summary_line(s)
    assert "NCCL 1/2" in report.summary_line(s, bulk=True)
    assert "host-bound" not in report.summary_line(report.summarize(rows[3:]))


def test_table_marks_missing_peers_and_the_te_reference() -> None:
    rng = random.Random()
    base = {"shape": "fc1", "M": 32, "K": 64, "N": 64, "tp": 4, "dtype": "bf16"}
    rows = [report.add_metrics({**_random_row(rng, T_torch=None, T_te_ref=None), **base})]
    meta = {
        "world_size": 4,
        "transport": "host",
        "timing": timing_protocol(cuda=False, queued=False, warmup=1, iters=3),
        "summary": report.summarize(rows),
    }
    text = report.table_text(rows, meta)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("op"))
    for col in ("T_gemm", "T_comm", "T_seq", "torch", "T_ours", "ours/floor", "vs torch", "TE*"):
        assert col in header
    assert " n/a " in text and "measured on 4xH200" in text and "summary:" in text
    # the reasons for n/a are listed once each, with their row count
    rows = rows * 2
    rows[0] = {**rows[0], "torch_error": "RuntimeError: no symm mem", "variant_errors": {"x": "E"}}
    rows[1] = {**rows[1], "torch_error": "RuntimeError: no symm mem"}
    text = report.table_text(rows, meta)
    assert "torch n/a: RuntimeError: no symm mem (2 rows)" in text
    assert "ag_gemm:x n/a: E (1 rows)" in text


def test_host_transport_summary_counts_nothing_against_the_targets() -> None:
    """On the host transport the floor is gloo's on tiny CPU shapes: the summary lines say
    how many rows were timed and why nothing is counted, in the table and in benchmarks.run's
    closing lines; the JSON's counts stay as they are."""
    rng = random.Random()
    rows = [report.add_metrics(_random_row(rng)) for _ in range(3)]
    rows.append(report.add_metrics(_random_row(rng, op="bulk_ag")))
    main, bulk = report.split_rows(rows)
    result = {
        "transport": "host",
        "summary": report.summarize(main),
        "summary_bulk": report.summarize(bulk),
    }
    lines = dict(report.summary_lines(result, "main", "bulk"))
    assert lines["main"].startswith("3/3 rows timed; none counted against the 1.10 x floor")
    assert lines["bulk"].startswith("1/1 rows timed; none counted")
    for line in lines.values():
        assert "gloo" in line and "rows <=" not in line and "median" not in line
    assert "rows_within_target" in result["summary"]
    gpu = dict(report.summary_lines({**result, "transport": "cuda"}, "main", "bulk"))
    assert gpu["main"].startswith("rows <= 1.10 x floor: ")
    assert gpu["bulk"] == report.summary_line(result["summary_bulk"], bulk=True)
    meta = {
        **result,
        "world_size": 4,
        "timing": timing_protocol(cuda=False, queued=False, warmup=1, iters=3),
    }
    text = report.table_text(rows, meta)
    assert "summary: 3/3 rows timed; none counted" in text
    assert "bulk rows: 1/1 rows timed; none counted" in text
    # without bulk rows, no bulk line
    assert report.summary_lines({**result, "summary_bulk": report.summarize([])}, "m", "b") == [
        ("m", lines["main"])
    ]


def test_plot_labels_name_their_fields_and_keep_the_legend_off_the_bars(tmp_path) -> None:
    from benchmarks.plot import tick_label

    row = {"op": "ag_gemm", "shape": "fc1", "M": 32, "tp": 4, "dtype": "bf16"}
    keys = ("op", "shape", "M", "tp", "dtype")
    assert tick_label(row, keys) == "ag_gemm\nfc1\nM=32\ntp=4\nbf16"
    pytest.importorskip("matplotlib")
    rng = random.Random()
    rows = [report.add_metrics({**_random_row(rng), **row, "M": 32 * (i + 1)}) for i in range(3)]
    # the host transport's plot has no target line (report.plot)
    meta = {"transport": "host", "world_size": 4}
    path = report.plot(rows, meta, tmp_path / "host.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot(rows, {**meta, "transport": "cuda"}, tmp_path / "gpu.png") is not None


def test_plot_writes_a_png_or_says_why_not(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    rng = random.Random()
    rows = [
        report.add_metrics({**_random_row(rng), "shape": f"s{i}", "dtype": "bf16"})
        for i in range(3)
    ]
    path = plot_times(rows, ("shape", "dtype"), [("T_ours", "ours")], tmp_path / "p.png", "t")
    assert path == tmp_path / "p.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    missing = tmp_path / "none.png"
    assert plot_times(rows, ("shape",), [("T_ours", "ours")], missing, "t") is None
    assert not missing.exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_help_names_the_commands_and_documents_every_option(capsys) -> None:
    """``--help`` of the main job and of the overlap benchmark: the command to type (not
    ``run.py``), and a help text for every option."""
    from benchmarks import overlap_ops, run

    parser, args = run.parse_args([])
    assert parser.prog == "python -m benchmarks.run" and args.transport == "auto"
    undocumented = [a.dest for a in parser._actions if not a.help]
    assert not undocumented
    with pytest.raises(SystemExit):
        run.parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks.run") and "scripts/bench.sh" in out
    assert "run.py" not in out
    with pytest.raises(SystemExit):
        overlap_ops.parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m benchmarks.overlap_ops")
    assert "see --help" not in out and "overlap_ops.json" in out
    options = [ln.split()[0] for ln in out.splitlines() if ln.startswith("  --")]
    assert "--out" in options and "--launch" in options
    # every option line carries its help on the same line or the next one
    text = out.split("options:")[1]
    for opt in options:
        after = text.split(f"  {opt}", 1)[1].split("\n  --", 1)[0]
        assert len(after.split()) > 2, opt

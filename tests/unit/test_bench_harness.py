"""The overlap benchmark's harness without ranks: suite, TE reference, metrics, summary, method
registry, progress lines and the plot (benchmarks/overlap_ops.py, methods.py, common.py)."""

from __future__ import annotations

import builtins
import io
import random
import re
import statistics
import types

import pytest

from benchmarks import methods
from benchmarks import overlap_ops as bench
from benchmarks.common import Progress, plot_times, timing_protocol


def _key(r: dict) -> tuple:
    return (r["op"], r["shape"], r["M"], r["tp"], r["dtype"])


def test_quick_suite_is_a_few_rows_of_both_ops_and_dtypes_at_the_world_size() -> None:
    rows = bench.build_suite(4, full=False, cuda=True)
    assert 0 < len(rows) <= 8
    assert {r["op"] for r in rows} == {"ag_gemm", "gemm_rs", "bulk_ag", "bulk_rs"}
    assert {r["dtype"] for r in rows} == {"bf16", "fp8"}
    assert {r["tp"] for r in rows} == {4}
    assert {r["M"] for r in rows} == {8192}


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_full_suite_covers_design_shapes_and_te_shapes(world: int) -> None:
    rows = bench.build_suite(world, full=True, cuda=True)
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
    rows = bench.build_suite(4, full=True, cuda=True, tp_sizes=[2], shapes=["proj"])
    assert {(r["tp"], r["shape"]) for r in rows} == {(2, "proj")}
    assert {r["M"] for r in rows} == {8192, 16384}
    rows = bench.build_suite(4, full=False, cuda=True, dtypes=["fp8"])
    assert {r["dtype"] for r in rows} == {"fp8"}
    with pytest.raises(ValueError, match=r"TP sizes \[3\] do not divide the world size 4"):
        bench.build_suite(4, full=True, cuda=True, tp_sizes=[3])
    rows = bench.build_suite(4, full=True, cuda=True, ops=["bulk_rs"], shapes=["qkv"])
    assert {(r["op"], r["shape"]) for r in rows} == {("bulk_rs", "qkv")}
    with pytest.raises(ValueError, match=r"unknown dtypes or ops \['fp16'\]"):
        bench.build_suite(4, full=True, cuda=True, dtypes=["fp16"])
    with pytest.raises(ValueError, match=r"unknown dtypes or ops \['bulk'\]"):
        bench.build_suite(4, full=True, cuda=True, ops=["bulk"])
    with pytest.raises(ValueError, match=r"unknown shapes \['te8192'\]"):
        bench.build_suite(4, full=False, cuda=True, shapes=["te8192"])
    with pytest.raises(ValueError, match="leaves no row"):
        bench.build_suite(4, full=False, cuda=True, shapes=["fc1"], dtypes=["fp8"])


def test_host_rows_are_tiny_twins_of_the_gpu_rows() -> None:
    gpu = bench.build_suite(4, full=True, cuda=True)
    host = bench.build_suite(4, full=True, cuda=False)
    assert [_key(r)[:2] + _key(r)[3:] for r in gpu] == [_key(r)[:2] + _key(r)[3:] for r in host]
    for g, h in zip(gpu, host, strict=True):
        assert h["M"] % h["tp"] == 0 and h["M"] <= 64
        assert h["K"] % 16 == 0 and h["N"] % 16 == 0 and max(h["K"], h["N"]) <= 256
        assert h["M"] < g["M"] and h["K"] <= g["K"] and h["N"] <= g["N"]
    # the two token counts stay distinct rows
    assert len({_key(r) for r in host}) == len(host)


def test_te_reference_only_on_matching_gpu_rows() -> None:
    rows = bench.build_suite(4, full=True, cuda=True)
    with_ref = [r for r in rows if bench.te_reference(r, cuda=True)]
    assert {(r["op"], r["K"], r["dtype"]) for r in with_ref} == set(bench.TE_BEST_4XH200)
    assert all(r["tp"] == 4 and r["M"] == 8192 and r["shape"].startswith("te") for r in with_ref)
    assert (
        bench.te_reference(with_ref[0], cuda=True)
        == bench.TE_BEST_4XH200[(with_ref[0]["op"], with_ref[0]["K"], with_ref[0]["dtype"])]
    )
    # never on the host transport, never at TP = 2 (not what TE measured)
    host = bench.build_suite(4, full=True, cuda=False)
    assert not any(bench.te_reference(r, cuda=False) for r in host)
    two = bench.build_suite(2, full=True, cuda=True)
    assert not any(bench.te_reference(r, cuda=True) for r in two)
    # a Llama row with K == N (none in the suite) does not borrow TE's time
    fake = {"op": "ag_gemm", "shape": "fc1", "M": 8192, "K": 8192, "N": 8192, "tp": 4}
    assert bench.te_reference({**fake, "dtype": "bf16"}, cuda=True) is None
    # TE's own floor: on exactly the same rows, max of its T_gemm and T_comm (docs/design.md §6)
    assert set(bench.TE_FLOOR_4XH200) == set(bench.TE_BEST_4XH200)
    floors = {_key(r): bench.te_floor_reference(r, cuda=True) for r in rows}
    assert {k for k, v in floors.items() if v is not None} == {_key(r) for r in with_ref}
    te_fp8 = {"op": "gemm_rs", "shape": "te4096", "M": 8192, "K": 4096, "N": 4096, "tp": 4}
    assert bench.te_floor_reference({**te_fp8, "dtype": "fp8"}, cuda=True) == 0.19
    assert bench.te_floor_reference({**te_fp8, "dtype": "fp8", "tp": 2}, cuda=True) is None
    assert bench.te_floor_reference({**fake, "dtype": "bf16"}, cuda=True) is None


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
    r = bench.add_metrics(_random_row(rng))
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
    r = bench.add_metrics(
        _random_row(rng, T_torch=None, T_te_ref=None, te_ref_floor=None, T_ours_by_variant={})
    )
    assert r["T_ours"] is None and r["best_variant"] is None
    assert r["ours_over_floor"] is r["vs_torch"] is r["vs_te"] is r["efficiency"] is None
    assert r["te_ref_over_floor"] is None


def test_summary_counts_targets_and_peers() -> None:
    rng = random.Random()
    rows = [bench.add_metrics(_random_row(rng)) for _ in range(9)]
    rows.append(bench.add_metrics(_random_row(rng, T_torch=None, T_te_ref=None)))
    no_floor = bench.add_metrics(_random_row(rng, te_ref_floor=None))  # TE's time, no floor
    s_more = bench.summarize([*rows, no_floor])
    assert s_more["rows_with_te_ref"] == 10 and s_more["rows_with_te_ref_ratio"] == 9
    s = bench.summarize(rows)
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
    line = bench.summary_line(s)
    assert f"nearer our floor than TE to its own: {nearer}/9" in line
    assert f"{s['rows_within_target']}/10" in line
    assert f"{s['rows_faster_than_torch']}/9" in line and "TE" in line
    bulk = bench.summary_line(s, bulk=True)  # its torch column is NCCL on a side stream
    assert f"NCCL on a side stream: {s['rows_faster_than_torch']}/9" in bulk
    assert "TE" not in bulk and "async-TP" not in bulk
    main, side = bench.split_rows([{"op": "bulk_rs"}, {"op": "ag_gemm"}, {"op": "bulk_ag"}])
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
    rows = [bench.add_metrics(_random_row(rng, default_variant="v1")) for _ in range(5)]
    for r in rows:
        assert r["T_default"] == r["T_ours_by_variant"]["v1"] >= r["T_ours"]
        assert r["default_over_floor"] == pytest.approx(r["T_default"] / r["floor"])
    untimed = bench.add_metrics(_random_row(rng, default_variant="not timed"))
    unknown = bench.add_metrics(_random_row(rng, default_variant=None))
    assert untimed["T_default"] is untimed["default_over_floor"] is unknown["T_default"] is None
    s = bench.summarize([*rows, untimed, unknown])
    _check_target_counts(s, "default", [r["default_over_floor"] for r in rows])
    line = bench.summary_line(s)
    assert f"initialize_ub's defaults: {s['rows_default_within_target']}/5 <= 1.10" in line
    assert "initialize_ub" not in bench.summary_line(bench.summarize([untimed, unknown]))


def test_pipeline_floor_adds_one_chunk_gemm_to_our_collective() -> None:
    """NOTE [pipeline floor]: max(T_gemm, T_gemm_chunked / tp + T_comm_ours), for the rows
    that measured our collective (not bulk rows, which have no chunked GEMM)."""
    rng = random.Random()
    comm_bound = bench.add_metrics(
        _random_row(rng, T_gemm=1.0, T_gemm_chunked=1.2, tp=4, T_comm_ours=0.9)
    )
    assert comm_bound["pipeline_floor"] == pytest.approx(1.2 / 4 + 0.9)
    gemm_bound = bench.add_metrics(
        _random_row(rng, T_gemm=1.0, T_gemm_chunked=1.0, tp=2, T_comm_ours=0.2)
    )
    assert gemm_bound["pipeline_floor"] == 1.0
    ours = gemm_bound["T_ours"]
    assert gemm_bound["ours_over_pipeline_floor"] == pytest.approx(ours / 1.0)
    bulk = bench.add_metrics(_random_row(rng, T_gemm_chunked=None, tp=4, T_comm_ours=None))
    assert bulk["pipeline_floor"] is bulk["ours_over_pipeline_floor"] is None


def test_concurrent_floor_is_counted_against_the_target_apart() -> None:
    """NOTE [concurrent floor]: T_concurrent (the GEMM beside our copies of its bytes)
    over the floor, and ours over it; rows without it (bulk rows) stay out of its counts."""
    rng = random.Random()
    rows = [
        bench.add_metrics(_random_row(rng, T_concurrent=rng.uniform(0.9, 1.3))) for _ in range(7)
    ]
    for r in rows:
        assert r["concurrent_over_floor"] == pytest.approx(r["T_concurrent"] / r["floor"])
        assert r["ours_over_concurrent"] == pytest.approx(r["T_ours"] / r["T_concurrent"])
    bulk = bench.add_metrics(_random_row(rng, op="bulk_rs"))
    assert bulk["concurrent_over_floor"] is bulk["ours_over_concurrent"] is None
    s = bench.summarize([*rows, bulk])
    _check_target_counts(s, "concurrent", [r["concurrent_over_floor"] for r in rows])
    line = bench.summary_line(s)
    assert f"no dependencies: {s['rows_concurrent_within_target']}/7 <= 1.10" in line
    assert "no dependencies" not in bench.summary_line(bench.summarize([bulk]))


@pytest.mark.parametrize("tp", [2, 4])
def test_every_suite_row_has_a_registered_default_variant(tp: int) -> None:
    """The default of each row's GEMM name (overlap.ub) is a registered variant, derived from
    UbConfig rather than written down: e.g. GEMM+RS at TP 2 is the pulled ring (NOTE [ub tp
    2]), and a bulk_rs row's margin and pieces are bulk_rs_defaults(tp)'s."""
    from overlap.ops.bulk import bulk_rs_defaults

    names = {(v.op, v.name) for v in methods.registered()}
    for row in bench.build_suite(tp, full=True, cuda=True, tp_sizes=[tp]):
        name = methods.ub_default_variant(row["op"], row["shape"], tp)
        assert (row["op"], name) in names, row
    assert methods.ub_gemm_name("ag_gemm", "te8192") == "qkv_fprop"
    assert methods.ub_gemm_name("gemm_rs", "fc2") == "fc2_fprop"
    assert methods.ub_gemm_name("bulk_rs", "fc1") == "fc1_wgrad"
    rs = methods.ub_default_variant("gemm_rs", "proj", tp)
    assert rs == ("ring/lanes1-subchunks2-pull" if tp == 2 else "pipeline/lanes1-split1")
    margin, pieces = bulk_rs_defaults(tp)
    assert methods.ub_default_variant("bulk_rs", "qkv", tp) == (
        f"bulk/serial-margin{margin}-pieces{pieces}"
    )
    lanes = 1 if tp == 2 else 2  # NOTE [ub tp 2]
    ag = methods.ub_default_variant("ag_gemm", "fc1", tp)
    assert ag == f"pipeline/lanes{lanes}-split1-staggered"
    # another op's method (proj fprop reduce-scatters) is no AG+GEMM variant
    assert methods.ub_default_variant("ag_gemm", "proj", tp) is None
    with pytest.raises(ValueError, match="unknown op"):
        methods.ub_gemm_name("gemm", "fc1")


def test_host_bound_rows_are_counted_where_enqueue_times_were_measured() -> None:
    """NOTE [host-bound rows]: a row counts as host-bound when enqueueing its best variant (or
    torch's op) took the host longer than the GPU's time for it; rows without host times (the
    host transport) are left out of the count and of the summary line."""
    rng = random.Random()
    slow = {"v0": 9.0, "v1": 9.0, "v2": 9.0}  # ms: longer than any GPU time of _random_row
    fast = {"v0": 0.01, "v1": 0.01, "v2": 0.01}
    rows = [
        bench.add_metrics(_random_row(rng, host_ms_by_variant=slow, host_ms_torch=0.01)),
        bench.add_metrics(_random_row(rng, host_ms_by_variant=fast, host_ms_torch=9.0)),
        bench.add_metrics(_random_row(rng, host_ms_by_variant=fast, host_ms_torch=None)),
        bench.add_metrics(_random_row(rng)),
    ]
    assert rows[0]["host_ms"] == 9.0 and rows[3]["host_ms"] is None
    s = bench.summarize(rows)
    assert (s["rows_with_host_time"], s["rows_host_bound"]) == (3, 1)
    assert (s["rows_with_torch_host_time"], s["rows_torch_host_bound"]) == (2, 1)
    assert "host-bound (enqueue > GPU time): ours 1/3, torch 1/2" in bench.summary_line(s)
    assert "NCCL 1/2" in bench.summary_line(s, bulk=True)
    assert "host-bound" not in bench.summary_line(bench.summarize(rows[3:]))


def test_table_marks_missing_peers_and_the_te_reference() -> None:
    rng = random.Random()
    base = {"shape": "fc1", "M": 32, "K": 64, "N": 64, "tp": 4, "dtype": "bf16"}
    rows = [bench.add_metrics({**_random_row(rng, T_torch=None, T_te_ref=None), **base})]
    meta = {
        "world_size": 4,
        "transport": "host",
        "timing": timing_protocol(cuda=False, queued=False, warmup=1, iters=3),
        "summary": bench.summarize(rows),
    }
    text = bench.table_text(rows, meta)
    header = next(line for line in text.splitlines() if line.lstrip().startswith("op"))
    for col in ("T_gemm", "T_comm", "T_seq", "torch", "T_ours", "ours/floor", "vs torch", "TE*"):
        assert col in header
    assert " n/a " in text and "measured on 4xH200" in text and "summary:" in text
    # the reasons for n/a are listed once each, with their row count
    rows = rows * 2
    rows[0] = {**rows[0], "torch_error": "RuntimeError: no symm mem", "variant_errors": {"x": "E"}}
    rows[1] = {**rows[1], "torch_error": "RuntimeError: no symm mem"}
    text = bench.table_text(rows, meta)
    assert "torch n/a: RuntimeError: no symm mem (2 rows)" in text
    assert "ag_gemm:x n/a: E (1 rows)" in text


def test_timing_protocol_documents_each_mode() -> None:
    modes = {
        timing_protocol(cuda=c, queued=q, warmup=5, iters=20)["mode"]
        for c, q in ((True, False), (True, True), (False, False))
    }
    assert modes == {"e2e", "gpu", "host"}
    doc = timing_protocol(cuda=True, queued=True, warmup=5, iters=20)
    assert doc["iters"] == 20 and "max" in doc["statistic"] and "spin" in doc["clock"]
    assert "barrier" not in doc["clock"]
    aligned = timing_protocol(cuda=True, queued=True, warmup=5, iters=20, aligned=True)
    assert aligned["mode"] == "gpu" and "device-side barrier" in aligned["clock"]
    hot = timing_protocol(cuda=True, queued=True, warmup=5, iters=20, aligned=True, heat_ms=50)
    assert hot["mode"] == "sustained" and "50 ms" in hot["clock"] and "barrier" in hot["clock"]


def test_sustained_timing_heats_with_the_agreed_number_of_calls(monkeypatch) -> None:
    """time_op(queued=True, heat_ms=H): three calls estimate the GPU time per call, ``agree``
    settles the count of heating calls (ceil(H / estimate), e.g. the max over ranks), those
    run after the spin and before the timed calls, and only the timed calls are sampled."""
    import torch

    from benchmarks import common

    log: list[str] = []
    gpu_ms = {"t": 0.0}

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self) -> None:
            self.t = gpu_ms["t"]
            log.append("event")

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: Event) -> float:
            return other.t - self.t

    def call() -> None:
        gpu_ms["t"] += 0.5 if "timed" in log else 0.25  # 0.25 ms while estimating and heating
        log.append("call")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    spins: list[float] = []
    monkeypatch.setattr(common, "spin_gpu", lambda ms: (spins.append(ms), log.append("spin")))
    monkeypatch.setattr(common.time, "perf_counter", lambda: 0.0)  # enqueueing takes 0 s
    agreed: list[int] = []

    def agree(n: int) -> int:
        agreed.append(n)
        log.append("timed")  # every call after the agreement is a heating or a timed call
        return n + 2  # another rank wanted two more

    ms = common.time_op(
        call,
        cuda=True,
        warmup=2,
        iters=4,
        queued=True,
        heat_ms=10.0,
        agree=agree,
        align=lambda: log.append("align"),
    )
    assert agreed == [40]  # ceil(10 / 0.25): the estimate from 3 calls of 0.25 ms
    after = log[log.index("align") :]
    assert after[:2] == ["align", "spin"]
    assert after.count("call") == agreed[0] + 2 + 4  # the agreed heating, then the timed calls
    first_timed = after.index("event")
    assert after[2:first_timed] == ["call"] * (agreed[0] + 2)
    assert ms == pytest.approx(0.5)
    assert log.count("spin") == 2  # the estimate's and the timed calls'
    assert spins == [1.0, 1.0]  # 1.5 x host time (0 here) x calls, + 1 ms


def test_sustained_timing_spin_covers_the_heating_calls_too(monkeypatch) -> None:
    """The spin ahead of the heating outlasts the host's enqueueing of the heating and the
    timed calls (host-bound calls would otherwise drain the queue while heating)."""
    import torch

    from benchmarks import common

    now = [0.0]
    spins: list[float] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: Event) -> float:
            return 1.0  # 1 ms: 3 estimate calls of 1/3 ms -> 30 heating calls for 10 ms

    def call() -> None:
        now[0] += 0.002  # the host takes 2 ms to enqueue a call

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(common, "spin_gpu", spins.append)
    monkeypatch.setattr(common.time, "perf_counter", lambda: now[0])
    common.time_op(call, cuda=True, warmup=3, iters=4, queued=True, heat_ms=10.0)
    assert spins[-1] == pytest.approx(1.5 * 2.0 * (30 + 4) + 1.0)
    # a call of (nearly) no GPU time heats with the bounded number of calls, not millions
    monkeypatch.setattr(Event, "elapsed_time", lambda self, other: 0.0)
    common.time_op(call, cuda=True, warmup=3, iters=4, queued=True, heat_ms=100.0)
    assert spins[-1] == pytest.approx(1.5 * 2.0 * (common._MAX_HEAT_CALLS + 4) + 1.0)


def test_timing_passes_alternate_the_order_and_keep_the_median() -> None:
    order: list[str] = []
    clock = iter(range(1, 100))

    def timer(call) -> float:  # a clock that drifts: each call is timed later than the last
        call()
        return float(next(clock))

    calls = {name: (lambda name=name: order.append(name)) for name in ("gemm", "comm", "ours")}
    times = bench.time_in_passes(calls, timer, passes=2)
    assert order == ["gemm", "comm", "ours", "ours", "comm", "gemm"]
    # A linear drift falls on every call alike: (1 + 6) / 2 == (2 + 5) / 2 == (3 + 4) / 2.
    assert times == {"gemm": 3.5, "comm": 3.5, "ours": 3.5}
    order.clear()
    assert bench.time_in_passes(calls, timer, passes=3) == {
        "gemm": 12.0,
        "comm": 11.0,
        "ours": 10.0,
    }
    assert order == ["gemm", "comm", "ours", "ours", "comm", "gemm", "gemm", "comm", "ours"]


def test_gemm_host_time_takes_turns_and_keeps_the_median(monkeypatch) -> None:
    """benchmarks.gemm.host_us: samples of each function in alternating order (A B, B A, ...),
    the GPU kept busy before each (stubbed here), the median per call of each function."""
    from benchmarks import gemm as gemm_bench

    events: list[str] = []
    monkeypatch.setattr(gemm_bench, "spin_gpu", lambda ms: events.append("spin"))
    monkeypatch.setattr(gemm_bench.torch.cuda, "synchronize", lambda: events.append("sync"))
    now = [0.0]
    monkeypatch.setattr(gemm_bench.time, "perf_counter", lambda: now[0])
    cost = {"a": [1e-6, 9e-6, 2e-6], "b": [5e-6, 5e-6, 7e-6]}  # seconds per call, by sample

    def fn(name: str):
        seen = iter(range(10**6))

        def call() -> None:
            k = next(seen)
            events.append(name)
            if k > 0:  # the warm-up call is not timed
                now[0] += cost[name][(k - 1) // 4]

        return call

    a_us, b_us = gemm_bench.host_us(fn("a"), fn("b"), calls=4, reps=3)
    assert (a_us, b_us) == pytest.approx((2.0, 5.0))  # medians of (1, 9, 2) and (5, 5, 7)
    runs = [e for e in events if e in ("a", "b")][2:]  # after one warm-up call each
    assert runs == ["a"] * 4 + ["b"] * 4 + ["b"] * 4 + ["a"] * 4 + ["a"] * 4 + ["b"] * 4
    assert events.count("spin") == 6 and events[2] == "sync"


def test_gemm_suite_has_te_shapes_at_te_tokens_and_rejects_unknown_shapes(capsys) -> None:
    """benchmarks.gemm: TE's shapes (K = N = hidden) join the Llama ones at M = 8192 only, and
    --shapes names an unknown shape before anything needs a GPU."""
    from benchmarks import gemm as gemm_bench

    at_te = {op: (n, k) for op, n, k in gemm_bench.suite(4, 8192)}
    assert at_te["te8192"] == (8192, 8192) and at_te["te4096"] == (4096, 4096)
    assert at_te["fc2"] == (8192, 28672 // 4)
    assert {op for op, _, _ in gemm_bench.suite(4, 16384)} == {"fc1", "qkv", "fc2", "proj"}
    with pytest.raises(SystemExit):
        gemm_bench.main(["--shapes", "te8192,fc3"])
    err = capsys.readouterr().err
    assert "unknown shapes ['fc3']" in err and "te4096" in err


def test_registry_names_selection_and_a_new_method() -> None:
    names = {v.full_name for v in methods.registered()}
    assert "ag_gemm:pipeline/lanes2-split1-staggered" in names
    assert "gemm_rs:pipeline/lanes1-split2" in names
    assert "gemm_rs:ring/lanes2-subchunks4" in names
    assert "gemm_rs:ring/lanes1-subchunks2-pull" in names
    calls = []

    def build(case: object, *, chunks: int, fast: bool) -> methods.Runner:
        calls.append((case, chunks, fast))
        return lambda: chunks

    added = methods.register(
        "gemm_rs", "toy", build, methods.grid(chunks=(2, 4), fast=(False, True))
    )
    try:
        assert [v.name for v in added] == [
            "toy/chunks2",
            "toy/chunks2-fast",
            "toy/chunks4",
            "toy/chunks4-fast",
        ]
        assert methods.select(["gemm_rs:toy/*"]) == added
        assert methods.select(["toy/chunks4*"]) == added[2:]
        assert added[3].make("case")() == 4 and calls == [("case", 4, True)]
        with pytest.raises(ValueError, match="already registered"):
            methods.register("gemm_rs", "toy", build, [{"chunks": 2, "fast": False}])
    finally:
        methods.unregister(added)
    assert all(v.method != "toy" for v in methods.registered())
    with pytest.raises(ValueError, match="matches no variant"):
        methods.select(["gemm_rs:toy/*"])
    with pytest.raises(ValueError, match="unknown op 'bulk'"):
        methods.register("bulk", "x", build)


def test_variant_applicability_follows_the_transport() -> None:
    class FakeCase:
        def __init__(self, op: str, cuda: bool) -> None:
            self.op, self.cuda = op, cuda

    ag = [v for v in methods.registered() if v.op == "ag_gemm"]
    on_host = [v.name for v in ag if v.applies(FakeCase("ag_gemm", cuda=False))]
    on_gpu = [v.name for v in ag if v.applies(FakeCase("ag_gemm", cuda=True))]
    # Copies per peer (split > 1) only on cuda; pulls have no split.
    assert set(on_host) < set(on_gpu) and all("split" not in n or "split1" in n for n in on_host)
    assert "pull/lanes1" in on_host
    assert not any(v.applies(FakeCase("gemm_rs", cuda=True)) for v in ag)


def test_bulk_variants_drop_all_at_once_puts_with_one_peer_and_margins_on_host() -> None:
    def case(tp: int, cuda: bool = True) -> object:
        comm = types.SimpleNamespace(group=types.SimpleNamespace(size=tp))
        return types.SimpleNamespace(op="bulk_rs", cuda=cuda, comm=comm)

    rs = [v for v in methods.registered() if v.op == "bulk_rs"]
    at = {tp: [v.name for v in rs if v.applies(case(tp))] for tp in (2, 4)}
    assert at[2] and all("serial" in n for n in at[2])  # one peer: serial or not, the same
    assert set(at[2]) < set(at[4]) and len(at[4]) == 2 * len(at[2])
    on_host = [v.name for v in rs if v.applies(case(4, cuda=False))]
    assert on_host and set(on_host) < set(at[4]) and all("margin0-" in n for n in on_host)


def test_case_keep_builds_once_and_releases_newest_first() -> None:
    log = []

    class Obj:
        def __init__(self, tag: str) -> None:
            self.tag = tag
            log.append(("make", tag))

        def destroy(self) -> None:
            log.append(("destroy", self.tag))

    case = methods.Case("ag_gemm", None, 8, 8, 8, None, None, None, False, False)
    a = case.keep("a", lambda: Obj("a"))
    assert case.keep("a", lambda: Obj("again")) is a
    case.keep("b", lambda: Obj("b"))
    case.keep("c", lambda: "plain", destroy=lambda o: log.append(("custom", o)))
    case.release()
    assert log == [
        ("make", "a"),
        ("make", "b"),
        ("custom", "plain"),
        ("destroy", "b"),
        ("destroy", "a"),
    ]
    case.release()  # nothing left: no second destroy
    assert len(log) == 5


def test_runners_apply_their_settings_on_every_call() -> None:
    """NOTE [settings per call]: variants sharing one op object are all built before any runs."""

    class SharedOp:
        def __init__(self) -> None:
            self.buffer = types.SimpleNamespace(put_split=0, serial_puts=None)
            self.staggered_puts = self.pieces = self.gemm_sm_margin = None
            self.seen: list[tuple] = []

        def __call__(self, *args, **kwargs) -> None:
            b = self.buffer
            self.seen.append((b.put_split, b.serial_puts, self.staggered_puts, self.pieces))
            self.seen[-1] += (self.gemm_sm_margin,)

    case = methods.Case("ag_gemm", None, 8, 8, 8, None, None, None, False, True)
    ag = SharedOp()
    case.keep(("ag_pipeline", 1), lambda: ag)
    first = methods._ag_pipeline(case, lanes=1, split=1, staggered=False)
    second = methods._ag_pipeline(case, lanes=1, split=2, staggered=True, pieces=4)
    first(), second(), first()
    expected = [(1, None, False, 1), (2, None, True, 4), (1, None, False, 1)]
    assert [s[:4] for s in ag.seen] == expected

    side = methods.SideGemm(None, None, None)
    case = methods.Case("bulk_rs", None, 8, 8, 8, None, None, None, False, True, side=side)
    rs = SharedOp()
    case.keep(("bulk_rs",), lambda: rs)
    first = methods._bulk_rs(case, serial=True, margin=0)
    second = methods._bulk_rs(case, serial=False, margin=16, pieces=4)
    second(), first()
    assert [(s[1], s[3], s[4]) for s in rs.seen] == [(False, 4, 16), (True, 1, 0)]


def test_progress_lines_count_up_with_eta() -> None:
    out = io.StringIO()
    p = Progress(3, "bench", stream=out)
    for i in range(3):
        p.step(f"row {i}")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert re.fullmatch(rf"\[bench\] {i + 1}/3 row {i} \| \d+s elapsed, ETA \d+s", line)
    assert lines[-1].endswith("ETA 0s")
    quiet = io.StringIO()
    Progress(2, "bench", enabled=False, stream=quiet).step("x")
    assert quiet.getvalue() == ""


def test_plot_writes_a_png_or_says_why_not(tmp_path, monkeypatch, capsys) -> None:
    pytest.importorskip("matplotlib")
    rng = random.Random()
    rows = [
        bench.add_metrics({**_random_row(rng), "shape": f"s{i}", "dtype": "bf16"}) for i in range(3)
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


def test_sustained_timing_needs_gpus_and_a_positive_heat(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x", "--timing", "sustained"])
    assert "--timing sustained heats GPUs: it needs --cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x", "--cuda", "--timing", "sustained", "--heat-ms", "0"])
    assert "--heat-ms must be in (0, 10000], got 0.0" in capsys.readouterr().err
    args = bench.parse_args(["--out", "x", "--cuda", "--timing", "sustained"])
    assert args.timing == "sustained" and args.heat_ms == 50.0

"""The GPU-timeline helpers of ``benchmarks/trace.py`` (``overlap_ops --trace``) on synthetic
chrome traces: which activities count, the per-call breakdown, the text, the option's checks.
The profiler run itself needs GPUs (tests/distributed/test_bench_overlap_ops.py)."""

from __future__ import annotations

import pytest

from benchmarks.overlap_ops import parse_args
from benchmarks.trace import (
    Activity,
    Tracer,
    activities_of,
    breakdown,
    busy_us,
    by_stream_and_kernel,
    row_label,
    timeline_text,
)


def _event(cat: str, name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_activities_start_after_the_harness_spin_and_exclude_cpu_events() -> None:
    trace = {
        "traceEvents": [
            _event("kernel", "ncclDevKernel_AllReduce", 0.0, 5.0),  # the aligning barrier
            _event("kernel", "at::cuda::spin_kernel(long)", 5.0, 2000.0),
            _event("gpu_memcpy", "Memcpy PtoP (Device -> Device)", 2010.0, 40.0, stream=9),
            _event("kernel", "nvjet_sm90_gemm", 2005.0, 55.0),
            _event("gpu_memset", "Memset (Device)", 2070.0, 1.0),
            _event("cpu_op", "aten::mm", 2000.0, 3.0),
            {"ph": "M", "name": "process_name"},
        ]
    }
    acts = activities_of(trace, rank=3)
    # Times count from the aligning barrier's end (5.0).
    assert [(a.kind, a.start_us) for a in acts] == [
        ("kernel", 2000.0),
        ("memcpy", 2005.0),
        ("memset", 2065.0),
    ]
    assert all(a.rank == 3 for a in acts) and acts[1].stream == "9"
    assert acts[0].end_us == 2055.0
    # Without a spin kernel (another harness), every GPU activity counts, from the first.
    rest = activities_of({"traceEvents": trace["traceEvents"][2:]}, 0)
    assert [a.start_us for a in rest] == [0.0, 5.0, 65.0]


def test_ranks_line_up_on_their_aligning_barriers() -> None:
    """Rank 1's clock is 1000 us ahead and its host queued its spin 300 us late: counted from
    each rank's barrier end, its first kernel starts 300 us after rank 0's on the axis."""

    def trace(clock: float, spin_start: float) -> dict:
        return {
            "traceEvents": [
                _event("kernel", "ncclDevKernel_AllReduce_Sum_f32", clock + 0.0, 10.0),
                _event("kernel", "at::cuda::spin_kernel(long)", clock + spin_start, 2000.0),
                _event("kernel", "handshake_kernel", clock + spin_start + 2000.0, 5.0),
            ]
        }

    acts = activities_of(trace(0.0, 10.0), 0) + activities_of(trace(1000.0, 310.0), 1)
    assert [(a.rank, a.start_us) for a in acts] == [(0, 2000.0), (1, 2300.0)]
    text = timeline_text("x", {"ours": acts}, calls=1)
    lines = [ln.split() for ln in text.splitlines() if ln.endswith("handshake_kernel")]
    assert [ln[:2] for ln in lines] == [["0", "0.0"], ["1", "300.0"]]


def test_breakdown_per_call_with_overlap_and_gaps() -> None:
    def act(kind: str, start: float, dur: float) -> Activity:
        return Activity(0, start, dur, "7", kind, kind)

    # Two calls: kernel [0, 50) with a copy [10, 40) beside it, idle [50, 60), kernel [60, 100),
    # copy [100, 120) after it: span 120, busy 110, idle 10.
    acts = [
        act("kernel", 0, 50),
        act("memcpy", 10, 30),
        act("kernel", 60, 40),
        act("memset", 100, 20),
    ]
    b = breakdown(acts, calls=2)
    want = {"span_us": 60.0, "kernel_us": 45.0, "copy_us": 25.0, "idle_us": 5.0, "activities": 4}
    assert b == want
    assert breakdown([], calls=3) == dict.fromkeys(want, 0)


def test_timeline_text_puts_every_rank_on_one_axis() -> None:
    acts = [
        Activity(0, 1000.0, 50.0, "7", "kernel", "gemm_a"),
        Activity(1, 1000.0, 20.0, "9", "memcpy", "push"),
        Activity(1, 1030.0, 50.0, "7", "kernel", "gemm_b"),
    ]
    text = timeline_text("ag_gemm-qkv-M8192-tp2-fp8", {"ours pipeline/x": acts}, calls=1)
    assert text.startswith("GPU timeline of ag_gemm-qkv-M8192-tp2-fp8: 1 calls")
    assert "== ours pipeline/x" in text
    lines = text.splitlines()
    gemm_a = next(ln for ln in lines if ln.endswith("gemm_a")).split()
    gemm_b = next(ln for ln in lines if ln.endswith("gemm_b")).split()
    push = next(ln for ln in lines if ln.endswith("push")).split()
    assert gemm_a[:4] == ["0", "0.0", "50.0", "50.0"]
    assert push[:4] == ["1", "0.0", "20.0", "20.0"]
    assert gemm_b[:4] == ["1", "30.0", "50.0", "80.0"]
    # The breakdown table: rank 1 spans 80 us, 10 of them idle.
    row1 = next(ln.split() for ln in lines if ln.split()[:2] == ["1", "80.000"])
    assert row1 == ["1", "80.000", "50.000", "20.000", "10.000", "2"]
    # rank 0 recorded 1 activity, rank 1 two: flagged (where ranks do the same work, the
    # profiler dropped records)
    assert "warning: the ranks recorded different numbers of activities (1..2)" in text


def test_row_label_and_tracer_arguments(tmp_path) -> None:
    row = {"op": "gemm_rs", "shape": "te4096", "M": 8192, "tp": 4, "dtype": "bf16"}
    assert row_label(row) == "gemm_rs-te4096-M8192-tp4-bf16"
    assert Tracer(tmp_path, align=lambda: None).dir == tmp_path / "traces"
    with pytest.raises(ValueError, match="calls must be >= 1"):
        Tracer(tmp_path, align=lambda: None, calls=0)


def test_trace_option_needs_the_cuda_transport(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--out", "x", "--trace"])
    assert "--trace records GPU timelines (CUPTI): it needs --cuda" in capsys.readouterr().err
    assert parse_args(["--out", "x", "--trace", "--cuda"]).trace


def test_busy_time_is_the_union_and_streams_rank_by_it() -> None:
    acts = [
        Activity(0, 0.0, 10.0, "7", "kernel", "gemm_a"),
        Activity(0, 5.0, 10.0, "7", "kernel", "gemm_a"),  # overlaps the first: 15 busy
        Activity(0, 30.0, 5.0, "7", "kernel", "gemm_b"),
        Activity(0, 2.0, 3.0, "9", "memcpy", "Memcpy PtoP"),
    ]
    assert busy_us(acts[:3]) == 20.0
    assert busy_us(acts) == 20.0
    assert busy_us([]) == 0.0
    text = by_stream_and_kernel(acts, calls=2, top=2)
    lines = text.splitlines()
    # Stream 7 (10 us busy per call) before stream 9 (1.5); then the two costliest names.
    assert lines.index(next(x for x in lines if x.strip().startswith("7"))) < lines.index(
        next(x for x in lines if x.strip().startswith("9"))
    )
    assert "10.000" in text and "1.500" in text
    ranked = [x.split()[2:] for x in lines if x.endswith("]")][1:]  # after the heading
    assert ranked == [["gemm_a", "[7]"], ["gemm_b", "[7]"]]  # top 2: 10 and 2.5 us/call

"""What the benchmarks share for timing and launching, without ranks (benchmarks/common.py;
benchmarks/gemm.py's host times and suite): the timing protocol, sustained timing, passes,
the timing options, progress lines and ``--launch``."""

from __future__ import annotations

import io
import re

import pytest

from benchmarks import overlap_ops as bench
from benchmarks.common import Progress, time_in_passes, timing_protocol


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
    times = time_in_passes(calls, timer, passes=2)
    assert order == ["gemm", "comm", "ours", "ours", "comm", "gemm"]
    # A linear drift falls on every call alike: (1 + 6) / 2 == (2 + 5) / 2 == (3 + 4) / 2.
    assert times == {"gemm": 3.5, "comm": 3.5, "ours": 3.5}
    order.clear()
    assert time_in_passes(calls, timer, passes=3) == {
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


def test_sustained_timing_needs_gpus_and_a_positive_heat(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x", "--timing", "sustained"])
    assert "--timing sustained heats GPUs: it needs --cuda" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "x", "--cuda", "--timing", "sustained", "--heat-ms", "0"])
    assert "--heat-ms must be in (0, 10000], got 0.0" in capsys.readouterr().err
    args = bench.parse_args(["--out", "x", "--cuda", "--timing", "sustained"])
    assert args.timing == "sustained" and args.heat_ms == 50.0


def test_timing_option_defaults_follow_the_transport() -> None:
    host = bench.parse_args(["--out", "x"])
    assert (host.iters, host.warmup, host.passes, host.timing) == (3, 1, 1, "gpu")
    gpu = bench.parse_args(["--out", "x", "--cuda"])
    assert (gpu.iters, gpu.warmup, gpu.passes) == (20, 5, 2)
    mine = bench.parse_args(["--out", "x", "--cuda", "--iters", "7", "--warmup", "0"])
    assert (mine.iters, mine.warmup) == (7, 0)


def test_launch_reruns_the_module_under_mpirun_without_launch(monkeypatch) -> None:
    """``--launch N``: the workers get the same options less ``--launch N`` / ``--launch=N``,
    with the repository on PYTHONPATH."""
    import sys

    from benchmarks import common

    seen: list[list[str]] = []
    monkeypatch.setattr(common.subprocess, "call", lambda cmd, env: seen.append(cmd) or 3)
    argv = ["--launch", "4", "--out", "x", "--launch=4", "--full"]
    assert common.launch_workers("benchmarks.overlap_ops", 4, argv) == 3
    (cmd,) = seen
    assert cmd[cmd.index("-np") + 1] == "4"
    tail = [sys.executable, "-u", "-m", "benchmarks.overlap_ops", "--out", "x", "--full"]
    assert cmd[-len(tail) :] == tail
    assert f"PYTHONPATH={common.REPO}" in cmd


def test_training_steps_on_the_host_time_each_step_and_run_before_untimed() -> None:
    import math
    import time as _time

    from benchmarks.common import time_training_steps

    calls: list[str] = []

    def before() -> None:
        calls.append("before")
        _time.sleep(0.2)  # not timed

    def step() -> None:
        calls.append("step")
        _time.sleep(0.005)

    t = time_training_steps(step, iters=4, warmup=2, cuda=False, before=before)
    assert calls == ["before", "step"] * 6
    assert 4.5 <= t.ms < 150.0 and t.host_ms == t.ms  # before()'s 200 ms are not counted
    assert math.isnan(t.sm_mhz)  # no GPU, no clock

"""GEMM autotuning (NOTE [gemm autotune] in csrc/gemm/cuda/autotune.h).

CPU tests: the typed configuration, OVERLAP_GEMM_AUTOTUNE, problem validation, the tune
request on the host path, and the waiting kernel's override (its GPU choice is tested by
tests/distributed/test_fused_ag.py). GPU tests: tuned results against the float64 reference, the
caller's output written once (rows outside untouched, beta accumulated once, amax of the real
call), no tuning while capturing a CUDA graph (nor breaking another thread's capture), cache
hits after tuning and after pre-tuning, one tuning for threads that miss a key together.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from overlap import env  # noqa: E402
from overlap._native import _apply_gemm_autotune, native  # noqa: E402
from overlap.errors import ConfigError, InvalidArgumentError  # noqa: E402
from overlap.gemm import (  # noqa: E402
    AutotuneConfig,
    GemmProblem,
    TuneResult,
    _gemm,
    autotune,
    clear_gemm_cache,
    gemm,
    gemm_cache_stats,
    get_autotune_config,
    set_autotune_config,
    set_waiting_kernel,
    waiting_kernel_choices,
    waiting_kernels,
)
from overlap.quantization import ScalingMode  # noqa: E402
from tests.unit.gemm_reference import (  # noqa: E402
    block_fp8,
    per_tensor_fp8,
    randn,
    reference,
    scales,
    to_fp8,
)

E4M3 = torch.float8_e4m3fn
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture
def restore_config():
    previous = get_autotune_config()
    yield
    set_autotune_config(previous)


# ---- CPU: configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_candidates": 0}, r"max_candidates must be an int in \[1, 64\], got 0"),
        ({"max_candidates": 65}, r"max_candidates must be an int in \[1, 64\], got 65"),
        ({"max_candidates": 4.0}, "max_candidates must be an int"),
        ({"rounds": 0}, r"rounds must be an int in \[1, 100\], got 0"),
        ({"rounds": True}, "rounds must be an int"),
        ({"enabled": 1}, "enabled must be a bool, got 1"),
    ],
    ids=["candidates-0", "candidates-65", "candidates-float", "rounds-0", "rounds-bool", "enabled"],
)
def test_config_rejects_bad_values(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        AutotuneConfig(**kwargs)


def test_set_returns_the_previous_config_and_get_reads_it_back(restore_config) -> None:
    first = AutotuneConfig(enabled=False, max_candidates=3, rounds=7)
    second = AutotuneConfig(enabled=True, max_candidates=5, rounds=2)
    set_autotune_config(first)
    assert set_autotune_config(second) == first
    assert get_autotune_config() == second


def test_set_rejects_anything_but_a_config(restore_config) -> None:
    before = get_autotune_config()
    with pytest.raises(ConfigError, match=r"expected an overlap\.gemm\.AutotuneConfig"):
        set_autotune_config({"enabled": False})  # type: ignore[arg-type]
    assert get_autotune_config() == before


@pytest.mark.parametrize(
    ("candidates", "rounds"), [(0, 5), (65, 5), (8, 0), (8, 101)], ids=["c0", "c65", "r0", "r101"]
)
def test_the_core_validates_its_config_too(restore_config, candidates, rounds) -> None:
    """The C++ setter is reachable without the dataclass (the env path): it checks again."""
    before = get_autotune_config()
    with pytest.raises(ConfigError, match=r"gemm autotune: (max_candidates|rounds) must be in"):
        native().gemm.set_autotune(enabled=True, max_candidates=candidates, rounds=rounds)
    assert get_autotune_config() == before


# ---- CPU: OVERLAP_GEMM_AUTOTUNE --------------------------------------------------------------


def test_env_default_and_values() -> None:
    assert env.settings({}).gemm_autotune == 8
    assert env.settings({"OVERLAP_GEMM_AUTOTUNE": "0"}).gemm_autotune == 0
    assert env.settings({"OVERLAP_GEMM_AUTOTUNE": " 16 "}).gemm_autotune == 16
    assert env.settings({"OVERLAP_GEMM_AUTOTUNE": "64"}).gemm_autotune == 64


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("on", "is not an integer"),
        ("2.5", "is not an integer"),
        ("-1", "must be in"),
        ("65", "must be in"),
    ],
)
def test_env_rejects_bad_values_naming_the_variable(value, match) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        env.settings({"OVERLAP_GEMM_AUTOTUNE": value})
    assert "OVERLAP_GEMM_AUTOTUNE" in str(info.value)


def test_env_value_is_applied_to_the_core(restore_config) -> None:
    set_autotune_config(AutotuneConfig(enabled=True, max_candidates=6, rounds=3))
    _apply_gemm_autotune(native(), 0)  # off: keeps the candidate count for a later switch-on
    assert get_autotune_config() == AutotuneConfig(enabled=False, max_candidates=6, rounds=3)
    _apply_gemm_autotune(native(), 12)
    assert get_autotune_config() == AutotuneConfig(enabled=True, max_candidates=12, rounds=3)


# ---- CPU: the waiting kernel's choice (NOTE [waiting gemm choice]) ---------------------------


def test_waiting_kernels_exist_exactly_in_builds_with_the_kernel() -> None:
    names = waiting_kernels()
    if native().gemm.waiting_gemm_built():
        assert len(names) == 5 and len(set(names)) == 5, names
        assert names[0] == "64x128 ping-pong" and "256x128" in names  # the untuned rule's two
    else:
        assert names == ()
    assert waiting_kernel_choices() == []  # nothing ran a GPU waiting kernel in this process


def test_set_waiting_kernel_returns_the_previous_override_and_rejects_unknown_names() -> None:
    names = waiting_kernels()
    try:
        assert set_waiting_kernel("untuned") == ""
        previous = "untuned"
        for name in names:
            assert set_waiting_kernel(name) == previous
            previous = name
        with pytest.raises(ConfigError, match=r"no kernel named 'nope'; one of '' \(measured\)"):
            set_waiting_kernel("nope")
        with pytest.raises(ConfigError, match="must be a str"):
            set_waiting_kernel(3)  # type: ignore[arg-type]
        assert set_waiting_kernel("") == previous  # the rejected calls changed nothing
    finally:
        set_waiting_kernel("")


# ---- CPU: problems, results, the host path ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"m": 0, "n": 8, "k": 16}, r"m must be an int in \[1, "),
        ({"m": 8, "n": -1, "k": 16}, r"n must be an int in \[1, "),
        ({"m": 8, "n": 8, "k": 16.0}, "k must be an int"),
        ({"m": 8, "n": 8, "k": 16, "dtype": "bfloat16"}, "dtype must be a torch.dtype"),
        ({"m": 8, "n": 8, "k": 16, "a_scaling": "tensor"}, "a_scaling must be an overlap"),
        ({"m": 8, "n": 8, "k": 16, "transb": 1}, "transb must be a bool"),
        ({"m": 8, "n": 8, "k": 16, "fast_accum": "yes"}, "fast_accum must be a bool or None"),
        ({"m": 8, "n": 8, "k": 16, "sm_count": -2}, r"sm_count must be an int in \[0, "),
    ],
    ids=["m", "n", "k-float", "dtype", "scaling", "transb", "fast_accum", "sm_count"],
)
def test_problem_rejects_bad_fields(kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        GemmProblem(**kwargs)


def test_problem_linear_is_a_forward_with_w_transposed() -> None:
    p = GemmProblem.linear(4096, 8192, 2560, dtype=E4M3)
    assert (p.m, p.n, p.k, p.transa, p.transb, p.dtype) == (4096, 2560, 8192, False, True, E4M3)
    assert GemmProblem(1, 2, 3).dtype == torch.bfloat16


def test_tune_result_speedup() -> None:
    p = GemmProblem(8, 8, 16)
    assert TuneResult(p, "tuned", 2, (1.2, None, 0.8), "").speedup == pytest.approx(1.5)
    assert TuneResult(p, "untuned", 0, (), "autotuning is disabled").speedup is None
    assert TuneResult(p, "tuned", 1, (None, 0.5), "").speedup is None


def test_autotune_validates_before_touching_a_device() -> None:
    with pytest.raises(ConfigError, match=r"expected overlap\.gemm\.GemmProblem items"):
        autotune([(8, 8, 16)])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="max_candidates must be an int"):
        autotune([GemmProblem(8, 8, 16)], max_candidates=0)
    with pytest.raises(InvalidArgumentError, match="device must be a CUDA device"):
        autotune([GemmProblem(8, 8, 16)], device="cpu")


def test_host_path_with_a_tune_request_is_untuned_and_exact() -> None:
    a, b = randn(24, 64, seed=1), randn(40, 64, seed=2)
    out = torch.full((24, 40), float("nan"))
    y, record = _gemm(a, b, transb=True, out=out, tune=AutotuneConfig())
    assert record == {
        "status": "untuned",
        "chosen": 0,
        "times_ms": [],
        "note": "the host reference",
    }
    torch.testing.assert_close(y.double(), reference(a, b, transb=True), rtol=2e-7, atol=1e-12)


def test_the_core_rejects_a_bad_tune_request() -> None:
    a, b = randn(8, 16, seed=3), randn(8, 16, seed=4)
    with pytest.raises(ConfigError, match="rounds must be in"):
        native().gemm.gemm(a, b, torch.empty(8, 8), transb=True, tune_candidates=4, tune_rounds=0)


# ---- GPU ------------------------------------------------------------------------------------


def varied(rows: int, cols: int, *, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Random values whose magnitude changes along both dimensions."""
    x = randn(rows, cols, seed=seed)
    x = x * torch.logspace(-1, 1, cols) * torch.logspace(0.5, -0.5, rows)[:, None]
    return x.to(dtype)


def check(y: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert not y.isnan().any(), "the GEMM left NaN (poison) in its output"
    torch.testing.assert_close(y.double().cpu(), ref, rtol=tol, atol=tol * float(ref.abs().max()))


@pytest.fixture
def tuning(restore_config):
    """Lazy tuning on (few rounds: the tests check behaviour, not the choice), empty cache."""
    set_autotune_config(AutotuneConfig(enabled=True, max_candidates=6, rounds=2))
    clear_gemm_cache()
    yield torch.cuda.current_device()
    clear_gemm_cache()


def stats(device: int) -> dict[str, int]:
    return gemm_cache_stats(device)


def warm_up_the_context(device: int) -> None:
    """A GEMM of another key creates the device's GEMM resources (and tuning stream) before a
    capture starts, as a training loop's eager warm-up does; the counters are reset."""
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    gemm(x, x, transb=True)
    torch.cuda.synchronize()
    clear_gemm_cache()
    assert stats(device) == {"hits": 0, "misses": 0, "entries": 0, "tuned": 0}


@pytest.mark.gpu(1)
@pytest.mark.parametrize("epilogue", ["plain", "bias+gelu"])
def test_tuned_bf16_matches_reference_and_the_cached_call_bitwise(tuning, epilogue) -> None:
    m, n, k = 512, 768, 1024
    a = varied(m, k, seed=5, dtype=torch.bfloat16)
    b = varied(n, k, seed=6, dtype=torch.bfloat16)
    bias = randn(n, seed=7, dtype=torch.bfloat16) * 4 if epilogue == "bias+gelu" else None
    gelu = bias is not None
    kw = {"transb": True, "bias": None if bias is None else bias.cuda(), "gelu": gelu}
    first = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a.cuda(), b.cuda(), out=first, **kw)  # tunes
    assert stats(tuning)["tuned"] == 1 and stats(tuning)["misses"] == 1
    check(first, reference(a, b, transb=True, bias=bias, gelu=gelu), TOL[torch.bfloat16])
    second = torch.full_like(first, float("nan"))
    gemm(a.cuda(), b.cuda(), out=second, **kw)  # the cached choice
    assert stats(tuning)["hits"] == 1
    # The tuning call wrote its output once, with the algorithm it cached.
    assert torch.equal(first, second)


@pytest.mark.gpu(1)
def test_tuned_fp8_with_fp8_output_and_amax(tuning) -> None:
    m, n, k = 256, 384, 512
    qa = per_tensor_fp8(varied(m, k, seed=8), E4M3)
    qb = per_tensor_fp8(varied(n, k, seed=9), E4M3)
    v = reference(qa.data, qb.data, transb=True, **scales(qa, qb))
    amax = torch.full((1,), -1.0, device="cuda")
    out = torch.empty(m, n, dtype=E4M3, device="cuda")
    out.view(torch.uint8).fill_(0x7F)  # NaN
    scale_value = 100.0 / float(v.abs().max())
    scale = torch.tensor([scale_value], device="cuda")
    gemm(
        qa.data.cuda(),
        qb.data.cuda(),
        transb=True,
        **scales(qa, qb, "cuda"),
        out=out,
        out_scale=scale,
        out_amax=amax,
    )
    assert stats(tuning)["misses"] == 1 and stats(tuning)["entries"] == 1  # tuned if offered >1
    torch.testing.assert_close(amax.cpu().double(), v.abs().max().reshape(1), rtol=5e-3, atol=0)
    got = out.cpu().double()
    assert not got.isnan().any()
    # FP8 rounding of slightly different float32 sums: within one e4m3 step (12.5%).
    want = to_fp8(v, scale_value, E4M3).double()
    torch.testing.assert_close(got, want, rtol=0.13, atol=0.13 * 100 / 16)


@pytest.mark.gpu(1)
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
    reason="cuBLASLt block scaling is Hopper-only",
)
def test_tuned_block_scaled_fp8_matches_reference(tuning) -> None:
    m, n, k = 256, 384, 320  # 3 K-blocks: the 128x128 scales are padded (staged) per candidate
    qa = block_fp8(varied(m, k, seed=10), E4M3, ScalingMode.BLOCK_1X128)
    qb = block_fp8(varied(n, k, seed=11), E4M3, ScalingMode.BLOCK_128X128)
    out = torch.full((m, n), float("nan"), device="cuda")
    gemm(qa.data.cuda(), qb.data.cuda(), transb=True, **scales(qa, qb, "cuda"), out=out)
    assert stats(tuning)["misses"] == 1 and stats(tuning)["entries"] == 1  # tuned if offered >1
    check(out, reference(qa.data, qb.data, transb=True, **scales(qa, qb)), 1e-3)


@pytest.mark.gpu(1)
def test_tuning_writes_only_the_rows_of_the_call_and_accumulates_once(tuning) -> None:
    """beta = 1 into a float32 slice: a candidate writing the caller's output would add the
    product several times; the rows and columns around the slice must stay NaN."""
    m, n, k, offset = 128, 256, 512, 64
    big = torch.full((offset + m + 32, n + 64), float("nan"), device="cuda")
    out = big[:, :n]
    old = randn(m, n, seed=12)
    out[offset : offset + m] = old.cuda()
    a = varied(m, k, seed=13, dtype=torch.bfloat16)
    b = varied(n, k, seed=14, dtype=torch.bfloat16)
    gemm(a.cuda(), b.cuda(), transb=True, out=out, row_offset=offset, beta=1.0)
    assert stats(tuning)["tuned"] == 1
    check(out[offset : offset + m], reference(a, b, transb=True, beta=1.0, old=old), 1e-4)
    untouched = torch.ones(big.shape, dtype=torch.bool)
    untouched[offset : offset + m, :n] = False
    assert big.cpu()[untouched].isnan().all(), "rows or columns outside the slice were written"


@pytest.mark.gpu(1)
def test_no_tuning_while_capturing_then_the_next_eager_call_tunes(tuning) -> None:
    m, n, k = 256, 512, 1024
    a = varied(m, k, seed=15, dtype=torch.bfloat16).cuda()
    b = varied(n, k, seed=16, dtype=torch.bfloat16).cuda()
    ref = reference(a.cpu(), b.cpu(), transb=True)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    warm_up_the_context(tuning)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        gemm(a, b, transb=True, out=out)
    assert stats(tuning) == {"hits": 0, "misses": 1, "entries": 1, "tuned": 0}
    graph.replay()
    torch.cuda.synchronize()
    check(out, ref, TOL[torch.bfloat16])
    out.fill_(float("nan"))
    gemm(a, b, transb=True, out=out)  # eager: the unsettled key is tuned now
    assert stats(tuning) == {"hits": 0, "misses": 2, "entries": 1, "tuned": 1}
    check(out, ref, TOL[torch.bfloat16])
    out.fill_(float("nan"))
    graph.replay()  # the graph keeps the algorithm it captured
    torch.cuda.synchronize()
    check(out, ref, TOL[torch.bfloat16])


@pytest.mark.gpu(1)
def test_tuning_does_not_break_another_threads_capture(tuning) -> None:
    """A thread captures (torch's default, global capture mode) while this one tunes a new key
    on a stream of its own (NOTE [gemm autotune]: relaxed mode on the tuning thread)."""
    x = torch.randn(256, 256, device="cuda")
    a = varied(256, 512, seed=17, dtype=torch.bfloat16).cuda()
    b = varied(384, 512, seed=18, dtype=torch.bfloat16).cuda()
    out = torch.full((256, 384), float("nan"), dtype=torch.bfloat16, device="cuda")
    mine = torch.cuda.Stream()
    mine.wait_stream(torch.cuda.current_stream())
    warm_up_the_context(tuning)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured = {}
    capturing, tuned = threading.Event(), threading.Event()
    errors = []

    def capture() -> None:
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
                captured["y"] = x * 2.0
                capturing.set()
                assert tuned.wait(timeout=120), "the tuning thread never finished"
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            capturing.set()

    worker = threading.Thread(target=capture)
    worker.start()
    assert capturing.wait(timeout=60)
    try:
        gemm(a, b, transb=True, out=out, stream=mine)
    finally:
        tuned.set()
        worker.join(timeout=120)
    assert not errors, f"the capture failed: {errors[0]!r}"
    graph.replay()
    mine.synchronize()
    torch.cuda.synchronize()
    assert stats(tuning)["tuned"] == 1
    torch.testing.assert_close(captured["y"], x * 2.0)
    check(out, reference(a.cpu(), b.cpu(), transb=True), TOL[torch.bfloat16])


@pytest.mark.gpu(1)
def test_disabled_uses_the_heuristic_first_then_tunes_once_enabled(tuning) -> None:
    a = varied(256, 512, seed=19, dtype=torch.bfloat16).cuda()
    b = varied(384, 512, seed=20, dtype=torch.bfloat16).cuda()
    ref = reference(a.cpu(), b.cpu(), transb=True)
    set_autotune_config(AutotuneConfig(enabled=False))
    check(gemm(a, b, transb=True), ref, TOL[torch.bfloat16])
    check(gemm(a, b, transb=True), ref, TOL[torch.bfloat16])
    assert stats(tuning) == {"hits": 1, "misses": 1, "entries": 1, "tuned": 0}
    set_autotune_config(AutotuneConfig(enabled=True, max_candidates=4, rounds=2))
    check(gemm(a, b, transb=True), ref, TOL[torch.bfloat16])
    check(gemm(a, b, transb=True), ref, TOL[torch.bfloat16])
    assert stats(tuning) == {"hits": 2, "misses": 2, "entries": 1, "tuned": 1}


@pytest.mark.gpu(1)
def test_pretuned_problems_are_cache_hits_for_gemm_calls(tuning) -> None:
    problems = [
        GemmProblem.linear(512, 1024, 768),
        GemmProblem.linear(512, 1024, 768, sm_count=32),  # another key: the SM target
        GemmProblem.linear(256, 1024, 512, dtype=E4M3),
        GemmProblem(256, 512, 384, dtype=torch.float32, transa=True, accumulate=True),
    ]
    results = autotune(problems)
    assert [r.problem for r in results] == problems
    for r in results[:3]:  # tensor-core GEMMs: cuBLASLt offers several algorithms
        assert r.status == "tuned", r
    # float32 (no TF32) may come with a single algorithm: settled untuned, nothing timed.
    assert results[3].status == "tuned" or (
        results[3].status == "untuned" and "single algorithm" in results[3].note
    ), results[3]
    for r in (r for r in results if r.status == "tuned"):
        assert len(r.times_ms) >= 2 and 0 <= r.chosen < len(r.times_ms)
        assert all(t is None or t > 0 for t in r.times_ms)
        assert r.times_ms[r.chosen] is not None
        if r.times_ms[0] is not None:  # never slower than the heuristic's first
            assert r.times_ms[r.chosen] <= r.times_ms[0]
            assert r.speedup is not None and r.speedup >= 1.0
    assert stats(tuning)["tuned"] == sum(r.status == "tuned" for r in results)
    assert stats(tuning)["entries"] == len(problems)
    misses = stats(tuning)["misses"]

    x = varied(512, 1024, seed=21, dtype=torch.bfloat16)
    w = varied(768, 1024, seed=22, dtype=torch.bfloat16)
    check(gemm(x.cuda(), w.cuda(), transb=True), reference(x, w, transb=True), 1e-2)
    qa = per_tensor_fp8(varied(256, 1024, seed=23), E4M3)
    qb = per_tensor_fp8(varied(512, 1024, seed=24), E4M3)
    y = gemm(qa.data.cuda(), qb.data.cuda(), transb=True, **scales(qa, qb, "cuda"))
    check(y, reference(qa.data, qb.data, transb=True, **scales(qa, qb)), 1e-2)
    assert stats(tuning)["misses"] == misses, "a pre-tuned key missed the cache"

    again = autotune(problems[:1])[0]
    assert again.status == "cached"
    assert (again.chosen, again.times_ms) == (results[0].chosen, results[0].times_ms)


@pytest.mark.gpu(1)
def test_autotune_reports_untuned_while_off_for_single_candidate_config(tuning) -> None:
    (r,) = autotune([GemmProblem.linear(128, 256, 256)], max_candidates=1)
    assert (r.status, r.times_ms, r.note) == ("untuned", (), "max_candidates is 1")
    assert stats(tuning)["tuned"] == 0


@pytest.mark.gpu(1)
def test_threads_missing_one_key_together_tune_it_once(tuning) -> None:
    a = varied(512, 1024, seed=25, dtype=torch.bfloat16).cuda()
    b = varied(512, 1024, seed=26, dtype=torch.bfloat16).cuda()
    ref = reference(a.cpu(), b.cpu(), transb=True)
    streams = [torch.cuda.Stream() for _ in range(4)]
    outs = [torch.full((512, 512), float("nan"), device="cuda") for _ in streams]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    start = threading.Barrier(len(streams))
    errors = []

    def run(i: int) -> None:
        try:
            start.wait(timeout=60)
            gemm(a, b, transb=True, out=outs[i], stream=streams[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, repr(errors[0])
    torch.cuda.synchronize()
    s = stats(tuning)
    assert (s["entries"], s["tuned"], s["hits"] + s["misses"]) == (1, 1, len(streams))
    for o in outs:
        check(o, ref, 1e-5)

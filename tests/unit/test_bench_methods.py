"""The registry of methods the overlap benchmark times (benchmarks/methods.py): names,
selection, applicability, shared objects, per-call settings and initialize_ub's defaults."""

from __future__ import annotations

import types

import pytest

from benchmarks import methods
from benchmarks import overlap_suite as suite


@pytest.mark.parametrize("tp", [2, 4])
def test_every_suite_row_has_a_registered_default_variant(tp: int) -> None:
    """The default of each row's GEMM name (overlap.ub) is a registered variant, derived from
    UbConfig rather than written down: e.g. GEMM+RS at TP 2 is the pulled ring (NOTE [ub tp
    2]), and a bulk_rs row's margin and pieces are bulk_rs_defaults(tp)'s."""
    from overlap.ops.bulk import bulk_rs_defaults

    names = {(v.op, v.name) for v in methods.registered()}
    for row in suite.build_suite(tp, full=True, cuda=True, tp_sizes=[tp]):
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
    # NOTE [plan alternates]: the variants a planned row may pick besides the default
    other = 2 if tp == 2 else 1
    assert methods.ub_alternate_variants("ag_gemm", "fc1", tp) == {
        f"ring_ag lanes={other} pieces=1 staggered": f"pipeline/lanes{other}-split1-staggered"
    }
    rs_alternates = set(methods.ub_alternate_variants("gemm_rs", "proj", tp).values())
    want = (
        {"pipeline/lanes1-split1"}
        if tp == 2
        else {"pipeline/lanes2-split1", "ring/lanes1-subchunks2-pull"}
    )
    assert rs_alternates == want and rs not in rs_alternates
    assert methods.ub_alternate_variants("bulk_rs", "qkv", tp) == {}


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
        def __init__(self, op: str, cuda: bool, fp8: bool = False) -> None:
            self.op, self.cuda, self.fp8 = op, cuda, fp8

    ag = [v for v in methods.registered() if v.op == "ag_gemm"]
    on_host = [v.name for v in ag if v.applies(FakeCase("ag_gemm", cuda=False))]
    on_gpu = [v.name for v in ag if v.applies(FakeCase("ag_gemm", cuda=True))]
    # Copies per peer (split > 1) only on cuda; pulls have no split.
    assert set(on_host) < set(on_gpu) and all("split" not in n or "split1" in n for n in on_host)
    assert "pull/lanes1" in on_host
    assert not any(v.applies(FakeCase("gemm_rs", cuda=True)) for v in ag)
    # The waiting GEMM (NOTE [waiting gemm]) multiplies bfloat16 only.
    assert "fused/pieces1" in on_host
    fp8 = [v.name for v in ag if v.applies(FakeCase("ag_gemm", cuda=False, fp8=True))]
    assert fp8 and not any(n.startswith("fused") for n in fp8)


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

"""Userbuffers set-up (overlap.ub) in one process: typed config validation, TE-dict
conversion, default methods, buffer sharing and its accounting, and the init/get/destroy
lifecycle on a 1-rank host group."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import overlap  # noqa: E402
from overlap.comm import Communicator  # noqa: E402
from overlap.errors import ConfigError, InvalidArgumentError, StateError  # noqa: E402
from overlap.gemm import gemm  # noqa: E402
from overlap.ops import (  # noqa: E402
    AllGatherBesideGemm,
    AllGatherGemm,
    GemmReduceScatter,
    ReduceScatterBesideGemm,
    RsMethod,
)
from overlap.ub import (  # noqa: E402
    GEMM_NAMES,
    BulkAgConfig,
    BulkRsConfig,
    GemmOverlapConfig,
    NoOverlapConfig,
    OverlapMethod,
    PipelineRsConfig,
    RingAgConfig,
    RingRsConfig,
    UbConfig,
    Userbuffers,
    default_method,
    destroy_ub,
    get_ub,
    initialize_ub,
    plan_label,
)
from overlap.ub.handle import place_windows  # noqa: E402
from tests.unit.test_buffers import Solo  # noqa: E402

M = OverlapMethod
DEFAULTS = {
    "qkv_fprop": M.RING_AG,
    "qkv_dgrad": M.BULK_AG,
    "qkv_wgrad": M.BULK_RS,
    "proj_fprop": M.PIPELINE_RS,
    "proj_dgrad": M.RING_AG,
    "proj_wgrad": M.NONE,
    "fc1_fprop": M.RING_AG,
    "fc1_dgrad": M.BULK_AG,
    "fc1_wgrad": M.BULK_RS,
    "fc2_fprop": M.PIPELINE_RS,
    "fc2_dgrad": M.RING_AG,
    "fc2_wgrad": M.NONE,
}


@pytest.fixture(autouse=True)
def _clean_registry() -> Iterator[None]:
    destroy_ub()
    yield
    destroy_ub()


def init(**kw: object) -> Userbuffers:
    kw.setdefault("transport", "host")
    return initialize_ub(kw.pop("shape", (64, 32)), Solo(), **kw)  # type: ignore[arg-type]


# ---- typed config ----------------------------------------------------------------------------


def test_default_methods() -> None:
    assert {n: default_method(n) for n in GEMM_NAMES} == DEFAULTS
    cfg = UbConfig(tokens=8, hidden=4)
    assert {n: c.method for n, c in cfg.gemms.items()} == DEFAULTS
    assert cfg.dtype == "bfloat16" and cfg.fp8_dtype == "float8_e4m3fn"
    # One config per method, every knob concrete (the core's defaults at any TP size).
    types = {type(c) for c in cfg.gemms.values()}
    assert types == {RingAgConfig, BulkAgConfig, BulkRsConfig, PipelineRsConfig, NoOverlapConfig}
    assert (
        cfg.gemms["qkv_fprop"] == RingAgConfig() and cfg.gemms["proj_fprop"] == PipelineRsConfig()
    )
    assert cfg.gemms["qkv_fprop"].compute_lanes == 2 and cfg.gemms["proj_fprop"].compute_lanes == 1
    wgrad, proj = cfg.gemms["qkv_wgrad"], cfg.gemms["proj_fprop"]
    assert wgrad.reduce_max_blocks == 64 and proj.reduce_max_blocks == 0
    assert wgrad.gemm_sm_margin == 8 and wgrad.pieces == 2
    # NOTE [bulk_rs defaults]: chosen for the TP size (4 pieces at TP 2, else 2).
    for tp, want in ((2, (8, 4)), (4, (8, 2))):
        wgrad = UbConfig(tokens=8, hidden=4, tp=tp).gemms["fc1_wgrad"]
        assert (wgrad.gemm_sm_margin, wgrad.pieces) == want
    given = UbConfig(8, 4, tp=2, gemms={"fc1_wgrad": GemmOverlapConfig(pieces=3)})
    assert (given.gemms["fc1_wgrad"].gemm_sm_margin, given.gemms["fc1_wgrad"].pieces) == (8, 3)
    assert cfg.gemms["qkv_fprop"].pieces == 1 == cfg.gemms["proj_fprop"].pieces


def test_tp2_defaults_to_the_ring_with_pulls() -> None:
    # NOTE [ub tp 2]
    rs_names = ("proj_fprop", "fc2_fprop")
    assert all(default_method(n, 2) is M.RING_RS for n in rs_names)
    assert all(default_method(n, tp) is M.PIPELINE_RS for n in rs_names for tp in (None, 1, 4))
    assert all(default_method(n, 2) == DEFAULTS[n] for n in GEMM_NAMES if n not in rs_names)
    cfg = UbConfig(tokens=8, hidden=4, tp=2)
    proj, fc2 = cfg.gemms["proj_fprop"], cfg.gemms["fc2_fprop"]
    assert proj == fc2 == RingRsConfig(pull_shards=True)
    assert proj.settings == "subchunks=2 pull" and proj.compute_lanes == 1
    assert UbConfig(tokens=8, hidden=4, tp=4).gemms["proj_fprop"] == PipelineRsConfig()
    # AG+GEMMs on one compute lane at TP 2 (given lanes stay), two elsewhere
    ag_names = [n for n, c in cfg.gemms.items() if c.method is M.RING_AG]
    assert ag_names == ["qkv_fprop", "proj_dgrad", "fc1_fprop", "fc2_dgrad"]
    assert all(cfg.gemms[n].compute_lanes == 1 for n in ag_names)
    for tp in (None, 4):
        assert all(UbConfig(8, 4, tp=tp).gemms[n].compute_lanes == 2 for n in ag_names)
    two = UbConfig(8, 4, tp=2, gemms={"qkv_fprop": GemmOverlapConfig(compute_lanes=2)})
    assert two.gemms["qkv_fprop"].compute_lanes == 2 and two.gemms["fc1_fprop"].compute_lanes == 1
    # A config made for any TP size runs with the group's defaults, its methods kept.
    any_tp = UbConfig(8, 4).for_tp(2)
    assert any_tp.gemms["qkv_fprop"].compute_lanes == 1 and any_tp.tp == 2
    assert any_tp.gemms["proj_fprop"] == PipelineRsConfig()
    assert any_tp.gemms["fc1_wgrad"].pieces == 4 and UbConfig(8, 4, tp=4).for_tp(2).tp == 4
    # Given settings stay: an explicit method, or pushes on the default ring.
    given = {
        "proj_fprop": GemmOverlapConfig(M.PIPELINE_RS),
        "fc2_fprop": GemmOverlapConfig(pull_shards=False, fp8=True),
    }
    cfg = UbConfig(tokens=8, hidden=4, tp=2, gemms=given)
    assert cfg.gemms["proj_fprop"] == PipelineRsConfig()
    assert cfg.gemms["fc2_fprop"] == RingRsConfig(pull_shards=False, fp8=True)
    # A ring that is asked for keeps its own defaults (pushes): only the core's choice pulls.
    asked = UbConfig(8, 4, tp=2, gemms={"proj_fprop": GemmOverlapConfig(M.RING_RS)})
    assert asked.gemms["proj_fprop"] == RingRsConfig() and not RingRsConfig().pull_shards
    # The TE-dict path: an entry without a method gets the TP 2 default as well.
    te = UbConfig.from_te_dict({"proj_fprop": {"fp8_buf": True}}, tokens=8, hidden=4, tp=2)
    assert te.gemms["proj_fprop"] == RingRsConfig(pull_shards=True, fp8=True)


def test_which_ag_gemms_keep_their_gathered_input() -> None:
    # NOTE [ub gathered inputs]: proj/fc2 dgrad keep it (their wgrad reads it); qkv/fc1 fprop
    # only when their backward does not re-gather (dgrad not BULK_AG).
    cfg = UbConfig(8, 4)
    keeps = {n: c.keep_gathered for n, c in cfg.gemms.items() if c.method is M.RING_AG}
    assert keeps == {
        "qkv_fprop": False,
        "proj_dgrad": True,
        "fc1_fprop": False,
        "fc2_dgrad": True,
    }
    assert not hasattr(cfg.gemms["qkv_dgrad"], "keep_gathered")  # not an AG+GEMM
    assert cfg.gemms["fc2_dgrad"].settings == "pieces=1 staggered keep_gathered"
    pipelined = UbConfig(8, 4, gemms={"fc1_dgrad": GemmOverlapConfig(M.PIPELINE_RS)})
    assert pipelined.gemms["fc1_fprop"].keep_gathered is True
    assert pipelined.gemms["qkv_fprop"].keep_gathered is False
    given = {"fc2_dgrad": GemmOverlapConfig(keep_gathered=False)}
    assert UbConfig(8, 4, gemms=given).gemms["fc2_dgrad"].keep_gathered is False
    with pytest.raises(ConfigError, match="keep_gathered: 1 must be True or False"):
        GemmOverlapConfig(keep_gathered=1)  # type: ignore[arg-type]


def test_pipelined_dgrad_leaves_wgrad_nothing_to_scatter() -> None:
    # NOTE [ub bulk]: a PIPELINE_RS dgrad reduce-scatters itself; its wgrad defaults to NONE.
    cfg = UbConfig(8, 4, gemms={"fc1_dgrad": GemmOverlapConfig(M.PIPELINE_RS)})
    assert cfg.gemms["fc1_wgrad"].method is M.NONE and cfg.gemms["qkv_wgrad"].method is M.BULK_RS
    explicit = {"fc1_dgrad": GemmOverlapConfig(M.PIPELINE_RS), "fc1_wgrad": GemmOverlapConfig()}
    assert UbConfig(8, 4, gemms=explicit).gemms["fc1_wgrad"].method is M.NONE
    kept = {
        "fc1_dgrad": GemmOverlapConfig(M.PIPELINE_RS),
        "fc1_wgrad": GemmOverlapConfig(M.BULK_RS),
    }
    assert UbConfig(8, 4, gemms=kept).gemms["fc1_wgrad"].method is M.BULK_RS
    # The ring-exchange GEMM+RS reduce-scatters itself as well.
    te = UbConfig.from_te_dict({"qkv_dgrad": {"method": "ring_exchange"}}, tokens=8, hidden=4)
    assert te.gemms["qkv_dgrad"].method is M.RING_RS and te.gemms["qkv_wgrad"].method is M.NONE


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "ring"}, "GemmOverlapConfig.method: 'ring' is not one of"),
        ({"compute_lanes": 5}, "compute_lanes: 5 is not an int in 1..4"),
        ({"compute_lanes": True}, "compute_lanes: True"),
        ({"put_split": 0}, "put_split: 0 is not an int in 1..8"),
        ({"reduce_max_blocks": -1}, "reduce_max_blocks: -1 is not an int in >= 0"),
        ({"gemm_sm_margin": 1.5}, "gemm_sm_margin: 1.5 is not an int in >= 0"),
        ({"fp8": 1}, "fp8: 1 must be True or False"),
        ({"pieces": 5}, "pieces: 5 is not an int in 1..4"),
    ],
)
def test_gemm_config_rejects(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        GemmOverlapConfig(**kwargs)  # type: ignore[arg-type]


def test_gemm_config_is_frozen_and_takes_strings() -> None:
    cfg = GemmOverlapConfig(method="pipeline_rs")  # type: ignore[arg-type]
    assert cfg.method is M.PIPELINE_RS
    with pytest.raises(AttributeError):
        cfg.fp8 = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tokens": 0}, "UbConfig.tokens: 0"),
        ({"hidden": 2.5}, "UbConfig.hidden: 2.5"),
        ({"dtype": "int8"}, r"UbConfig.dtype: 'int8' is not one of \['bfloat16'"),
        ({"fp8_dtype": torch.bfloat16}, "UbConfig.fp8_dtype: torch.bfloat16"),
        ({"timeout_s": 0}, "timeout_s: 0 must be > 0"),
        ({"tp": 0}, r"UbConfig.tp: 0 is not an int in >= 1"),
        ({"tp": True}, r"UbConfig.tp: True is not an int"),
        ({"gemms": {"qkv": GemmOverlapConfig()}}, r"unknown GEMM name 'qkv'; valid names: \["),
        ({"gemms": {"qkv_fprop": {"method": "ring_ag"}}}, "expected a GemmOverlapConfig"),
        (
            {"gemms": {"qkv_fprop": GemmOverlapConfig(M.PIPELINE_RS)}},
            r"qkv_fprop'\].method: 'pipeline_rs' does not fit .* allowed: \['ring_ag'",
        ),
        (
            {"gemms": {"fc1_wgrad": GemmOverlapConfig(M.RING_AG)}},
            r"allowed: \['bulk_ag', 'bulk_rs', 'none'\]",
        ),
    ],
)
def test_ub_config_rejects(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"tokens": 8, "hidden": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        UbConfig(**args)  # type: ignore[arg-type]


def test_ub_config_normalises_torch_dtypes() -> None:
    cfg = UbConfig(8, 4, dtype=torch.float16, fp8_dtype=torch.float8_e5m2)
    assert (cfg.dtype, cfg.fp8_dtype) == ("float16", "float8_e5m2")


# ---- TE dicts ---------------------------------------------------------------------------------


def test_te_dict_conversion() -> None:
    te = {
        "qkv_fprop": {"method": "ring_exchange", "fp8_buf": True},
        "proj_fprop": {"method": "pipeline", "atomic_gemm": False},
        "qkv_dgrad": {"method": "bulk"},
        "fc1_wgrad": {"method": "bulk"},
        "fc2_dgrad": {},
    }
    cfg = UbConfig.from_te_dict(te, tokens=8, hidden=4)
    want = RingAgConfig(fp8=True, keep_gathered=False)  # qkv_dgrad: bulk
    assert cfg.gemms["qkv_fprop"] == want
    assert cfg.gemms["proj_fprop"].method is M.PIPELINE_RS
    assert cfg.gemms["qkv_dgrad"].method is M.BULK_AG
    assert cfg.gemms["fc1_wgrad"].method is M.BULK_RS
    assert cfg.gemms["fc2_dgrad"].method is M.RING_AG  # no method: the default
    assert cfg.gemms["fc1_fprop"].method is M.RING_AG  # absent: the default


def test_te_dict_warns_for_keys_without_equivalent() -> None:
    te = {"proj_fprop": {"method": "pipeline", "num_sm": 24, "cga_size": 2, "set_sm_margin": 1}}
    with pytest.warns(UserWarning, match=r"not applied: \{'proj_fprop': \['cga_size', 'num_sm'"):
        UbConfig.from_te_dict(te, tokens=8, hidden=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for fully mapped entries
        cfg = UbConfig.from_te_dict(
            {"qkv_fprop": {"method": "ring_exchange"}, "fc2_fprop": {"method": "ring_exchange"}},
            tokens=8,
            hidden=4,
        )
    assert cfg.gemms["qkv_fprop"].method is M.RING_AG
    assert cfg.gemms["fc2_fprop"].method is M.RING_RS  # the ring-exchange GEMM+RS


def _te_default_entry(name: str, tp: int) -> dict[str, object]:
    """An entry as TransformerEngine's initialize_ub fills it in by default (its
    get_default_config), stream priorities included."""
    methods = {
        "ring_exchange": ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"),
        "pipeline": ("proj_fprop", "fc2_fprop"),
        "bulk": ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"),
        "external": ("proj_wgrad", "fc2_wgrad"),
    }
    method = next(m for m, names in methods.items() if name in names)
    ring = method == "ring_exchange"
    return {
        "method": method,
        "is_reduce_scatter": name in ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad"),
        "num_sm": 1 if ring else 16,
        "cga_size": 1 if ring else 2,
        "set_sm_margin": not ring,
        "num_splits": tp if ring else 4,
        "aggregate": False,
        "atomic_gemm": False,
        "use_ce": True,
        "fp8_buf": name in ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "fc1_fprop", "fc1_dgrad"),
        "comm_priority": -5,
        "gemm_priority": 0,
        "pipeline_rs_overlap_first_gemm": False,
    }


def test_te_default_entries_convert_as_they_are() -> None:
    # A TE user's whole default ub_cfgs converts: its methods are ours (external -> NONE, the
    # wgrad reading the dgrad's kept dY), is_reduce_scatter agrees with them, and the SM and
    # stream knobs are warned about once.
    te = {name: _te_default_entry(name, 4) for name in GEMM_NAMES}
    with pytest.warns(UserWarning, match=r"not applied: .*'comm_priority', 'gemm_priority'"):
        cfg = UbConfig.from_te_dict(te, tokens=8, hidden=4, tp=4)
    assert {n: c.method for n, c in cfg.gemms.items()} == DEFAULTS
    assert cfg.gemms["qkv_fprop"].fp8 and not cfg.gemms["proj_fprop"].fp8
    assert cfg.gemms["proj_wgrad"] == NoOverlapConfig()


@pytest.mark.parametrize(
    ("te", "match"),
    [
        ({"qkv_fprop": {"is_reduce_scatter": True}}, r"True contradicts the method 'ring_ag'"),
        (
            {"proj_fprop": {"method": "pipeline", "is_reduce_scatter": False}},
            r"False contradicts the method 'pipeline_rs', which reduce-scatters",
        ),
        ({"qkv_wgrad": {"method": "bulk", "is_reduce_scatter": 1}}, "must be True or False"),
        ({"qkv_fprop": {"atomic_gemm": "no"}}, r"atomic_gemm: 'no' must be True or False"),
        ({"qkv_wgrad": {"method": "external"}}, r"'external' is not one of \['bulk'\]"),
        ({"proj_wgrad": {"method": "ring_exchange"}}, r"is not one of \['bulk', 'external'\]"),
    ],
)
def test_te_dict_checks_types_and_is_reduce_scatter(te: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        UbConfig.from_te_dict(te, tokens=8, hidden=4)  # type: ignore[arg-type]


def test_method_configs_are_concrete_and_validated() -> None:
    # Defaults: the core's at any TP size; at_tp() takes a TP size's own.
    assert RingAgConfig().compute_lanes == 2 and RingAgConfig.at_tp(2).compute_lanes == 1
    assert RingAgConfig.at_tp(2, compute_lanes=3).compute_lanes == 3
    assert BulkRsConfig.at_tp(2).pieces == 4 and BulkRsConfig().pieces == 2
    assert RingRsConfig.knobs() == (
        "compute_lanes",
        "reduce_max_blocks",
        "ring_subchunks",
        "pull_shards",
    )
    with pytest.raises(ConfigError, match=r"RingAgConfig.compute_lanes: 5 is not an int in 1\.\.4"):
        RingAgConfig(compute_lanes=5)
    with pytest.raises(ConfigError, match=r"RingRsConfig.pull_shards: None must be True or False"):
        RingRsConfig(pull_shards=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"BulkRsConfig.fp8: 1 must be True or False"):
        BulkRsConfig(fp8=1)  # type: ignore[arg-type]
    # A per-method entry is taken as it is, at any TP size; its method counts for the others.
    given = {"fc1_dgrad": PipelineRsConfig(pieces=2), "qkv_fprop": RingAgConfig(pieces=3)}
    cfg = UbConfig(8, 4, tp=2, gemms=given)
    assert cfg.gemms["fc1_dgrad"] == PipelineRsConfig(pieces=2)
    assert cfg.gemms["fc1_wgrad"] == NoOverlapConfig()  # NOTE [ub bulk]
    assert cfg.gemms["qkv_fprop"].compute_lanes == 2  # given: the any-size default stays
    assert cfg.gemms["fc1_fprop"].keep_gathered  # its dgrad does not re-gather
    with pytest.raises(ConfigError, match=r"'ring_ag' does not fit"):
        UbConfig(8, 4, gemms={"proj_fprop": RingAgConfig()})
    # The knobs of other methods are ignored by the resolution.
    loose = GemmOverlapConfig(M.PIPELINE_RS, ring_subchunks=3, pull_shards=True, fp8=True)
    assert loose.resolve(M.PIPELINE_RS, 4) == PipelineRsConfig(fp8=True)


@pytest.mark.parametrize(
    ("te", "match"),
    [
        ({"attn_fprop": {}}, "unknown GEMM name 'attn_fprop'"),
        ({"qkv_fprop": {"methd": "bulk"}}, r"unknown keys \['methd'\]; known: "),
        ({"qkv_fprop": {"method": "pipeline"}}, "'pipeline' is a reduce-scatter overlap"),
        ({"qkv_wgrad": {"method": "ring_exchange"}}, r"is not one of \['bulk'\]"),
        ({"proj_fprop": {"method": "p2p"}}, r"'p2p' is not one of \['ring_exchange'"),
        ({"proj_fprop": {"atomic_gemm": True}}, "atomic_gemm: True is not supported"),
        ({"proj_fprop": {"fp8_buf": "yes"}}, "fp8_buf: 'yes' must be True or False"),
        ({"proj_fprop": 3}, "expected a dict"),
    ],
)
def test_te_dict_rejects(te: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        UbConfig.from_te_dict(te, tokens=8, hidden=4)  # type: ignore[arg-type]


# ---- buffers and accounting -------------------------------------------------------------------


def test_windows_of_one_buffer_are_shared_per_kind_and_counted() -> None:
    ub = init(shape=(64, 32))
    ag_bytes = AllGatherGemm.buffer_bytes(1, 64, 32, torch.bfloat16)
    rs_bytes = GemmReduceScatter.buffer_bytes(1, 64, 32, torch.bfloat16)
    bulk_ag_bytes = AllGatherBesideGemm.buffer_bytes(1, 64, 32, torch.bfloat16)
    bulk_rs_bytes = ReduceScatterBesideGemm.buffer_bytes(1, 64, 32, torch.bfloat16)
    # NOTE [userbuffer memory]: one buffer of the largest step's need; only the bulk pair's
    # windows are disjoint (the gathered input outlives the bulk all-gather).
    want = max(ag_bytes, rs_bytes, bulk_ag_bytes + bulk_rs_bytes)
    assert ub.total_bytes == want == ub.buffer.nbytes < ag_bytes + rs_bytes + 2 * bulk_ag_bytes
    assert ub.total_bytes <= ub.bound_bytes == 2 * 64 * 32 * 2
    ag = [ub.get(n) for n in ("qkv_fprop", "proj_dgrad", "fc1_fprop", "fc2_dgrad")]
    rs = [ub.get(n) for n in ("proj_fprop", "fc2_fprop")]
    bulk_ag = [ub.get(n) for n in ("qkv_dgrad", "fc1_dgrad")]
    bulk_rs = [ub.get(n) for n in ("qkv_wgrad", "fc1_wgrad")]
    assert all(isinstance(o, AllGatherGemm) for o in ag)
    assert all(isinstance(o, GemmReduceScatter) for o in rs)
    assert all(isinstance(o, AllGatherBesideGemm) for o in bulk_ag)
    assert all(isinstance(o, ReduceScatterBesideGemm) for o in bulk_rs)
    assert bulk_rs[0].reduce_max_blocks == 64 and bulk_rs[0].gemm_sm_margin == 8
    assert bulk_rs[0].pieces == 2  # one rank: the defaults of TP sizes other than 2
    kinds = (ag, rs, bulk_ag, bulk_rs)
    assert all(len({id(o.buffer) for o in ops}) == 1 for ops in kinds)
    assert len({id(ops[0].buffer) for ops in kinds}) == 4
    assert all(ops[0].buffer.is_window and ops[0].buffer.root is ub.buffer for ops in kinds)
    assert all(ops[0].buffer.allocated_bytes == 0 for ops in kinds)  # the root holds it
    assert (ag[0].buffer.nbytes, rs[0].buffer.nbytes) == (ag_bytes, rs_bytes)
    bag, brs = bulk_ag[0].buffer, bulk_rs[0].buffer
    assert bag.window_offset + bag.nbytes <= brs.window_offset  # disjoint
    assert ag[0].buffer.window_offset == rs[0].buffer.window_offset == 0  # shared bytes
    table = ub.describe()
    assert f"total: {ub.total_bytes} bytes per rank (1.00 x 2*T*H*2 = {ub.bound_bytes})" in table
    assert f"buffer: {want} bytes ({want} allocated), one per rank" in table
    assert "qkv_wgrad   bulk_rs      False -     #" in table
    assert "proj_wgrad  none         False -     not overlapped" in table
    assert f"bytes [0, {ag_bytes}), shared by qkv_fprop, proj_dgrad, fc1_fprop, fc2_dgrad" in table
    assert f"bytes [{brs.window_offset}, {want}), shared by qkv_wgrad, fc1_wgrad" in table
    assert "shared by qkv_dgrad, fc1_dgrad" in table


def test_place_windows() -> None:
    """Windows start at 0 but for the second of a disjoint pair, aligned; the size is the
    largest end (NOTE [userbuffer memory])."""
    ag, bag, brs, rs = (
        (M.RING_AG, "bfloat16", 1),
        (M.BULK_AG, "float8_e4m3fn", 1),
        (M.BULK_RS, "bfloat16", 1),
        (M.PIPELINE_RS, "bfloat16", None),
    )
    offsets, size = place_windows({ag: 100, bag: 300, brs: 500, rs: 700}, 256)
    assert offsets == {ag: 0, bag: 0, brs: 512, rs: 0} and size == 1012
    offsets, size = place_windows({brs: 500, rs: 200}, 256)  # no bulk AG: nothing to avoid
    assert offsets == {brs: 0, rs: 0} and size == 500
    assert place_windows({}, 256) == ({}, 0)


def test_pieces_reach_the_ops_and_share_the_buffer() -> None:
    ub = init(
        shape=(64, 32),
        ub_cfgs={
            "qkv_fprop": GemmOverlapConfig(pieces=3),
            "proj_fprop": GemmOverlapConfig(pieces=2),
            "fc2_fprop": GemmOverlapConfig(method=OverlapMethod.RING_RS, pieces=2),
            "qkv_wgrad": GemmOverlapConfig(pieces=3),  # BULK_RS (default method), default 2
        },
    )
    assert ub.get("qkv_wgrad").pieces == 3 and ub.get("fc1_wgrad").pieces == 2
    qkv, fc1 = ub.get("qkv_fprop"), ub.get("fc1_fprop")
    assert qkv.pieces == 3 and fc1.pieces == 1 and qkv.buffer is fc1.buffer
    x, w = rand(64, 32, seed=3), rand(24, 32, seed=4)
    assert torch.equal(qkv(x, w), gemm(x, w, transb=True))
    proj, fc2 = ub.get("proj_fprop"), ub.get("fc2_fprop")
    assert proj.pieces == 2 and fc2.pieces == 1  # the ring pipelines with ring_subchunks
    w2 = rand(32, 32, seed=5)  # [hidden, K_shard]
    assert torch.equal(proj(x, w2), gemm(x, w2, transb=True))
    ub.destroy()


def test_fp8_and_put_split_get_their_own_windows() -> None:
    gemms = {
        "qkv_fprop": GemmOverlapConfig(fp8=True),
        "fc1_fprop": GemmOverlapConfig(fp8=True),
        "proj_dgrad": GemmOverlapConfig(put_split=2),
        "proj_fprop": GemmOverlapConfig(fp8=True),  # RS: same window as the bf16 RSs
    }
    ub = init(shape=(64, 32), ub_cfgs=gemms)
    e4m3 = ub.get("qkv_fprop")
    assert e4m3.dtype == torch.float8_e4m3fn and e4m3.buffer is ub.get("fc1_fprop").buffer
    assert ub.get("proj_dgrad").buffer.put_split == 2
    assert ub.get("fc2_dgrad").buffer.put_split == 1
    assert len({id(ub.get(n).buffer) for n in ("qkv_fprop", "proj_dgrad", "fc2_dgrad")}) == 3
    assert ub.get("proj_fprop").buffer is ub.get("fc2_fprop").buffer
    assert e4m3.buffer.nbytes == AllGatherGemm.buffer_bytes(1, 64, 32, torch.float8_e4m3fn)
    want = max(
        GemmReduceScatter.buffer_bytes(1, 64, 32, torch.bfloat16),
        AllGatherBesideGemm.buffer_bytes(1, 64, 32, torch.bfloat16)
        + ReduceScatterBesideGemm.buffer_bytes(1, 64, 32, torch.bfloat16),
    )
    assert ub.total_bytes == want


def test_ring_rs_shares_the_gemm_rs_buffer() -> None:
    gemms = {
        "proj_fprop": GemmOverlapConfig(M.RING_RS, ring_subchunks=3),
        "fc2_fprop": GemmOverlapConfig("ring_rs", pull_shards=True),  # type: ignore[arg-type]
        # pull_shards is ignored by the pipelined method (which always pulls)
        "qkv_dgrad": GemmOverlapConfig(M.PIPELINE_RS, pull_shards=True),
    }
    ub = init(shape=(64, 32), ub_cfgs=gemms, register=False)
    proj, fc2, qkv = (ub.get(n) for n in ("proj_fprop", "fc2_fprop", "qkv_dgrad"))
    assert proj.method is RsMethod.RING and proj.ring_subchunks == 3 and not proj.pull_shards
    assert fc2.method is RsMethod.RING and fc2.ring_subchunks == 2 and fc2.compute_lanes == 1
    assert fc2.pull_shards and not qkv.pull_shards
    assert qkv.method is RsMethod.PIPELINED and qkv.buffer is proj.buffer is fc2.buffer
    # Sized for the larger need: the pipelined layout (2 tp - 1 slots; the ring's tp are as
    # many at one rank).
    rs_bytes = GemmReduceScatter.buffer_bytes(1, 64, 32, torch.bfloat16)
    assert proj.buffer.nbytes == rs_bytes <= ub.total_bytes == ub.buffer.nbytes  # host: exact
    table = ub.describe()
    assert "proj_fprop  ring_rs      False 1     #1             subchunks=3 push" in table
    assert "fc2_fprop   ring_rs      False 1     #1             subchunks=2 pull" in table
    assert "qkv_dgrad   pipeline_rs  False 1     #1             pieces=1 max_blocks=0" in table
    x, w = rand(64, 24, seed=7), rand(32, 24, seed=8)
    want = gemm(x, w, transb=True)
    assert torch.equal(proj(x, w), want) and torch.equal(qkv(x, w), want)
    assert torch.equal(fc2(x, w), want)  # the ring with pulls, one rank
    ub.destroy()
    only_ring = {n: GemmOverlapConfig(M.RING_RS) for n in ("proj_fprop", "fc2_fprop")}
    only_ring |= {n: GemmOverlapConfig(M.NONE) for n in ("qkv_dgrad", "fc1_dgrad")}
    ub = init(shape=(64, 32), ub_cfgs=only_ring, register=False)
    ring_bytes = GemmReduceScatter.buffer_bytes(1, 64, 32, torch.bfloat16, "ring")
    assert ub.get("proj_fprop").buffer.nbytes == ring_bytes <= rs_bytes
    ub.destroy()
    with pytest.raises(ConfigError, match=r"qkv_fprop'\].method: 'ring_rs' does not fit"):
        UbConfig(8, 4, gemms={"qkv_fprop": GemmOverlapConfig(M.RING_RS)})
    with pytest.raises(ConfigError, match=r"ring_subchunks: 5 is not an int in 1\.\.4"):
        GemmOverlapConfig(M.RING_RS, ring_subchunks=5)


def test_plan_alternates_vary_only_what_the_user_left_to_the_defaults() -> None:
    """NOTE [plan alternates]: the AG+GEMMs' other lane count; the GEMM+RS's other method and
    the pipelined one's lanes; nothing for the bulk methods, NONE or per-method entries."""
    four = UbConfig(8, 4, tp=4)
    assert four.alternates("qkv_fprop") == (RingAgConfig(compute_lanes=1),)
    pulled_ring = RingRsConfig(pull_shards=True)
    assert four.alternates("proj_fprop") == (PipelineRsConfig(compute_lanes=2), pulled_ring)
    assert [plan_label(c) for c in four.alternates("proj_fprop")] == [
        "pipeline_rs lanes=2 pieces=1 max_blocks=0",
        "ring_rs lanes=1 subchunks=2 pull",
    ]
    assert all(four.alternates(n) == () for n in ("qkv_dgrad", "fc1_wgrad", "fc2_wgrad"))
    two = UbConfig(8, 4, tp=2)  # the pulled ring by default (NOTE [ub tp 2])
    assert two.alternates("proj_fprop") == (PipelineRsConfig(),)  # its second lane: not here
    assert two.alternates("fc2_dgrad") == (RingAgConfig(compute_lanes=2, keep_gathered=True),)
    given = {
        "qkv_fprop": GemmOverlapConfig(compute_lanes=1),
        "fc1_fprop": RingAgConfig(),
        "proj_dgrad": GemmOverlapConfig(pull_shards=True),
        "proj_fprop": GemmOverlapConfig(M.PIPELINE_RS),
        "fc2_fprop": GemmOverlapConfig(M.RING_RS, pull_shards=False),
        "fc2_dgrad": GemmOverlapConfig(fp8=True),
    }
    cfg = UbConfig(8, 4, tp=4, gemms=given)
    assert all(cfg.alternates(n) == () for n in ("qkv_fprop", "fc1_fprop", "proj_dgrad"))
    assert cfg.alternates("proj_fprop") == (PipelineRsConfig(compute_lanes=2),)
    assert cfg.alternates("fc2_fprop") == ()  # the ring, its pulls and lanes all given
    fp8_lanes1 = RingAgConfig(compute_lanes=1, keep_gathered=True, fp8=True)
    assert cfg.alternates("fc2_dgrad") == (fp8_lanes1,)
    # A config made for any TP size remembers which methods were given.
    assert UbConfig(8, 4).for_tp(4).alternates("proj_fprop") == four.alternates("proj_fprop")
    pipelined = UbConfig(8, 4, gemms={"proj_fprop": GemmOverlapConfig(M.PIPELINE_RS)})
    assert pipelined.for_tp(4).alternates("proj_fprop") == (PipelineRsConfig(compute_lanes=2),)
    with pytest.raises(ConfigError, match="unknown GEMM name"):
        four.alternates("qkv")


def test_alternate_ops_share_their_names_window_and_compute_the_same() -> None:
    with init(shape=(64, 32), register=False) as ub:
        proj = ub.get("proj_fprop")
        alternates = ub.alternates("proj_fprop")
        want = [plan_label(c) for c in ub.config.for_tp(1).alternates("proj_fprop")]
        assert list(alternates) == want and len(want) == 2
        assert ub.alternates("proj_fprop") is alternates  # built once
        methods = [op.method for op in alternates.values()]
        assert methods == [RsMethod.PIPELINED, RsMethod.RING]
        x, w = rand(64, 24, seed=3), rand(32, 24, seed=4)
        ref = gemm(x, w, transb=True)
        for op in (proj, *alternates.values()):
            assert op.buffer is proj.buffer and torch.equal(op(x, w), ref)
        (qkv,) = ub.alternates("qkv_fprop").values()
        assert qkv.buffer is ub.get("qkv_fprop").buffer and qkv.compute_lanes == 1
        assert ub.alternates("qkv_dgrad") == {}
        text = ub.describe()
        assert f"  proj_fprop: {'; '.join(want)}" in text and "  qkv_dgrad:" not in text
        with pytest.raises(ConfigError, match="not overlapped"):
            ub.alternates("fc2_wgrad")
    with pytest.raises(StateError, match="after destroy"):
        ub.alternates("proj_fprop")


def test_use_fp8_applies_to_every_gemm_without_an_entry() -> None:
    ub = init(use_fp8=True, ub_cfgs={"fc2_dgrad": GemmOverlapConfig(compute_lanes=3)})
    assert ub.get("qkv_fprop").dtype == torch.float8_e4m3fn
    assert ub.get("fc2_dgrad").dtype == torch.bfloat16
    assert ub.get("fc2_dgrad").compute_lanes == 3


# ---- ops and lifecycle ------------------------------------------------------------------------


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_shape_plans_default_to_the_transports_and_a_given_policy_is_checked_first() -> None:
    from overlap.ub import PlanPolicy

    with pytest.raises(ConfigError, match="shape_plans: 'sometimes'"):
        init(register=False, shape_plans="sometimes")
    with init(register=False) as ub:  # the host transport: always (PlanPolicy.default_for)
        assert ub.plans.policy is PlanPolicy.ALWAYS
    with init(register=False, shape_plans="measured") as ub:
        assert ub.plans.policy is PlanPolicy.MEASURED


def test_lifecycle_and_ops_through_the_registry() -> None:
    with pytest.raises(StateError, match="call initialize_ub"):
        get_ub("qkv_fprop")
    ub = init(shape=(64, 32))
    with pytest.raises(StateError, match="already initialised"):
        init()
    # A default handle destroyed directly stops being the default: initialize_ub may run again
    # (it used to refuse with "already initialised" until destroy_ub()).
    ub.destroy()
    with pytest.raises(StateError, match="call initialize_ub"):
        get_ub("qkv_fprop")
    ub = init(shape=(64, 32))
    assert overlap.get_ub("qkv_fprop") is ub.get("qkv_fprop")
    x, w = rand(40, 32, seed=1), rand(24, 32, seed=2)
    want = gemm(x, w, transb=True)
    assert torch.equal(get_ub("fc1_fprop")(x, w), want)
    w_rs = rand(32, 24, seed=3)
    x_rs = rand(64, 24, seed=4)
    assert torch.equal(get_ub("fc2_fprop")(x_rs, w_rs), gemm(x_rs, w_rs, transb=True))
    with pytest.raises(InvalidArgumentError, match=r"tp \* m <= 64"):
        get_ub("qkv_fprop")(rand(65, 32, seed=5), w)
    with pytest.raises(InvalidArgumentError, match=r"<= max_tokens \(64\)"):
        get_ub("proj_fprop")(rand(65, 24, seed=6), w_rs)
    with pytest.raises(ConfigError, match=r"valid names: \['qkv_fprop'"):
        get_ub("qkv")
    with pytest.raises(ConfigError, match=r"proj_wgrad is not overlapped \(method none\)"):
        get_ub("proj_wgrad")
    assert not ub.is_overlapped("proj_wgrad") and ub.is_overlapped("proj_fprop")
    # A row-parallel backward: the dgrad's gathered dY stays in its buffer for the wgrad (NOTE
    # [ub gathered inputs]); fprop's AG+GEMM does not keep its gathered input by default.
    dy_shard, w_proj = rand(16, 32, seed=10), rand(24, 32, seed=11)
    assert torch.equal(get_ub("proj_dgrad")(dy_shard, w_proj), gemm(dy_shard, w_proj, transb=True))
    assert torch.equal(get_ub("proj_dgrad").gathered_input(), dy_shard)
    with pytest.raises(StateError, match="keep_gathered=True"):
        get_ub("fc1_fprop").gathered_input()
    # The bulk pair of a column-parallel backward (NOTE [ub bulk]): gather the input beside
    # dgrad, then reduce-scatter dgrad's partial sums beside wgrad, which reads the gathered
    # input from the other buffer.
    x_shard, dy, w_fc1 = rand(64, 32, seed=7), rand(64, 24, seed=8), rand(24, 32, seed=9)
    dgrad = get_ub("fc1_dgrad")(x_shard, dy, w_fc1)
    assert torch.equal(dgrad, gemm(dy, w_fc1))
    gathered = get_ub("fc1_dgrad").gathered_input()
    dx, dw = get_ub("fc1_wgrad")(dgrad, dy, gathered, transa=True)
    assert torch.equal(dx, dgrad) and torch.equal(dw, gemm(dy, x_shard, transa=True))
    buffers = {id(ub.get(n).buffer): ub.get(n).buffer for n in ("qkv_fprop", "proj_fprop")}
    held = ub.get("fc1_fprop")
    destroy_ub()
    with pytest.raises(StateError, match="symmetric buffer is destroyed"):
        held(x, w)  # an op kept past destroy_ub()
    assert ub.destroyed and all(b.destroyed for b in buffers.values())
    destroy_ub()  # idempotent
    with pytest.raises(StateError, match="call initialize_ub"):
        get_ub("qkv_fprop")
    with pytest.raises(StateError, match="after destroy"):
        ub.get("qkv_fprop")


def test_many_init_destroy_cycles_and_unregistered_handles() -> None:
    for _ in range(20):
        init(shape=(16, 8))
        destroy_ub()
    with init(shape=(16, 8), register=False) as ub:
        with pytest.raises(StateError):
            get_ub("qkv_fprop")  # not the default
        assert ub.get("qkv_fprop").max_tokens == 16
    assert ub.destroyed


def test_init_rejects_before_anything_collective() -> None:
    with pytest.raises(ConfigError, match=r"shape: \(64,\) must be \(tokens, hidden\)"):
        init(shape=(64,))
    with pytest.raises(ConfigError, match="tp_group: str is not a torch ProcessGroup"):
        initialize_ub((64, 32), "tp", transport="host")
    with pytest.raises(ConfigError, match="unknown transport 'ib'"):
        init(transport="ib")
    cfg = UbConfig(64, 32)
    with pytest.raises(ConfigError, match=r"tokens=32 contradicts ub_cfgs\.tokens=64"):
        init(shape=(32, 32), ub_cfgs=cfg)
    with pytest.raises(ConfigError, match="use_fp8 with a UbConfig"):
        init(ub_cfgs=cfg, use_fp8=True)
    assert init(ub_cfgs=cfg).config is cfg
    destroy_ub()
    with pytest.raises(ConfigError, match="made for TP size 2 but the group has 1 ranks"):
        init(ub_cfgs=UbConfig(64, 32, tp=2))
    assert init().config.tp == 1  # initialize_ub chooses the defaults for its group


def test_te_dict_through_initialize_ub() -> None:
    te = {"qkv_fprop": {"method": "ring_exchange", "fp8_buf": True, "num_sm": 4}}
    with pytest.warns(UserWarning, match="not applied") as record:
        ub = init(ub_cfgs=te)
    assert record[0].filename == __file__  # attributed to the caller of initialize_ub
    assert ub.get("qkv_fprop").dtype == torch.float8_e4m3fn
    assert ub.config.gemms["proj_fprop"].method is M.PIPELINE_RS


def test_given_buffer_must_be_large_enough_and_is_not_freed_by_the_op() -> None:
    comm = Communicator(Solo(), "host")
    try:
        need = AllGatherGemm.buffer_bytes(1, 32, 16, torch.bfloat16)
        small = comm.create_buffer(need - 1, "small")
        with pytest.raises(InvalidArgumentError, match=r"buffer 'small' .* needs a live buffer"):
            AllGatherGemm(comm, 32, 16, torch.bfloat16, buffer=small)
        buf = comm.create_buffer(GemmReduceScatter.buffer_bytes(1, 32, 16, torch.float32), "b")
        op = GemmReduceScatter(comm, 32, 16, torch.float32, buffer=buf)
        op.destroy()
        assert not buf.destroyed
        x, w = torch.randn(32, 8), torch.randn(16, 8)
        other = GemmReduceScatter(comm, 32, 16, torch.float32, buffer=buf)
        assert torch.equal(other(x, w), gemm(x, w, transb=True))
    finally:
        comm.destroy()


def test_fused_gemm_is_a_ring_ag_knob_on_the_pulls() -> None:
    """NOTE [fused ag_gemm]: the waiting GEMM runs on the pulls, so a config asking for it
    without them is refused at construction; resolved, it reaches the op's arguments."""
    with pytest.raises(ConfigError, match="set pull_shards=True as well"):
        RingAgConfig(fused_gemm=True)
    fused = RingAgConfig(pull_shards=True, fused_gemm=True)
    assert fused.settings == "pieces=1 pull fused"
    assert fused.op_kwargs()["fused_gemm"] is True and not RingAgConfig().fused_gemm
    given = GemmOverlapConfig(M.RING_AG, pull_shards=True, fused_gemm=True)
    assert given.resolve(M.RING_AG, 4) == RingAgConfig.at_tp(4, pull_shards=True, fused_gemm=True)
    with pytest.raises(ConfigError, match="fused_gemm: 1 must be True or False"):
        GemmOverlapConfig(fused_gemm=1)  # type: ignore[arg-type]

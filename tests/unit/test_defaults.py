"""One source for every tuning default and limit (NOTE [overlap defaults] in
``csrc/comm/overlap/overlap_ops.h``): the C++ core defines them, the binding exposes them,
Python reads them.

* No Python layer restates one: an AST scan of ``overlap/`` fails on a literal default (other
  than None) of a tuning knob, as a parameter or a dataclass field, and on a literal bound or
  alignment constant (``MAX_*``, ``*ALIGNMENT``...).
* What Python shows equals the binding's: the op classes' defaults, the per-method configs'
  field defaults, ``UbConfig``'s resolved defaults per TP size (the TP 2 choices of NOTE [ub tp
  2] included), the binding's own keyword defaults, and the limits the validation enforces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from overlap._native import native  # noqa: E402
from overlap.buffers import ALIGNMENT  # noqa: E402
from overlap.comm import Communicator  # noqa: E402
from overlap.errors import ConfigError, InvalidArgumentError  # noqa: E402
from overlap.ops import (  # noqa: E402
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
    OverlapMethod,
    PipelineRsConfig,
    RingAgConfig,
    RingRsConfig,
    UbConfig,
)
from tests.unit.test_buffers import Solo  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "overlap"

# The tuning knobs of the overlap ops (the fields of the core's config structs, and a buffer's
# put_split): a Python default of one of these is a restated default.
KNOBS = frozenset(
    {
        "compute_lanes",
        "staggered_puts",
        "pieces",
        "pull_shards",
        "keep_gathered",
        "ring_subchunks",
        "reduce_max_blocks",
        "gemm_sm_margin",
        "put_split",
    }
)
# Constants that hold a bound, a default or an alignment.
LIMIT_NAME = re.compile(r"(^|_)(MAX|MIN|DEFAULT)(_|$)|ALIGNMENT$")
# Restated limits with the reason each may stay: empty, and it must stay so.
KNOWN: set[tuple[str, str]] = set()


def _literal(node: ast.expr | None) -> bool:
    """A literal (a number, bool or string, or a negated number), not None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None


def _number(node: ast.expr | None) -> bool:
    """A literal int or float (not a bool)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    )


def _restated(package: Path) -> set[tuple[str, str]]:
    """(file, what) of every literal default of a knob (a parameter or a class field) and of
    every limit constant bound to a literal number, in the ``.py`` files under ``package``."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                pairs = list(
                    zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
                )
                pairs += list(zip(a.kwonlyargs, a.kw_defaults, strict=True))
                for arg, default in pairs:
                    if arg.arg in KNOBS and _literal(default):
                        found.add((rel, f"{node.name}({arg.arg}=)"))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.target.id in KNOBS
                        and _literal(item.value)
                    ):
                        found.add((rel, f"{node.name}.{item.target.id}"))
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _number(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and LIMIT_NAME.search(t.id.lstrip("_")):
                        found.add((rel, t.id))
    return found


def test_no_python_layer_restates_a_default_or_limit() -> None:
    found = _restated(PACKAGE)
    unexpected = sorted(found - KNOWN)
    assert not unexpected, (
        "defaults and limits are the C++ core's (NOTE [overlap defaults]): read them from "
        "overlap._C.comm_ops instead of writing them down:\n"
        + "\n".join(f"{f}: {n}" for f, n in unexpected)
    )
    done = sorted(KNOWN - found)
    assert not done, f"no longer restated; delete them from KNOWN: {done}"


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    # Each form the scan refuses, and what it lets pass (None, calls, non-knobs, non-limits).
    (tmp_path / "overlap").mkdir()
    (tmp_path / "overlap" / "m.py").write_text(
        """
import dataclasses
MAX_PIECES = 4
SLOT_ALIGNMENT: int = 256
_DEFAULT_SPLIT = -1
BLOCK_EDGE = 128
MAX_NAME = "x"
def op(comm, *, compute_lanes=2, pieces=None, name="x"): ...
def other(a, staggered_puts=True, put_split=default()): ...
@dataclasses.dataclass
class Config:
    ring_subchunks: int = 2
    keep_gathered: bool | None = None
    gemm_sm_margin: int = field()
    fp8: bool = False
"""
    )
    assert {n for _, n in _restated(tmp_path / "overlap")} == {
        "MAX_PIECES",
        "SLOT_ALIGNMENT",
        "_DEFAULT_SPLIT",
        "op(compute_lanes=)",
        "other(staggered_puts=)",
        "Config.ring_subchunks",
    }


def _fields(config: object) -> dict[str, object]:
    """A binding config struct as a dict."""
    return {f: getattr(config, f) for f in type(config).FIELDS}


@pytest.fixture
def comm() -> Communicator:
    c = Communicator(Solo(), "host")
    yield c
    c.destroy()


def test_op_classes_take_the_core_defaults(comm: Communicator) -> None:
    ops = native().comm_ops
    ag = AllGatherGemm(comm, 16, 8, torch.bfloat16)
    want = _fields(ops.ag_gemm_defaults(0))  # any TP size (NOTE [ub tp 2])
    assert {k: getattr(ag, k) for k in want} == want
    rs = GemmReduceScatter(comm, 16, 8, torch.bfloat16)
    assert rs.method is RsMethod.of_native(ops.gemm_rs_default(0).method)
    want = _fields(ops.gemm_rs_defaults(0))
    assert {k: getattr(rs, k) for k in want} == want
    ring = GemmReduceScatter(comm, 16, 8, torch.bfloat16, method="ring")
    want = _fields(ops.gemm_rs_ring_defaults(0))
    assert {k: getattr(ring, k) for k in want} == want
    bulk = ReduceScatterBesideGemm(comm, 16, 8, torch.bfloat16)
    want = _fields(ops.bulk_rs_defaults(1))  # its group's size
    assert {k: getattr(bulk, k) for k in want} == want
    assert ag.buffer.put_split == ops.DEFAULT_PUT_SPLIT
    for op in (ag, rs, ring, bulk):
        op.destroy()


def test_the_binding_keyword_defaults_are_the_structs() -> None:
    ops = native().comm_ops

    def signature_defaults(fn: object) -> dict[str, str]:
        line = fn.__doc__.splitlines()[0]  # type: ignore[attr-defined]
        return dict(re.findall(r"\b(\w+): [^=,]+ = ([^,)]+)", line))

    got = signature_defaults(ops.ag_gemm)
    for k, v in _fields(ops.AgGemmConfig()).items():
        assert got[k] == str(v), (k, got[k], v)
    got = signature_defaults(ops.reduce_scatter_beside_gemm)
    for k, v in _fields(ops.BulkRsConfig()).items():
        assert got[k] == str(v), (k, got[k], v)
    got = signature_defaults(ops.gemm_rs)
    assert got["method"] == repr(ops.GemmRsDefault().method)
    for k in ("compute_lanes", "reduce_max_blocks", "ring_subchunks", "pieces", "pull_shards"):
        assert got[k] == "None", k  # the method's own struct decides


def test_method_configs_default_to_the_core() -> None:
    ops = native().comm_ops
    pairs = [
        (RingAgConfig, ops.ag_gemm_defaults),
        (PipelineRsConfig, ops.gemm_rs_defaults),
        (RingRsConfig, ops.gemm_rs_ring_defaults),
        (BulkRsConfig, ops.bulk_rs_defaults),
    ]
    for tp in (None, 1, 2, 3, 4, 8):
        size = 0 if tp is None else tp
        for cls, defaults in pairs:
            cfg = cls() if tp is None else cls.at_tp(tp)
            want = _fields(defaults(size))
            assert {k: getattr(cfg, k) for k in want} == want, (cls.__name__, tp)
            if "put_split" in cls.knobs():
                assert cfg.put_split == ops.DEFAULT_PUT_SPLIT
        assert BulkAgConfig().put_split == ops.DEFAULT_PUT_SPLIT


@pytest.mark.parametrize("tp", [None, 1, 2, 3, 4, 8])
def test_ub_config_resolves_to_the_core_defaults(tp: int | None) -> None:
    ops = native().comm_ops
    size = 0 if tp is None else tp
    cfg = UbConfig(8 * 8, 4, tp=tp)
    rs_default = ops.gemm_rs_default(size)
    for name in GEMM_NAMES:
        c = cfg.gemms[name]
        if c.method is OverlapMethod.RING_AG:
            want = _fields(ops.ag_gemm_defaults(size))
            del want["keep_gathered"]  # the GEMM name's (NOTE [ub gathered inputs])
        elif c.method is OverlapMethod.RING_RS:
            assert rs_default.method == ops.RsMethod.RING
            want = {
                **_fields(ops.gemm_rs_ring_defaults(size)),
                "pull_shards": rs_default.pull_shards,
            }
        elif c.method is OverlapMethod.PIPELINE_RS:
            assert rs_default.method == ops.RsMethod.PIPELINED
            want = _fields(ops.gemm_rs_defaults(size))
        elif c.method is OverlapMethod.BULK_RS:
            want = _fields(ops.bulk_rs_defaults(size))
        else:
            want = {}
        assert {k: getattr(c, k) for k in want} == want, (name, tp)
    # Explicit methods take their own struct's defaults at the TP size, too.
    given = {"proj_fprop": GemmOverlapConfig(OverlapMethod.RING_RS)}
    ring = UbConfig(8 * 8, 4, tp=tp, gemms=given).gemms["proj_fprop"]
    assert {k: getattr(ring, k) for k in RingRsConfig.knobs()} == _fields(
        ops.gemm_rs_ring_defaults(size)
    )


def test_validation_enforces_the_core_limits(comm: Communicator) -> None:
    ops = native().comm_ops
    limits = {
        "compute_lanes": ops.MAX_COMPUTE_LANES,
        "pieces": ops.MAX_PIECES,
        "ring_subchunks": ops.MAX_RING_SUBCHUNKS,
        "put_split": ops.MAX_PUT_SPLIT,
    }
    for knob, limit in limits.items():
        GemmOverlapConfig(**{knob: limit})
        with pytest.raises(
            ConfigError, match=rf"{knob}: {limit + 1} is not an int in 1\.\.{limit}"
        ):
            GemmOverlapConfig(**{knob: limit + 1})
    AllGatherGemm(comm, 16, 8, torch.bfloat16, compute_lanes=ops.MAX_COMPUTE_LANES).destroy()
    with pytest.raises(InvalidArgumentError, match=rf"pieces must be 1\.\.{ops.MAX_PIECES}"):
        AllGatherGemm(comm, 16, 8, torch.bfloat16, pieces=ops.MAX_PIECES + 1)
    with pytest.raises(InvalidArgumentError, match=r"ring_subchunks must be 1\.\."):
        GemmReduceScatter(
            comm, 16, 8, torch.bfloat16, method="ring", ring_subchunks=ops.MAX_RING_SUBCHUNKS + 1
        )
    assert ALIGNMENT == ops.SLOT_ALIGNMENT
    scale_offset, _ = ops.ag_gemm_layout(2, 100, True)
    assert scale_offset % ALIGNMENT == 0
    assert native().gemm.MAX_AUTOTUNE_CANDIDATES >= 1

"""The overlap ops benchmark's suite (:mod:`benchmarks.overlap_ops`): which rows run, with
which shapes, and the peer reference data shown beside them.

* The rows: op x shape x M x TP size x dtype, from the Llama-3-70B-like layers of
  docs/design.md §6 (hidden 8192, FFN 28672, GQA QKV 10240), TransformerEngine's shapes
  (K = N = hidden) and the bulk rows (NOTE [bulk rows] in benchmarks/overlap_ops.py); on the
  host transport, their tiny twins (:func:`host_scaled`).
* The peer reference: TransformerEngine's times measured on 4xH200, read from
  ``benchmarks/data/te_reference.json`` (where each figure comes from is written there), for
  the GPU rows that match what TE measured (:func:`te_reference`, :func:`te_floor_reference`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.methods import BULK_OPS, OPS

HIDDEN, FFN, QKV = 8192, 28672, 10240  # Llama-3-70B-like (docs/design.md §6)
SUITE_TOKENS = (8192, 16384)
SUITE_TP = (2, 4)
TE_HIDDEN = (8192, 4096)
DTYPES = ("bf16", "fp8")
LLAMA_SHAPES = ("fc1", "qkv", "fc2", "proj")
QUICK = (
    ("ag_gemm", "fc1", "bf16"),
    ("ag_gemm", "qkv", "fp8"),
    ("gemm_rs", "fc2", "bf16"),
    ("gemm_rs", "proj", "fp8"),
    ("bulk_ag", "qkv", "fp8"),
    ("bulk_rs", "fc1", "bf16"),
)
BULK_LAYERS = ("qkv", "fc1")
HOST_M_DIV, HOST_KN_DIV, HOST_ALIGN = 256, 128, 16

TE_REFERENCE_FILE = Path(__file__).resolve().parent / "data" / "te_reference.json"

TeKey = tuple[str, int, str]  # (op, hidden, dtype)


@dataclass(frozen=True)
class TeReference:
    """TransformerEngine's times of one run, as ``benchmarks/data/te_reference.json`` holds them.

    Attributes:
        source: one line saying what the figures are (shown in the table and the JSON).
        tp: the TP size of TE's run.
        tokens: its M.
        best: (TE's best time in ms, its method) by (op, hidden, dtype).
        gemm_comm: (TE's T_gemm, TE's T_comm) in ms by the same key: TE's own floor is their
            maximum.
    """

    source: str
    tp: int
    tokens: int
    best: Mapping[TeKey, tuple[float, str]]
    gemm_comm: Mapping[TeKey, tuple[float, float]]


def load_te_reference(path: Path = TE_REFERENCE_FILE) -> TeReference:
    """Reads and checks the TE reference file (its format: the file itself).

    Raises:
        ValueError: a missing or malformed field, a time that is not positive, an unknown op
            or dtype, or a key given twice (the message names the file).
    """
    try:
        data = json.loads(Path(path).read_text())
        best: dict[TeKey, tuple[float, str]] = {}
        gemm_comm: dict[TeKey, tuple[float, float]] = {}
        for row in data["rows"]:
            key = (str(row["op"]), int(row["hidden"]), str(row["dtype"]))
            times = [float(row[f]) for f in ("te_best_ms", "te_gemm_ms", "te_comm_ms")]
            if key[0] not in OPS or key[2] not in DTYPES or key in best or min(times) <= 0:
                raise ValueError(f"bad row {row}")
            best[key] = (times[0], str(row["method"]))
            gemm_comm[key] = (times[1], times[2])
        return TeReference(
            str(data["source"]), int(data["tp"]), int(data["tokens"]), best, gemm_comm
        )
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid TE reference file ({exc!r})") from exc


TE = load_te_reference()
# The figures by key, as earlier versions of the benchmark had them in code.
TE_TP, TE_TOKENS, TE_SOURCE = TE.tp, TE.tokens, TE.source
TE_BEST_4XH200: Mapping[TeKey, tuple[float, str]] = TE.best
TE_FLOOR_4XH200: Mapping[TeKey, tuple[float, float]] = TE.gemm_comm


def llama_shape(name: str, m: int, tp: int) -> dict[str, Any]:
    """One docs/design.md §6 shape: AG+GEMM gives K = hidden and the local N; GEMM+RS the
    local K."""
    ops = {
        "fc1": ("ag_gemm", HIDDEN, 2 * FFN // tp),
        "qkv": ("ag_gemm", HIDDEN, QKV // tp),
        "fc2": ("gemm_rs", FFN // tp, HIDDEN),
        "proj": ("gemm_rs", HIDDEN // tp, HIDDEN),
    }
    op, k, n = ops[name]
    return {"op": op, "shape": name, "M": m, "K": k, "N": n, "tp": tp}


def bulk_shape(op: str, name: str, m: int, tp: int) -> dict[str, Any]:
    """A bulk row (NOTE [bulk rows]): the backward of layer ``name`` (qkv or fc1): K = hidden
    (the collective's columns), N = the layer's local N shard."""
    n = {"qkv": QKV // tp, "fc1": 2 * FFN // tp}[name]
    return {"op": op, "shape": name, "M": m, "K": HIDDEN, "N": n, "tp": tp}


def suite_shape(op: str, name: str, m: int, tp: int) -> dict[str, Any]:
    """The row of ``op`` for shape ``name`` (a layer of docs/design.md §6)."""
    return bulk_shape(op, name, m, tp) if op in BULK_OPS else llama_shape(name, m, tp)


def te_shape(op: str, hidden: int, tp: int) -> dict[str, Any]:
    """TE's benchmark shapes: K = N = hidden for both ops (the local GEMM), M = 8192."""
    return {"op": op, "shape": f"te{hidden}", "M": TE_TOKENS, "K": hidden, "N": hidden, "tp": tp}


def suite_tp_sizes(world: int, full: bool) -> list[int]:
    """Quick: the world size. Full: 2 and 4 where they divide the world size, and the world."""
    if not full:
        return [world]
    return sorted({t for t in SUITE_TP if t <= world and world % t == 0} | {world})


def build_suite(
    world: int,
    *,
    full: bool,
    cuda: bool,
    tp_sizes: Sequence[int] | None = None,
    shapes: Sequence[str] | None = None,
    dtypes: Sequence[str] = DTYPES,
    ops: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The rows to run, grouped by TP size: dicts of op, shape, M, K, N, tp, dtype.

    Args:
        world: the number of ranks.
        full: the whole suite (else the quick rows).
        cuda: real shapes (else scaled down for the host transport, see :func:`host_scaled`).
        tp_sizes: TP sizes to run (default :func:`suite_tp_sizes`); each must divide ``world``.
        shapes: keep only these shape names (fc1, qkv, fc2, proj, te8192, te4096).
        dtypes: keep only these dtypes (bf16, fp8).
        ops: keep only these ops (ag_gemm, gemm_rs, bulk_ag, bulk_rs; default all).

    Raises:
        ValueError: a TP size that does not divide ``world``, an unknown dtype, op or shape,
            or a selection that leaves no row.
    """
    tps = list(tp_sizes) if tp_sizes else suite_tp_sizes(world, full)
    bad = [t for t in tps if t < 1 or world % t]
    if bad:
        raise ValueError(f"TP sizes {bad} do not divide the world size {world}")
    unknown = sorted(set(dtypes) - set(DTYPES)) + sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise ValueError(f"unknown dtypes or ops {unknown}; dtypes: {DTYPES}, ops: {OPS}")
    rows = []
    for tp in tps:
        if full:
            for m in SUITE_TOKENS:
                for name in LLAMA_SHAPES:
                    rows += [{**llama_shape(name, m, tp), "dtype": d} for d in DTYPES]
            for hidden in TE_HIDDEN:
                for op in ("ag_gemm", "gemm_rs"):
                    rows += [{**te_shape(op, hidden, tp), "dtype": d} for d in DTYPES]
            for m in SUITE_TOKENS:
                for name in BULK_LAYERS:
                    for op in BULK_OPS:
                        rows += [{**bulk_shape(op, name, m, tp), "dtype": d} for d in DTYPES]
        else:
            rows += [
                {**suite_shape(op, name, SUITE_TOKENS[0], tp), "dtype": d} for op, name, d in QUICK
            ]
    if ops:
        rows = [r for r in rows if r["op"] in ops]
    known = {r["shape"] for r in rows}
    if shapes:
        missing = sorted(set(shapes) - known)
        if missing:
            raise ValueError(f"unknown shapes {missing} in this suite; shapes: {sorted(known)}")
        rows = [r for r in rows if r["shape"] in shapes]
    rows = [r for r in rows if r["dtype"] in dtypes]
    if not rows:
        raise ValueError("the selection (--shapes / --dtypes / --tp) leaves no row")
    return rows if cuda else [host_scaled(r) for r in rows]


def host_scaled(row: dict[str, Any]) -> dict[str, Any]:
    """The row's tiny twin for the host transport (a float64 reference GEMM on the CPU):
    M / 256 (rounded up to a multiple of tp), K and N / 128 (rounded up to multiples of 16,
    as FP8 GEMMs need)."""

    def up(v: int, to: int) -> int:
        return max(to, -(-v // to) * to)

    return {
        **row,
        "M": up(row["M"] // HOST_M_DIV, row["tp"]),
        "K": up(row["K"] // HOST_KN_DIV, HOST_ALIGN),
        "N": up(row["N"] // HOST_KN_DIV, HOST_ALIGN),
    }


def _te_key(row: Mapping[str, Any], cuda: bool) -> TeKey | None:
    """The TE reference key of a row that matches it: a GPU row at TE's TP size and M of the
    TE shapes (K = N = hidden); None for every other row."""
    if not cuda or row["tp"] != TE_TP or row["M"] != TE_TOKENS or row["K"] != row["N"]:
        return None
    if row["shape"] != f"te{row['K']}":
        return None
    key = (row["op"], row["K"], row["dtype"])
    return key if key in TE_BEST_4XH200 else None


def te_reference(row: Mapping[str, Any], cuda: bool) -> tuple[float, str] | None:
    """(TE best ms measured on 4xH200, its method) for a row that matches TE's run: a GPU row
    at TP = 4, M = 8192 of the TE shapes (K = N = hidden), same dtype."""
    key = _te_key(row, cuda)
    return TE_BEST_4XH200[key] if key else None


def te_floor_reference(row: Mapping[str, Any], cuda: bool) -> float | None:
    """TE's floor, max(T_gemm, T_comm) of TE's own run, for the rows that have a
    :func:`te_reference`; None for the others."""
    key = _te_key(row, cuda)
    return max(TE_FLOOR_4XH200[key]) if key else None

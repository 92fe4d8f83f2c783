"""The overlap ops benchmark's suites (:mod:`benchmarks.overlap_ops`): which rows run, with
which shapes, the rows left out and why, the peer reference data shown beside them, and an
estimate of a run's GPU time.

* ``quick`` and ``full`` (:func:`select_suite`): op x shape x M x TP size x dtype, from the
  Llama-3-70B-like layers of docs/design.md §6 (hidden 8192, FFN 28672, GQA QKV 10240),
  TransformerEngine's shapes (K = N = hidden) and the bulk rows (NOTE [bulk rows] in
  benchmarks/overlap_ops.py).
* ``broad``: the four GEMMs of a layer (qkv and fc1 AG+GEMM, proj and fc2 GEMM+RS) of several
  public model families, read from ``benchmarks/data/model_families.json`` (the source of
  every family's dimensions is written there): hidden 2048-16384, GQA and MHA, gated (SwiGLU)
  and plain (GELU) MLPs, M 1024-32768, TP 2 and 4, bf16 and FP8 (NOTE [broad suite]).
* On the host transport, every suite's tiny twins (:func:`host_scaled`).
* The peer reference: TransformerEngine's times measured on 4xH200, read from
  ``benchmarks/data/te_reference.json`` (where each figure comes from is written there), for
  the GPU rows that match what TE measured (:func:`te_reference`, :func:`te_floor_reference`).
* What a selection will take on GPUs: :mod:`benchmarks.overlap_estimate` (``--list``).

NOTE [broad suite]: the Llama-3-70B rows are one shape family; the ops' fixed costs and plan
choices show on others (issue 30). A broad row is named ``<family>.<layer>`` (its ``shape``;
``family`` and ``layer`` are fields of the row too) with its M, TP size and dtype, and follows
:func:`llama_shape`'s conventions: AG+GEMM rows (qkv, fc1) have K = hidden and the local N
shard (qkv: (q_heads + 2 kv_heads) head_dim / tp; fc1: ffn / tp, twice that for a gated
MLP), GEMM+RS rows the local K shard (proj: q_heads head_dim / tp; fc2: ffn / tp) and
N = hidden. A row whose dimensions do not split over the TP size (heads for qkv and proj,
the FFN for fc1 and fc2, M) or whose K or N is not aligned (multiples of 16 for FP8, whose
GEMMs need K a multiple of 16 and whose backward takes N as its K; of 8 for bf16, rows of 16
bytes) is not run: it is listed with the reason (:class:`SkippedRow`, ``skipped_rows`` in the
JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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
SUITES = ("quick", "full", "broad")
BROAD_LAYERS = ("qkv", "fc1", "proj", "fc2")  # a layer's GEMMs in the order they run
# K and N of a row are multiples of this (NOTE [broad suite]): FP8 GEMMs need K a multiple of
# 16 and the layer's backward takes N as its K; bf16 rows need 16 bytes.
ALIGN = {"bf16": 8, "fp8": 16}

DATA = Path(__file__).resolve().parent / "data"
TE_REFERENCE_FILE = DATA / "te_reference.json"
#: The table columns that name a row (key, header), first in every table of rows.
ROW_COLUMNS = [
    ("op", "op"),
    ("shape", "shape"),
    ("M", "M"),
    ("K", "K"),
    ("N", "N"),
    ("tp", "tp"),
    ("dtype", "dtype"),
]
MODEL_FAMILIES_FILE = DATA / "model_families.json"

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
    """Quick: the world size. Full (and broad): 2 and 4 where they divide the world size, and
    the world."""
    if not full:
        return [world]
    return sorted({t for t in SUITE_TP if t <= world and world % t == 0} | {world})


@dataclass(frozen=True)
class ModelFamily:
    """One layer's dimensions of a public model (``benchmarks/data/model_families.json``).

    Attributes:
        name: the family's name in row names (``<name>.<layer>``) and ``--families``.
        source: where the dimensions come from (the model's config or paper).
        hidden: the model width.
        ffn: the MLP width (fc1's output per gate, fc2's input).
        q_heads: the attention (query) heads.
        kv_heads: the key/value heads (``q_heads`` for MHA, fewer for GQA).
        head_dim: the width of one head.
        gated: a gated MLP (SwiGLU: fc1's N is 2 ffn), else a plain one (GELU: ffn).
        activation: the published activation, for the record.
        tokens: the M of the family's rows.
    """

    name: str
    source: str
    hidden: int
    ffn: int
    q_heads: int
    kv_heads: int
    head_dim: int
    gated: bool
    activation: str
    tokens: tuple[int, ...]

    def gemm(self, layer: str) -> tuple[str, int, int, int]:
        """(op, K, N before the TP split, the dimension the TP size splits) of ``layer``: the
        AG+GEMMs split N, the GEMM+RSs K (:func:`llama_shape`'s conventions); a gated fc1
        splits its gate and its up projection alike, so the FFN is what must divide."""
        qkv = (self.q_heads + 2 * self.kv_heads) * self.head_dim
        attn = self.q_heads * self.head_dim
        fc1 = (2 if self.gated else 1) * self.ffn
        return {
            "qkv": ("ag_gemm", self.hidden, qkv, qkv),
            "fc1": ("ag_gemm", self.hidden, fc1, self.ffn),
            "proj": ("gemm_rs", attn, self.hidden, attn),
            "fc2": ("gemm_rs", self.ffn, self.hidden, self.ffn),
        }[layer]


def load_model_families(path: Path = MODEL_FAMILIES_FILE) -> tuple[ModelFamily, ...]:
    """Reads and checks the model families file (its format: the file itself).

    Raises:
        ValueError: a missing or malformed field, a dimension that is not a positive integer,
            heads that do not make up a GQA or MHA layer, an MLP that is neither gated nor
            plain, tokens that are not ascending, or a name given twice (the message names
            the file).
    """
    try:
        families = []
        for f in json.loads(Path(path).read_text())["families"]:
            dims = [f[k] for k in ("hidden", "ffn", "q_heads", "kv_heads", "head_dim")]
            tokens = tuple(f["tokens"])
            if not all(type(v) is int and v > 0 for v in (*dims, *tokens)) or not tokens:
                raise ValueError(f"dimensions and tokens must be positive integers: {f}")
            if f["q_heads"] % f["kv_heads"] or f["mlp"] not in ("gated", "plain"):
                raise ValueError(f"kv_heads must divide q_heads, mlp be gated or plain: {f}")
            if list(tokens) != sorted(set(tokens)):
                raise ValueError(f"tokens must be ascending, each once: {f}")
            if any(f["name"] == g.name for g in families):
                raise ValueError(f"family {f['name']!r} given twice")
            families.append(
                ModelFamily(
                    str(f["name"]),
                    str(f["source"]),
                    *dims,
                    gated=f["mlp"] == "gated",
                    activation=str(f["activation"]),
                    tokens=tokens,
                )
            )
        if not families:
            raise ValueError("no family")
        return tuple(families)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a valid model families file ({exc!r})") from exc


FAMILIES = load_model_families()


@dataclass(frozen=True)
class SkippedRow:
    """A row of the suite that does not run, and why (NOTE [broad suite])."""

    op: str
    shape: str
    M: int
    tp: int
    dtype: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "shape": self.shape,
            "M": self.M,
            "tp": self.tp,
            "dtype": self.dtype,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Suite:
    """A selection of a suite: the rows to run (grouped by TP size) and the rows left out.

    Attributes:
        name: quick, full or broad.
        rows: dicts of op, shape, M, K, N, tp, dtype (broad rows: family and layer as well).
        skipped: the rows of the selection whose dimensions do not fit its TP size or dtype.
    """

    name: str
    rows: tuple[dict[str, Any], ...]
    skipped: tuple[SkippedRow, ...] = ()


def skipped_lines(skipped: Iterable[SkippedRow | Mapping[str, Any]], shown: int = 3) -> list[str]:
    """One line per reason why rows were left out (as :class:`SkippedRow` s or their
    :meth:`~SkippedRow.as_dict`), with their count and the first ``shown`` of them."""
    reasons: dict[str, list[str]] = {}
    for s in skipped:
        d = s.as_dict() if isinstance(s, SkippedRow) else s
        name = f"{d['op']} {d['shape']} M={d['M']} tp={d['tp']} {d['dtype']}"
        reasons.setdefault(d["reason"], []).append(name)
    return [
        f"left out, {reason}: {len(names)} rows ({', '.join(names[:shown])}"
        + (", ...)" if len(names) > shown else ")")
        for reason, names in reasons.items()
    ]


def broad_rows(
    tp: int, families: Iterable[ModelFamily] = FAMILIES
) -> tuple[list[dict[str, Any]], list[SkippedRow]]:
    """The broad suite's rows at TP size ``tp`` (NOTE [broad suite]): every family x its
    tokens x :data:`BROAD_LAYERS` x :data:`DTYPES`, and the rows that cannot run, with why."""
    rows, skipped = [], []
    for fam in families:
        for m in fam.tokens:
            for layer in BROAD_LAYERS:
                op, k, n, split = fam.gemm(layer)
                k, n = (k, n // tp) if op == "ag_gemm" else (k // tp, n)
                for dtype in DTYPES:
                    row = {"op": op, "shape": f"{fam.name}.{layer}", "M": m, "K": k, "N": n}
                    row |= {"tp": tp, "dtype": dtype, "family": fam.name, "layer": layer}
                    why = _broad_skip_reason(fam, row, split)
                    if why:
                        skipped.append(SkippedRow(op, row["shape"], m, tp, dtype, why))
                    else:
                        rows.append(row)
    return rows, skipped


def _broad_skip_reason(fam: ModelFamily, row: Mapping[str, Any], split: int) -> str | None:
    """Why a broad row cannot run (None: it can): the heads (qkv, proj), the dimension its TP
    split cuts (``split``) or M do not divide by the TP size, or its K or N is not aligned
    for its dtype."""
    tp, m, k, n, dtype = row["tp"], row["M"], row["K"], row["N"], row["dtype"]
    if row["layer"] in ("qkv", "proj") and (fam.q_heads % tp or fam.kv_heads % tp):
        return f"{fam.q_heads} q heads / {fam.kv_heads} KV heads do not split over TP {tp}"
    if split % tp or m % tp:
        what = "the FFN" if row["layer"] in ("fc1", "fc2") else "the heads' width"
        return f"{what} ({split}) or M ({m}) does not split over TP {tp}"
    if k % ALIGN[dtype] or n % ALIGN[dtype]:
        return f"K = {k} or N = {n} is not a multiple of {ALIGN[dtype]} ({dtype} alignment)"
    return None


def _check_choice(what: str, given: Iterable[Any], known: Iterable[Any]) -> None:
    """Raises ValueError naming the values of ``given`` not in ``known``, and the known ones."""
    known = list(dict.fromkeys(known))
    unknown = sorted(set(given) - set(known), key=str)
    if unknown:
        raise ValueError(f"unknown {what} {unknown} in this suite; {what}: {known}")


def select_suite(
    world: int,
    *,
    suite: str | None = None,
    full: bool = False,
    cuda: bool,
    tp_sizes: Sequence[int] | None = None,
    shapes: Sequence[str] | None = None,
    dtypes: Sequence[str] = DTYPES,
    ops: Sequence[str] | None = None,
    families: Sequence[str] | None = None,
    tokens: Sequence[int] | None = None,
) -> Suite:
    """The rows to run, grouped by TP size, and the rows left out (:class:`Suite`).

    Args:
        world: the number of ranks.
        suite: quick (default), full or broad (NOTE [broad suite]).
        full: the full suite (``--full``: the same as ``suite="full"``).
        cuda: real shapes (else scaled down for the host transport, see :func:`host_scaled`).
        tp_sizes: TP sizes to run (default :func:`suite_tp_sizes`); each must divide ``world``.
        shapes: keep only these shape names (fc1, qkv, fc2, proj, te8192, te4096; broad:
            ``<family>.<layer>`` or a layer name, which keeps that layer of every family).
        dtypes: keep only these dtypes (bf16, fp8).
        ops: keep only these ops (ag_gemm, gemm_rs, bulk_ag, bulk_rs; default all).
        families: broad only: keep only these families (:data:`FAMILIES`).
        tokens: keep only the rows of these M (before the host transport's scaling).

    Raises:
        ValueError: an unknown suite, ``full`` with another suite, a TP size that does not
            divide ``world``, an unknown dtype, op, shape, family or token count, families
            outside the broad suite, or a selection that leaves no row.
    """
    name = suite or ("full" if full else "quick")
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; suites: {SUITES}")
    if full and name != "full":
        raise ValueError(f"--full is the full suite: it does not go with the {name} suite")
    if families and name != "broad":
        raise ValueError("--families selects model families of the broad suite (--suite broad)")
    tps = list(tp_sizes) if tp_sizes else suite_tp_sizes(world, name != "quick")
    bad = [t for t in tps if t < 1 or world % t]
    if bad:
        raise ValueError(f"TP sizes {bad} do not divide the world size {world}")
    unknown = sorted(set(dtypes) - set(DTYPES)) + sorted(set(ops or ()) - set(OPS))
    if unknown:
        raise ValueError(f"unknown dtypes or ops {unknown}; dtypes: {DTYPES}, ops: {OPS}")
    _check_choice("families", families or (), (f.name for f in FAMILIES))
    chosen = [f for f in FAMILIES if not families or f.name in families]
    rows: list[dict[str, Any]] = []
    skipped: list[SkippedRow] = []
    for tp in tps:
        if name == "broad":
            more, left_out = broad_rows(tp, chosen)
            rows += more
            skipped += left_out
        elif name == "full":
            rows += _full_rows(tp)
        else:
            rows += [
                {**suite_shape(op, shape, SUITE_TOKENS[0], tp), "dtype": d}
                for op, shape, d in QUICK
            ]

    def keep(r: Mapping[str, Any]) -> bool:
        return (
            (not ops or r["op"] in ops)
            and (not shapes or r["shape"] in shapes or r.get("layer") in shapes)
            and (not tokens or r["M"] in tokens)
            and r["dtype"] in dtypes
        )

    kept = [r for r in rows if not ops or r["op"] in ops]
    every = [*kept, *(s.as_dict() for s in skipped if not ops or s.op in ops)]
    layers = [s.rsplit(".", 1)[1] for s in (r["shape"] for r in every) if "." in s]
    _check_choice("shapes", shapes or (), [*(r["shape"] for r in every), *layers])
    _check_choice("tokens", tokens or (), sorted({r["M"] for r in every}))
    rows = [r for r in rows if keep(r)]
    skipped = [s for s in skipped if keep({**s.as_dict(), "layer": s.shape.rsplit(".", 1)[-1]})]
    if not rows:
        raise ValueError(
            "the selection (--shapes / --dtypes / --tp / --ops / --families / --tokens) "
            f"leaves no row{f' ({len(skipped)} left out: see --list)' if skipped else ''}"
        )
    return Suite(name, tuple(r if cuda else host_scaled(r) for r in rows), tuple(skipped))


def build_suite(world: int, **kwargs: Any) -> list[dict[str, Any]]:
    """The rows of :func:`select_suite` (same arguments), without the rows left out."""
    return list(select_suite(world, **kwargs).rows)


def _full_rows(tp: int) -> list[dict[str, Any]]:
    """The full suite's rows at TP size ``tp``: the docs/design.md §6 layers at both M, TE's
    shapes, the bulk rows; every one in both dtypes."""
    rows = []
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
    return rows


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

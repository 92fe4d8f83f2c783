"""How much accuracy a GEMM+RS loses if its partial sums travel in FP8 (issue 30, item 4).

A communication-bound GEMM + reduce-scatter moves ``(tp - 1) / tp`` of an ``[M, N]`` tensor
of partial sums per rank. Sending them in FP8 instead of BF16 would halve those bytes, which is
the one lever on a comm-bound row that no schedule has. What it costs is accuracy. This study
measures that cost without a GPU, because the numerics do not depend on the device. It uses
the library's own quantizers (their CPU references are bit-exact with the GPU kernels,
tests/unit/test_quantizers.py).

NOTE [fp8 on the wire]: each rank's partial ``P_r = A_r @ W_r.T`` (float32 as the GEMM
accumulates it) is cast to the wire format, every owner dequantizes the ``tp`` slices of its
rows and sums them in float32 (as the reduce kernels do), and the sum is rounded to BF16, the
output dtype. The reference is the float64 sum. Wire formats:

* ``bf16``: today's wire (the partials rounded to BF16);
* ``e4m3 tensor``, ``e5m2 tensor``: one current-scaling scale per partial;
* ``e4m3 1x128``: one scale per 128 elements of a row (:class:`BlockScalingQuantizer`);
* ``mxfp8 1x32``: MXFP8, a power-of-two E8M0 scale per 32 elements.

Each is measured after a BF16 GEMM and (BF16, E4M3 tensor and 1x128 wires) after an FP8 GEMM
whose inputs are per-tensor E4M3, as an FP8 recipe's are: an FP8 GEMM's output already carries
its inputs' rounding, so what matters there is how much the wire adds to it.

Inputs are a layer's two GEMM+RS GEMMs (Llama-3-70B: proj K = 8192, fc2 K = 28672, N =
8192) at TP 2, 4 and 8, with ``--m`` rows (the statistics are per element, so a few hundred
rows do). Activations come in two kinds. ``gaussian`` is N(0, 1). ``outliers`` is the same
with 1% of the K channels 20x larger, as the activations of large language models have
(LLM.int8, Dettmers et al. 2022). Weights are N(0, 1 / K). Reported, against the float64 sum of
the unquantized GEMM: the relative RMS error ``||out - ref|| / ||ref||``, its ratio to the
same GEMM with a BF16 wire, and the largest error over ``max |ref|``; ``bf16 out`` is the
float64 sum rounded to BF16, the least any wire can do.

    python -m benchmarks.rs_wire_precision --out DIR      # a few seconds on a CPU

Measured: docs/performance-log.md [fp8 on the wire].
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HIDDEN = 8192
LAYERS = {"proj": 8192, "fc2": 28672}  # K of the whole GEMM (Llama-3-70B); N = HIDDEN
TP_SIZES = (2, 4, 8)
INPUTS = ("gaussian", "outliers")
WIRES = ("bf16", "e4m3 tensor", "e5m2 tensor", "e4m3 1x128", "mxfp8 1x32")


def wire_cast(name: str) -> Callable[[Any], Any]:
    """``x`` (float32 ``[M, N]``) through wire format ``name`` and back to float32."""
    import torch

    from overlap.quantization import (
        BlockScalingConfig,
        BlockScalingQuantizer,
        CurrentScalingConfig,
        CurrentScalingQuantizer,
        Fp8Format,
        MXFP8Config,
        MXFP8Quantizer,
    )

    if name == "bf16":
        return lambda x: x.to(torch.bfloat16).float()
    quantizer = {
        "e4m3 tensor": lambda: CurrentScalingQuantizer(CurrentScalingConfig(fp8=Fp8Format.E4M3)),
        "e5m2 tensor": lambda: CurrentScalingQuantizer(CurrentScalingConfig(fp8=Fp8Format.E5M2)),
        "e4m3 1x128": lambda: BlockScalingQuantizer(BlockScalingConfig()),
        "mxfp8 1x32": lambda: MXFP8Quantizer(MXFP8Config()),
    }[name]()

    def cast(x: Any) -> Any:
        q = quantizer.quantize(x, rowwise=True, columnwise=False)
        return q.dequantize(dtype=torch.float32)

    return cast


def activations(kind: str, m: int, k: int, gen: Any) -> Any:
    """``[m, k]`` float32 activations of ``kind`` (:data:`INPUTS`), BF16-representable."""
    import torch

    a = torch.randn(m, k, generator=gen)
    if kind == "outliers":
        channels = torch.randperm(k, generator=gen)[: max(1, k // 100)]
        a[:, channels] *= 20.0
    return a.bfloat16().float()


def study_row(layer: str, tp: int, kind: str, m: int, seed: int = 0) -> list[dict[str, Any]]:
    """One (layer, TP size, input kind): a result per GEMM precision and wire format (and
    ``bf16 out``), each against the float64 sum of the unquantized GEMM, with
    ``vs_bf16_wire``: its error over that of the same GEMM with a BF16 wire."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    k = LAYERS[layer]
    a = activations(kind, m, k, gen)
    w = (torch.randn(HIDDEN, k, generator=gen) / k**0.5).bfloat16().float()
    shard = k // tp
    fp8_input = wire_cast("e4m3 tensor")  # an FP8 recipe's per-tensor E4M3 GEMM inputs
    row = {"layer": layer, "tp": tp, "input": kind}
    cut = [
        (a[:, r * shard : (r + 1) * shard], w[:, r * shard : (r + 1) * shard]) for r in range(tp)
    ]
    ref = torch.stack([(x @ y.T).double() for x, y in cut]).sum(0)  # the unquantized GEMM
    out = [{**row, "gemm": "-", "wire": "bf16 out", **_errors(ref.bfloat16(), ref)}]
    for gemm in ("bf16", "fp8"):
        # NOTE [fp8 on the wire]: rank r's partial sums over its K shard, as its GEMM leaves
        # them (an FP8 GEMM: each rank's own shards of A and W, each with its own scale)
        pairs = cut if gemm == "bf16" else [(fp8_input(x), fp8_input(y)) for x, y in cut]
        partials = [x @ y.T for x, y in pairs]
        base = None
        for name in WIRES if gemm == "bf16" else ("bf16", "e4m3 tensor", "e4m3 1x128"):
            cast = wire_cast(name)
            total = torch.zeros_like(partials[0])
            for p in partials:  # every owner's rows alike: the whole [M, N] at once
                total += cast(p)
            got = {**row, "gemm": gemm, "wire": name, **_errors(total.bfloat16(), ref)}
            base = base or got["rel_rms"]  # the BF16 wire comes first
            got["vs_bf16_wire"] = got["rel_rms"] / base
            out.append(got)
    return out


def _errors(got: Any, ref: Any) -> dict[str, float]:
    diff = got.double() - ref
    return {
        "rel_rms": float(diff.norm() / ref.norm()),
        "max_rel": float(diff.abs().max() / ref.abs().max()),
    }


def run(
    m: int, layers: Sequence[str], tps: Sequence[int], inputs: Sequence[str]
) -> list[dict[str, Any]]:
    """Every row of the study (:func:`study_row` of each layer, TP size and input kind)."""
    return [r for x in layers for tp in tps for kind in inputs for r in study_row(x, tp, kind, m)]


COLUMNS = [
    ("layer", "layer"),
    ("tp", "tp"),
    ("input", "input"),
    ("gemm", "GEMM inputs"),
    ("wire", "wire"),
    ("rel_rms", "rel RMS"),
    ("vs_bf16_wire", "vs bf16 wire"),
    ("max_rel", "max / max|ref|"),
]


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.common import format_table, write_json

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rs_wire_precision", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=None, help="write rs_wire_precision.json here")
    parser.add_argument("--m", type=int, default=256, help="rows of the partial sums")
    parser.add_argument("--layers", default=",".join(LAYERS), help="proj,fc2")
    parser.add_argument("--tp", default=",".join(map(str, TP_SIZES)), help="TP sizes")
    parser.add_argument("--inputs", default=",".join(INPUTS), help="gaussian,outliers")
    args = parser.parse_args(argv)
    layers = args.layers.split(",")
    unknown = [x for x in layers if x not in LAYERS]
    if unknown or args.m < 1:
        parser.error(
            f"--layers takes {sorted(LAYERS)} and --m >= 1 (got {args.layers!r}, {args.m})"
        )
    tps = [int(t) for t in args.tp.split(",")]
    if any(LAYERS[x] % t for x in layers for t in tps):
        parser.error(f"every TP size must divide every layer's K ({LAYERS})")
    inputs = args.inputs.split(",")
    if any(i not in INPUTS for i in inputs):
        parser.error(f"--inputs takes {list(INPUTS)}")
    rows = run(args.m, layers, tps, inputs)
    print(format_table(rows, COLUMNS), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "rs_wire_precision.json", {"m": args.m, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""benchmarks/rs_wire_precision.py (NOTE [fp8 on the wire]): the study's numbers behave as
the formats' precision says they must, on a few rows of one layer."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks import rs_wire_precision as study


def _by(rows: list[dict], gemm: str, wire: str) -> dict:
    return next(r for r in rows if r["gemm"] == gemm and r["wire"] == wire)


@pytest.mark.parametrize("kind", study.INPUTS)
def test_wire_errors_follow_the_formats_precision(kind: str) -> None:
    rows = study.study_row("proj", 4, kind, m=8)
    out = next(r for r in rows if r["wire"] == "bf16 out")
    bf16 = _by(rows, "bf16", "bf16")
    # BF16 partials cost about the output's own BF16 rounding (8 mantissa bits: < 0.5%)
    assert out["rel_rms"] <= bf16["rel_rms"] < 5e-3
    assert bf16["vs_bf16_wire"] == 1.0
    # E4M3 keeps 3 mantissa bits, E5M2 2: an order of magnitude more error, then twice that
    e4m3, e5m2 = _by(rows, "bf16", "e4m3 tensor"), _by(rows, "bf16", "e5m2 tensor")
    assert 5 < e4m3["vs_bf16_wire"] < 20 and e5m2["rel_rms"] > 1.5 * e4m3["rel_rms"]
    for wire in ("e4m3 1x128", "mxfp8 1x32"):
        assert 5 < _by(rows, "bf16", wire)["vs_bf16_wire"] < 20, wire
    # after an FP8 GEMM the wire adds to an error already of the E4M3 inputs' size
    fp8 = _by(rows, "fp8", "bf16")
    assert fp8["rel_rms"] > 5 * bf16["rel_rms"]
    assert 1.0 < _by(rows, "fp8", "e4m3 tensor")["vs_bf16_wire"] < 1.6


def test_the_cli_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        study.main(["--layers", "qkv"])
    assert exc.value.code == 2 and "--layers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        study.main(["--tp", "3"])  # 3 divides neither 8192 nor 28672

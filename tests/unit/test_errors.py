"""C++ errors surface as typed Python exceptions with file:line, expression and values."""

from __future__ import annotations

import pytest

import overlap
from overlap import errors
from overlap._native import native

KINDS = {
    "internal": errors.OverlapError,
    "invalid_argument": errors.InvalidArgumentError,
    "config": errors.ConfigError,
    "state": errors.StateError,
    "timeout": errors.CommTimeoutError,
    "unsupported": errors.UnsupportedHardwareError,
    "cuda": errors.CudaError,
    "bootstrap": errors.BootstrapError,
    "system": errors.SystemResourceError,
    "aborted": errors.CommAbortedError,
}


@pytest.mark.parametrize(("kind", "cls"), KINDS.items(), ids=list(KINDS))
def test_each_error_kind_maps_to_its_class(kind: str, cls: type) -> None:
    with pytest.raises(cls, match=r"boom \d+ \(at common\.cpp:\d+ in ") as info:
        native()._raise_for_test(kind, f"boom {len(kind)}")
    assert type(info.value) is cls
    assert isinstance(info.value, overlap.OverlapError)


def test_check_eq_message_names_expression_and_values() -> None:
    with pytest.raises(overlap.ConfigError) as info:
        native()._check_eq_for_test(3, 4)
    msg = str(info.value)
    assert "expected = 3" in msg and "actual = 4" in msg
    assert "check failed: expected == actual" in msg


def test_unknown_kind_is_an_invalid_argument() -> None:
    with pytest.raises(overlap.InvalidArgumentError, match="unknown error kind 'nope'"):
        native()._raise_for_test("nope", "x")


def test_standard_bases_for_callers_that_do_not_know_overlap() -> None:
    assert issubclass(errors.CommTimeoutError, TimeoutError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.SystemResourceError, OSError)
    assert all(issubclass(c, errors.OverlapError) for c in KINDS.values())

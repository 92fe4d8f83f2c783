"""The OVERLAP_* environment table: parsing, validation, and the README copy."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from overlap import env
from overlap.errors import ConfigError

README = Path(__file__).resolve().parents[2] / "README.md"


def test_defaults_when_unset() -> None:
    s = env.settings({})
    assert s == env.Settings()
    assert s.timeout_s == 60.0 and s.log_level == "WARNING"


def test_values_are_parsed() -> None:
    s = env.settings({"OVERLAP_TIMEOUT_S": "2.5", "OVERLAP_LOG_LEVEL": "debug", "PATH": "/x"})
    assert s.timeout_s == 2.5 and s.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("OVERLAP_TIMEOUT_S", "soon", "not a number"),
        ("OVERLAP_TIMEOUT_S", "0", "must be > 0"),
        ("OVERLAP_TIMEOUT_S", "-3", "must be > 0"),
        ("OVERLAP_LOG_LEVEL", "LOUD", "must be one of"),
        ("OVERLAP_TEST_NP_TIMEOUT_S", "nan", "must be > 0"),
    ],
    ids=["timeout-word", "timeout-zero", "timeout-negative", "log-level", "np-timeout-nan"],
)
def test_bad_values_name_the_variable(name: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        env.settings({name: value})
    assert name in str(info.value)


def test_unknown_variable_warns_and_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="overlap"):
        s = env.settings({"OVERLAP_TIMEOUTS": "5"})
    assert s == env.Settings()
    assert "OVERLAP_TIMEOUTS" in caplog.text and "OVERLAP_TIMEOUT_S" in caplog.text


def test_every_variable_has_the_prefix_and_a_description() -> None:
    for v in env.ENV_VARS:
        assert v.name.startswith(env.PREFIX)
        assert len(v.description) > 20


def test_readme_documents_exactly_the_table() -> None:
    documented = set(re.findall(r"^\| `(OVERLAP_[A-Z0-9_]+)`", README.read_text(), re.M))
    assert documented == {v.name for v in env.ENV_VARS}
    assert env.format_table() in README.read_text()

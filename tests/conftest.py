"""Shared pytest set-up: the ``gpu(n)`` marker skips tests when fewer than n GPUs are visible."""

from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def gpu_count() -> int:
    """CUDA GPUs visible to torch (0 without torch, a CUDA build of it, or a driver)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def in_ci() -> bool:
    """True under CI, where a missing tool is a failure rather than a skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        need = marker.args[0] if marker.args else 1
        if gpu_count() < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} GPU(s), found {gpu_count()}"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        from overlap.info import summary

        return summary().splitlines()
    except Exception as exc:  # the header must never break collection
        return [f"overlap: not importable ({exc})"]

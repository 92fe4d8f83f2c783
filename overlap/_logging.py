"""The package logger. overlap logs through :mod:`logging` under the name ``"overlap"``."""

from __future__ import annotations

import logging

logger = logging.getLogger("overlap")


def get_logger(name: str | None = None) -> logging.Logger:
    """Return the package logger, or a child of it (``overlap.<name>``)."""
    return logger if name is None else logger.getChild(name)

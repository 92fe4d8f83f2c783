"""Package version (single source of truth, read by the build)."""

__version__ = "0.1.0"

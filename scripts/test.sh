#!/usr/bin/env bash
# The test command: all set-up on a fresh Debian machine (as root), then the whole test suite
# (unit, multi-rank under mpirun, lint/format). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec python -m pytest tests -v -rs --durations=10 "$@"

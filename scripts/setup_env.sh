#!/usr/bin/env bash
# Set-up from a fresh Debian machine (run as root), idempotent and quick when already done:
#   1. Debian packages: Python venv/headers, a C++ compiler, OpenMPI (mpirun), clang-format;
#   2. a virtual environment in .venv with scripts/requirements-dev.txt (and, without their
#      dependencies, scripts/requirements-nodeps.txt);
#   3. the editable build of overlap (compiles the CUDA sources when nvcc is on PATH).
# Prints the build summary last. Sourced by scripts/test.sh and scripts/bench.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# nvcc is usually not on root's PATH on a fresh machine; the CUDA toolkit's default place is.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

need_apt=()
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v clang-format >/dev/null 2>&1 || need_apt+=(clang-format)
command -v git >/dev/null 2>&1 || need_apt+=(git)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  >/dev/null 2>&1 || need_apt+=(python3-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"

stamp="$VENV/.overlap-requirements.sha256"
want="$(cat "$ROOT/scripts/requirements-dev.txt" "$ROOT/scripts/requirements-nodeps.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] pip install -r scripts/requirements-dev.txt"
  python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  python -m pip install -q -r "$ROOT/scripts/requirements-dev.txt" 2>&1 | grep -v '^WARNING: Location' || true
  python -m pip install -q --no-deps -r "$ROOT/scripts/requirements-nodeps.txt" 2>&1 | grep -v '^WARNING: Location' || true
  python -c 'import torch, mpi4py, pybind11, scikit_build_core' # fail loudly if anything is missing
  echo "$want" >"$stamp"
fi

echo "[setup] building overlap (pip install --no-build-isolation -e .)"
build_log="$ROOT/build/pip-install.log"
mkdir -p "$ROOT/build"
start=$(date +%s)
if ! python -m pip install --no-build-isolation -v -e "$ROOT" >"$build_log" 2>&1; then
  tail -n 60 "$build_log"
  echo "[setup] build FAILED (full log: $build_log)" >&2
  exit 1
fi
echo "[setup] build took $(( $(date +%s) - start )) s; summary:"
sed -n '/overlap build summary/,/^.*=====*$/p' "$build_log" | sed 's/^.*-- /  /' | tail -n +2 | head -n -1 || true
python -m overlap.info

#!/usr/bin/env bash
# GPU runner for a GPU machine WITHOUT network access (DESIGN.md §7): the image already holds
# CUDA, torch, pybind11, scikit-build-core, cmake, ninja, pytest, mpi4py and OpenMPI.
#
#   scripts/gpu_check.sh LOG_DIR [--bench]
#
# Builds with `pip install --no-build-isolation -e .`, runs the GPU-marked and multi-rank tests
# on all local GPUs, optionally the benchmark, and writes every log into LOG_DIR. Prints a short
# summary table last.
set -uo pipefail
LOG="${1:?usage: scripts/gpu_check.sh LOG_DIR [--bench]}"
BENCH="${2:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$LOG"
cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
declare -a summary

step() {  # step NAME LOGFILE CMD...: run, record status and seconds
  local name="$1" logfile="$2"; shift 2
  local t0=$(date +%s)
  "$@" >"$LOG/$logfile" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s %-5s %5ss  %s' "$name" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$(( $(date +%s) - t0 ))" "$logfile")")
  return $rc
}

{ nvidia-smi; nvidia-smi topo -m; } >"$LOG/nvidia-smi.txt" 2>&1
step build build.log "$PY" -m pip install --no-build-isolation --no-deps -v -e . || {
  tail -n 40 "$LOG/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }
grep -A8 "overlap build summary" "$LOG/build.log" | sed 's/^.*-- /  /'
step info info.txt "$PY" -m overlap.info
cat "$LOG/info.txt"
step tests tests.log "$PY" -m pytest tests -v -rs -p no:cacheprovider --junitxml="$LOG/junit.xml"
tail -n 25 "$LOG/tests.log"
if [ "$BENCH" = "--bench" ]; then
  step bench bench.log "$PY" -m benchmarks.run --out "$LOG"
  tail -n 25 "$LOG/bench.log"
fi
echo
echo "== gpu_check summary =="
printf '%s\n' "${summary[@]}"
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$LOG/tests.log" | tail -n 15

#!/usr/bin/env bash
# GPU runner for a GPU machine WITHOUT network access (docs/design.md §7): the image already holds
# CUDA, torch, pybind11, scikit-build-core, cmake, ninja, pytest, mpi4py and OpenMPI.
#
#   scripts/gpu_check.sh LOG_DIR [STEP...]
#
# STEPs (default: build unit dist bench): build (pip install -e .), unit (single-process tests,
# GPU ones included), dist (multi-rank tests on all local GPUs; dist-cuda and buffers-cuda:
# the cuda transport's collectives and buffer managers), bench (the main job),
# kernels (quantization/reduction kernel bandwidth), gemm (GEMM vs torch), quant-gpu (the
# CUDA quantization kernels' tests), ops-cuda and ops-bench (the overlap ops' multi-rank
# tests and benchmark on all local GPUs; ops-bench-full: the whole docs/design.md §6 suite, give it
# STEP_TIMEOUT_S=900; broad-bench: the broad suite of model families, BROAD_BENCH_ARGS narrows it,
# e.g. "--tp 4 --tokens 1024,16384"; run --list with the same arguments first for its time),
# graphs-cuda (CUDA graphs of comm ops), layers-cuda and layers-bench
# (the tensor-parallel layers' multi-rank tests and benchmark on all local GPUs;
# layer-graphs-cuda: the layers replayed as CUDA graphs against eager; examples-cuda: the GPT
# example on the GPUs, eager and with graphed layers, against one process;
# LAYERS_BENCH_ARGS adds options, e.g. "--full"), transformer-bench (one transformer layer
# against the peers; TRANSFORMER_BENCH_ARGS adds options), soak-cuda (10,000 random ops with
# stalls and a killed rank), abort-cuda (abort() ends a GPU wait), sanitizer
# (compute-sanitizer memcheck and racecheck over every op kind), setup-cuda (set-up
# deadlines). Every step writes its log into LOG_DIR and has a time limit (STEP_TIMEOUT_S,
# default 300 s); a short summary table is printed last.
set -uo pipefail
LOG="${1:?usage: scripts/gpu_check.sh LOG_DIR [STEP...]}"
shift
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build unit dist bench)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$LOG"
cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
LIMIT="${STEP_TIMEOUT_S:-300}"
# PYTEST_ARGS adds options (e.g. "-x -k np2"); SIGINT at the limit makes pytest print its
# summary of what failed so far before it stops.
read -r -a EXTRA <<<"${PYTEST_ARGS:-}"
PYTEST=("$PY" -m pytest -q -rfE -p no:cacheprovider --durations=5 "${EXTRA[@]}")
declare -a summary

step() {  # step NAME LOGFILE CMD...: run with a time limit, record status and seconds
  local name="$1" logfile="$2"; shift 2
  local t0=$(date +%s)
  timeout -s INT -k 20 "$LIMIT" "$@" >"$LOG/$logfile" 2>&1
  local rc=$?
  local status=ok
  [ $rc -ne 0 ] && status=FAIL
  [ $rc -eq 124 ] || [ $rc -eq 130 ] && status=TIMEOUT
  summary+=("$(printf '%-8s %-7s %5ss  %s' "$name" "$status" "$(( $(date +%s) - t0 ))" "$logfile")")
  tail -n 12 "$LOG/$logfile"
  return $rc
}

{ nvidia-smi; nvidia-smi topo -m; } >"$LOG/nvidia-smi.txt" 2>&1
for s in "${STEPS[@]}"; do
  case "$s" in
    build)
      step build build.log "$PY" -m pip install --no-build-isolation --no-deps -v -e . || {
        printf '%s\n' "${summary[@]}"; exit 1; }
      "$PY" -m overlap.info >>"$LOG/build.log" 2>&1 ;;
    unit) step unit unit.log "${PYTEST[@]}" tests/unit ;;
    dist) step dist dist.log "${PYTEST[@]}" tests/distributed ;;
    dist-cuda) step dist dist.log "${PYTEST[@]}" tests/distributed/test_collectives.py -k cuda ;;
    buffers-cuda) step buffers buffers.log "${PYTEST[@]}" tests/distributed/test_buffers.py -k cuda ;;
    ops-cuda) step ops ops.log "${PYTEST[@]}" tests/distributed/test_overlap_ops.py -k cuda ;;
    layers-cuda) step layers layers.log "${PYTEST[@]}" tests/distributed/test_layers.py -k cuda ;;
    layer-graphs-cuda) step lgraphs layergraphs.log "${PYTEST[@]}" tests/distributed/test_layer_graphs.py ;;
    examples-cuda) step examples examples.log "${PYTEST[@]}" tests/distributed/test_examples.py -k on_gpus ;;
    transformer-bench)
      step transf transformerbench.log "$PY" -m benchmarks.transformer --launch \
        "$(nvidia-smi -L | wc -l)" --cuda --out "$LOG" ${TRANSFORMER_BENCH_ARGS:-} ;;
    layers-bench)
      step layersb layersbench.log "$PY" -m benchmarks.layers --launch "$(nvidia-smi -L | wc -l)" \
        --cuda --out "$LOG" ${LAYERS_BENCH_ARGS:-} ;;
    graphs-cuda) step graphs graphs.log "${PYTEST[@]}" tests/distributed/test_graphs.py ;;
    soak-cuda) step soak soak.log "${PYTEST[@]}" -s tests/distributed/test_soak.py -k cuda_soak ;;
    abort-cuda) step abort abort.log "${PYTEST[@]}" -s tests/distributed/test_abort_cuda.py ;;
    sanitizer) step sanit sanitizer.log "${PYTEST[@]}" tests/distributed/test_soak.py -k sanitizer ;;
    setup-cuda) step setup setup.log "${PYTEST[@]}" tests/distributed/test_setup_deadlines.py ;;
    quant-gpu) step quant quant.log "${PYTEST[@]}" tests/unit/test_quantize_gpu.py tests/unit/test_overlap_ops.py ;;
    ops-bench)
      step opsbench opsbench.log "$PY" -m benchmarks.overlap_ops --launch "$(nvidia-smi -L | wc -l)" \
        --cuda --out "$LOG" ;;
    broad-bench)
      step broad broadbench.log "$PY" -m benchmarks.overlap_ops --launch "$(nvidia-smi -L | wc -l)" \
        --cuda --suite broad --out "$LOG/broad" ${BROAD_BENCH_ARGS:-} ;;
    ops-bench-full)
      step opsbench opsbench.log "$PY" -m benchmarks.overlap_ops --launch "$(nvidia-smi -L | wc -l)" \
        --cuda --full --out "$LOG" ;;
    bench) step bench bench.log "$PY" -m benchmarks.run --out "$LOG" ;;
    kernels) step kernels kernels.log "$PY" -m benchmarks.kernels --json "$LOG/kernels.json" ;;
    gemm) step gemm gemm.log "$PY" -m benchmarks.gemm --json "$LOG/gemm.json" ;;
    *) echo "unknown step '$s'"; exit 2 ;;
  esac
done
echo
echo "== gpu_check summary =="
printf '%s\n' "${summary[@]}"
for f in unit dist buffers quant ops graphs layers layergraphs examples soak sanitizer setup abort; do
  [ -f "$LOG/$f.log" ] && grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$LOG/$f.log" | tail -n 12
done
exit 0

#!/usr/bin/env bash
# The main job: all set-up on a fresh Debian machine (as root), then the overlap benchmark on
# all local GPUs, or on the host transport with 4 ranks when there are none. Extra arguments
# go to `python -m benchmarks.run` (--help lists them; --full runs the whole suite).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$ROOT"
exec python -m benchmarks.run "$@"

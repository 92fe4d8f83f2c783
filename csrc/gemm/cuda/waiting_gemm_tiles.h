// The waiting GEMM's kernel instantiations (NOTE [waiting gemm tiles] in waiting_gemm.cu), one
// translation unit each (waiting_gemm_tiles_*.cu) so that a parallel build compiles them side
// by side. Torch- and CUTLASS-free: waiting_gemm.cu picks among them without seeing CUTLASS.
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/gemm.h"

namespace overlap::gemm {

// One launch: `count` groups (at most kWaitingMaxGroups), their arguments staged into memory
// from `pool` on `stream`.
struct WaitingLaunch {
  const WaitingGemmGroup* groups = nullptr;
  int count = 0;
  float alpha = 1.0f;
  int device = 0;
  int sm_count = 0;
  int swizzle = 8;  // the tile scheduler's swath (1, 2, 4 or 8 tiles; NOTE [waiting gemm tiles])
  cudaMemPool_t pool = nullptr;
  cudaStream_t stream = nullptr;
};
constexpr int kWaitingMaxGroups = 32;

// Each enqueues the waiting kernel of one tile shape (throws kInternal if CUTLASS refuses).
void launch_waiting_pp64x128(const WaitingLaunch& l);
void launch_waiting_co128x128(const WaitingLaunch& l);
void launch_waiting_co256x128(const WaitingLaunch& l);
void launch_waiting_co128x256(const WaitingLaunch& l);
void launch_waiting_co128x256_c2(const WaitingLaunch& l);

}  // namespace overlap::gemm

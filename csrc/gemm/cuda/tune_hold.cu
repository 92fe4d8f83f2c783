// The hold kernel of GEMM autotuning (NOTE [gemm autotune] in gemm/cuda/autotune.h): one
// thread that sleeps until the global timer has advanced by the requested time, so that the
// host can enqueue the timed runs before the first of them starts.
#include "common/cuda/cuda_check.h"
#include "gemm/cuda/autotune.h"

namespace overlap::gemm {

namespace {

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hold_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) __nanosleep(2000);
}

}  // namespace

void hold_stream(cudaStream_t stream, std::uint64_t ns) {
  hold_kernel<<<1, 1, 0, stream>>>(ns);
  OVERLAP_CHECK_LAUNCH("hold_kernel (gemm autotune)");
}

}  // namespace overlap::gemm

// Handshake kernel (handshake.h, NOTE [handshakes] in comm/transport.h): one block, one thread
// per flag or word. Waits spin on acquire loads with no timeout of their own: the cuda
// transport's watchdog releases them by storing the awaited value (NOTE [watchdog]).
#include <cstdint>

#include "common/cuda/cuda_check.h"
#include "kernels/handshake.h"

namespace overlap::kernels {

namespace {

constexpr int kThreads =
    kMaxHandshakeFlags > kMaxHandshakeWords ? kMaxHandshakeFlags : kMaxHandshakeWords;

__device__ __forceinline__ void store_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ std::uint64_t load_acquire_sys(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ std::uint32_t load_relaxed_sys(const std::uint32_t* p) {
  std::uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(kThreads) handshake_kernel(const HandshakeParams p) {
  const int t = threadIdx.x;
  if (t < p.num_before) p.before[t].dst[0] = load_relaxed_sys(p.before[t].src);
  // Every earlier write of the stream (copy engines included: they finished before this
  // kernel started) and the words above, before any signal.
  __syncthreads();
  if (t < p.num_signals) {
    __threadfence_system();
    store_release_sys(p.signals[t], p.value);
  }
  if (t < p.num_waits) {
    while (load_acquire_sys(p.waits[t]) < p.wait_values[t]) {
    }
  }
  __syncthreads();
  if (t < p.num_after) {
    __threadfence_system();
    p.after[t].dst[0] = load_relaxed_sys(p.after[t].src);
  }
}

}  // namespace

void handshake_cuda(const HandshakeParams& p, cudaStream_t stream) {
  OVERLAP_CHECK(p.num_before >= 0 && p.num_before <= kMaxHandshakeWords && p.num_after >= 0 &&
                    p.num_after <= kMaxHandshakeWords && p.num_signals >= 0 &&
                    p.num_signals <= kMaxHandshakeFlags && p.num_waits >= 0 &&
                    p.num_waits <= kMaxHandshakeFlags,
                kInvalidArgument,
                "handshake: at most " << kMaxHandshakeFlags << " signals and waits and "
                                      << kMaxHandshakeWords << " words before and after (got "
                                      << p.num_before << " words before, " << p.num_signals
                                      << " signals, " << p.num_waits << " waits, " << p.num_after
                                      << " words after)");
  handshake_kernel<<<1, kThreads, 0, stream>>>(p);
  OVERLAP_CHECK_LAUNCH("handshake_kernel");
}

}  // namespace overlap::kernels

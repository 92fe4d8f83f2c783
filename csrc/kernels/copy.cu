// SM copy (NOTE [sm puts] in copy.h): grid-stride, 16-byte vectors, several in flight per
// thread so that a few blocks keep NVLink busy.
#include <cstdint>

#include "common/cuda/cuda_check.h"
#include "kernels/copy.h"

namespace overlap::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread

__global__ void __launch_bounds__(kThreads)
    copy_vec16(uint4* __restrict__ dst, const uint4* __restrict__ src, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__global__ void __launch_bounds__(kThreads)
    copy_bytes(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src,
               std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    dst[i] = src[i];
  }
}

unsigned blocks_for(std::size_t work, int blocks) {
  const std::size_t needed = (work + kThreads - 1) / kThreads;
  const std::size_t b = needed < static_cast<std::size_t>(blocks) ? needed : blocks;
  return b > 0 ? static_cast<unsigned>(b) : 1u;
}

}  // namespace

void copy_cuda(void* dst, const void* src, std::size_t bytes, int blocks, cudaStream_t stream) {
  OVERLAP_CHECK(blocks >= 1, kInvalidArgument, "copy_cuda needs >= 1 block, got " << blocks);
  if (bytes == 0 || dst == src) return;
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  if (d % 16 == 0 && s % 16 == 0) {
    const std::size_t n = bytes / 16;
    if (n > 0) {
      copy_vec16<<<blocks_for(n, blocks), kThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                                                 static_cast<const uint4*>(src), n);
      OVERLAP_CHECK_LAUNCH("copy_vec16");
    }
    const std::size_t tail = bytes % 16;
    if (tail == 0) return;
    dst = static_cast<char*>(dst) + n * 16;
    src = static_cast<const char*>(src) + n * 16;
    bytes = tail;
  }
  copy_bytes<<<blocks_for(bytes, blocks), kThreads, 0, stream>>>(
      static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes);
  OVERLAP_CHECK_LAUNCH("copy_bytes");
}

}  // namespace overlap::kernels

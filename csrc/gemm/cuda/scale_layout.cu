// Block-scale layout conversion kernels: a few thousand to a few million floats, one thread
// per destination element, so that writes coalesce (reads of the 1x128 transpose stride by
// kblocks, which the L2 absorbs at these sizes).
#include "common/cuda/cuda_check.h"
#include "gemm/cuda/scale_layout.h"

namespace overlap::gemm {

namespace {

constexpr int kThreads = 256;

__global__ void transpose_kernel(const float* __restrict__ src, std::int64_t rows,
                                 std::int64_t kblocks, float* __restrict__ dst) {
  const std::int64_t total = rows * kblocks;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t kb = i / rows;
    const std::int64_t r = i - kb * rows;
    dst[i] = src[r * kblocks + kb];
  }
}

__global__ void pad_kernel(const float* __restrict__ src, std::int64_t rblocks,
                           std::int64_t kblocks, std::int64_t ld, float* __restrict__ dst) {
  const std::int64_t total = rblocks * ld;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t rb = i / ld;
    const std::int64_t c = i - rb * ld;
    dst[i] = c < kblocks ? src[rb * kblocks + c] : 0.0f;
  }
}

unsigned grid_for(std::int64_t total) {
  const std::int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void transpose_block_scales(const float* src, std::int64_t rows, std::int64_t kblocks, float* dst,
                            cudaStream_t stream) {
  transpose_kernel<<<grid_for(rows * kblocks), kThreads, 0, stream>>>(src, rows, kblocks, dst);
  OVERLAP_CHECK_LAUNCH("transpose_kernel (block scales)");
}

void pad_block_scales(const float* src, std::int64_t rblocks, std::int64_t kblocks, std::int64_t ld,
                      float* dst, cudaStream_t stream) {
  pad_kernel<<<grid_for(rblocks * ld), kThreads, 0, stream>>>(src, rblocks, kblocks, ld, dst);
  OVERLAP_CHECK_LAUNCH("pad_kernel (block scales)");
}

}  // namespace overlap::gemm

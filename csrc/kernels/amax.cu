// CUDA amax: grid-stride, 16-byte vector loads, warp shuffles, one atomic per block.
#include <cstdint>

#include "kernels/amax.h"
#include "kernels/device_utils.cuh"

namespace overlap::kernels {

namespace {

constexpr int kThreads = 512;

using device::abs_bits;
using device::to_float;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, std::size_t n, unsigned* __restrict__ out) {
  constexpr int kVec = 16 / sizeof(T);
  unsigned local = 0;
  // Elements before the first 16-byte boundary and after the last full vector are done by
  // scalar loads; the middle by 16-byte loads.
  const auto addr = reinterpret_cast<std::uintptr_t>(x);
  std::size_t head = ((16 - (addr & 15)) & 15) / sizeof(T);
  if (head > n) head = n;
  const std::size_t n_vec = (n - head) / kVec;
  const std::size_t tail_begin = head + n_vec * kVec;
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;

  if (tid < head) local = max(local, abs_bits(to_float(x[tid])));
  if (tid < n - tail_begin) local = max(local, abs_bits(to_float(x[tail_begin + tid])));

  const uint4* vec = reinterpret_cast<const uint4*>(x + head);
  for (std::size_t i = tid; i < n_vec; i += stride) {
    const uint4 packed = __ldg(vec + i);
    const T* vals = reinterpret_cast<const T*>(&packed);
#pragma unroll
    for (int j = 0; j < kVec; ++j) local = max(local, abs_bits(to_float(vals[j])));
  }

  device::block_amax_to<kThreads>(local, out);
}

template <typename T>
void launch(const void* x, std::size_t n, float* out, cudaStream_t stream) {
  OVERLAP_CHECK_CUDA(cudaMemsetAsync(out, 0, sizeof(float), stream));
  if (n == 0) return;
  int device = 0;
  int sm_count = 0;
  OVERLAP_CHECK_CUDA(cudaGetDevice(&device));
  OVERLAP_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  constexpr std::size_t kVec = 16 / sizeof(T);
  const std::size_t blocks_needed = (n / kVec + kThreads - 1) / kThreads;
  // Enough blocks to fill the GPU twice over; never more than the work needs (at least one
  // block handles the scalar head and tail).
  std::size_t blocks = static_cast<std::size_t>(sm_count) * 2;
  if (blocks_needed < blocks) blocks = blocks_needed > 0 ? blocks_needed : 1;
  amax_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(x), n, reinterpret_cast<unsigned*>(out));
  OVERLAP_CHECK_LAUNCH("amax_kernel");
}

}  // namespace

void amax_cuda(const void* x, DType dtype, std::size_t n, float* out, cudaStream_t stream) {
  dispatch_float_type(dtype, "amax_cuda", [&](auto type_tag) {
    launch<typename decltype(type_tag)::type>(x, n, out, stream);
  });
}

}  // namespace overlap::kernels

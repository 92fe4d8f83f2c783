// CUDA kernels of the fused SwiGLU (NOTE [fused swiglu] in activation.h): one grid-stride
// pass over the rows * cols outputs, 16-byte vectors where cols and the pointers allow (NOTE
// [vector and scalar paths]), float32 math in the operations of the host reference.
#include "kernels/activation.h"
#include "kernels/device_utils.cuh"

namespace overlap::kernels {

namespace {

using device::element;
using device::from_float;
using device::to_float;

constexpr int kThreads = 256;

// NOTE [fused swiglu]'s formulas, operation for operation as swiglu_*_host (activation.cpp).
// expf, not __expf: the kernels are bound by memory traffic, so the accurate exp is free.
__device__ __forceinline__ float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

__device__ __forceinline__ float swiglu(float g, float u) {
  return g * sigmoid(g) * u;
}

// dg and du of one element.
__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = d * u * s * (1.0f + g * (1.0f - s));
  du = d * (g * s);
}

template <typename T>
__device__ __forceinline__ uint4 load_vec(const T* p) {
  return *reinterpret_cast<const uint4*>(p);
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[16 / sizeof(T)]) {
  std::uint32_t w[4];
  device::pack_elements<T, 16 / sizeof(T)>(v, w);
  device::store_words<4>(p, w);
}

// Output element i = (r, c) of the [rows, cols] output; its gate is h[r * 2 * cols + c] and
// its up cols elements further. The vector path needs cols % kVec == 0, so that a vector lies
// within one row (and its gate and up vectors are 16-byte aligned when h is).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ h, std::size_t cols, std::size_t n,
                          T* __restrict__ out, bool vectorized) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  device::grid_stride<kVec>(
      n, vectorized,
      [&](std::size_t i) {
        const T* gate = h + (i / cols) * cols + i;  // = h + r * 2 * cols + c
        const uint4 g = load_vec(gate);
        const uint4 u = load_vec(gate + cols);
        float a[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) a[j] = swiglu(element<T>(g, j), element<T>(u, j));
        store_vec<T>(out + i, a);
      },
      [&](std::size_t i) {
        const T* gate = h + (i / cols) * cols + i;
        out[i] = from_float<T>(swiglu(to_float(gate[0]), to_float(gate[cols])));
      });
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ da, const T* __restrict__ h, std::size_t cols,
                           std::size_t n, T* __restrict__ dh, bool vectorized) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  device::grid_stride<kVec>(
      n, vectorized,
      [&](std::size_t i) {
        const std::size_t gate = (i / cols) * cols + i;
        const uint4 d = load_vec(da + i);
        const uint4 g = load_vec(h + gate);
        const uint4 u = load_vec(h + gate + cols);
        float dg[kVec], du[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          swiglu_grad(element<T>(d, j), element<T>(g, j), element<T>(u, j), dg[j], du[j]);
        }
        store_vec<T>(dh + gate, dg);
        store_vec<T>(dh + gate + cols, du);
      },
      [&](std::size_t i) {
        const std::size_t gate = (i / cols) * cols + i;
        float dg, du;
        swiglu_grad(to_float(da[i]), to_float(h[gate]), to_float(h[gate + cols]), dg, du);
        dh[gate] = from_float<T>(dg);
        dh[gate + cols] = from_float<T>(du);
      });
}

// The grid of a grid-stride launch of `kernel` over `work` items: no more blocks than are
// resident on the GPU at once. grid_size assumes 2048 / kThreads blocks an SM, but the
// backward kernels of the 16-bit types need more than 32 registers a thread (capping them at
// 32 spills), so fewer blocks fit; the blocks past those would run as a second, sparsely
// occupied wave after the others.
template <typename Kernel>
unsigned resident_grid(Kernel kernel, std::size_t work) {
  int device = 0;
  int sms = 0;
  int per_sm = 0;
  OVERLAP_CHECK_CUDA(cudaGetDevice(&device));
  OVERLAP_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  OVERLAP_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  return grid_size(work, kThreads, (per_sm > 0 ? per_sm : 1) * sms);
}

}  // namespace

void swiglu_forward_cuda(const void* h, DType dtype, std::int64_t rows, std::int64_t cols,
                         void* out, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_forward_cuda";
  const auto n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  dispatch_float_type(dtype, kOp, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr std::int64_t kVec = 16 / sizeof(T);
    const bool vectorized = cols % kVec == 0 && aligned_to(h, 16) && aligned_to(out, 16);
    const unsigned grid = resident_grid(swiglu_forward_kernel<T>, vectorized ? n / kVec : n);
    swiglu_forward_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(h),
                                                            static_cast<std::size_t>(cols), n,
                                                            static_cast<T*>(out), vectorized);
    OVERLAP_CHECK_LAUNCH("swiglu_forward_kernel");
  });
}

void swiglu_backward_cuda(const void* da, const void* h, DType dtype, std::int64_t rows,
                          std::int64_t cols, void* dh, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_backward_cuda";
  const auto n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  dispatch_float_type(dtype, kOp, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr std::int64_t kVec = 16 / sizeof(T);
    const bool vectorized =
        cols % kVec == 0 && aligned_to(da, 16) && aligned_to(h, 16) && aligned_to(dh, 16);
    const unsigned grid = resident_grid(swiglu_backward_kernel<T>, vectorized ? n / kVec : n);
    swiglu_backward_kernel<T><<<grid, kThreads, 0, stream>>>(
        static_cast<const T*>(da), static_cast<const T*>(h), static_cast<std::size_t>(cols), n,
        static_cast<T*>(dh), vectorized);
    OVERLAP_CHECK_LAUNCH("swiglu_backward_kernel");
  });
}

}  // namespace overlap::kernels

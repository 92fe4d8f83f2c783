// CUDA kernels of the elementwise quantization ops: compute_scale, cast_to_fp8 and the
// dequantizations. Grid-stride loops with 16-byte vectors where the pointers allow
// (NOTE [vector and scalar paths]); each kernel mirrors its host reference operation for
// operation (NOTE [bit-exact kernels]).
#include "kernels/cast.h"
#include "kernels/dequantize.h"
#include "kernels/device_utils.cuh"
#include "kernels/scale.h"

namespace overlap::kernels {

namespace {

using device::abs_bits;
using device::element;
using device::reciprocal;

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    compute_scale_kernel(const float* amax, float* scale, float* scale_inv, std::size_t n,
                         float fp8_max, int margin, bool power_of_2, float epsilon) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    // Read before write: amax may alias scale or scale_inv element by element.
    const float s = device::scale_from_amax(amax[i], fp8_max, margin, power_of_2, epsilon);
    scale[i] = s;
    scale_inv[i] = reciprocal(s);
  }
}

// Elements per step of cast_kernel's vector path: two 16-byte loads in flight per thread and
// (for 16-bit inputs) one 16-byte store.
template <typename T>
constexpr int kCastStep = 32 / static_cast<int>(sizeof(T));

template <typename T, DType kFmt>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const T* x, std::size_t n, const float* scale, std::uint8_t* out, float* scale_inv,
                unsigned* amax, bool vectorized) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kStep = kCastStep<T>;
  const float s = *scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = reciprocal(s);
  unsigned local = 0;
  device::grid_stride<kStep>(
      n, vectorized,
      [&](std::size_t i) {
        const uint4 v[2] = {*reinterpret_cast<const uint4*>(x + i),
                            *reinterpret_cast<const uint4*>(x + i + kVec)};
        float q[kStep];
#pragma unroll
        for (int j = 0; j < kStep; ++j) {
          const float f = element<T>(v[j / kVec], j % kVec);
          local = max(local, abs_bits(f));
          q[j] = __fmul_rn(f, s);
        }
        std::uint32_t w[kStep / 4];
        device::pack_fp8<kFmt, kStep>(q, w);
        device::store_words<kStep / 4>(out + i, w);
      },
      [&](std::size_t i) {
        const float f = device::to_float(x[i]);
        local = max(local, abs_bits(f));
        out[i] = device::to_fp8<kFmt>(__fmul_rn(f, s));
      });
  if (amax != nullptr) device::block_amax_to<kThreads>(local, amax);
}

// Eight FP8 bytes per vector: 8 bytes in, 8 elements of OutT (16 or 32 bytes) out.
constexpr int kDequantVec = 8;

template <typename OutT, DType kFmt>
__device__ __forceinline__ void store_dequantized(OutT* out, std::size_t i, uint2 q,
                                                  const float (&s_inv)[kDequantVec]) {
  float v[kDequantVec];
#pragma unroll
  for (int j = 0; j < kDequantVec; ++j) {
    const auto byte = static_cast<std::uint8_t>((j < 4 ? q.x : q.y) >> (8 * (j % 4)));
    v[j] = __fmul_rn(device::fp8_to_float<kFmt>(byte), s_inv[j]);
  }
  std::uint32_t w[kDequantVec * sizeof(OutT) / 4];
  device::pack_elements<OutT, kDequantVec>(v, w);
  device::store_words<kDequantVec * sizeof(OutT) / 4>(out + i, w);
}

template <typename OutT, DType kFmt>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const std::uint8_t* q, std::size_t n, const float* scale_inv, OutT* out,
                      bool vectorized) {
  const float s = *scale_inv;
  device::grid_stride<kDequantVec>(
      n, vectorized,
      [&](std::size_t i) {
        float s_inv[kDequantVec];
#pragma unroll
        for (int j = 0; j < kDequantVec; ++j) s_inv[j] = s;
        store_dequantized<OutT, kFmt>(out, i, *reinterpret_cast<const uint2*>(q + i), s_inv);
      },
      [&](std::size_t i) {
        out[i] = device::from_float<OutT>(__fmul_rn(device::fp8_to_float<kFmt>(q[i]), s));
      });
}

struct BlockGeometry {
  std::int64_t cols;
  std::int64_t block_rows, block_cols;
  std::int64_t scale_cols;
};

template <bool kE8M0>
__device__ __forceinline__ float block_scale_inv(const void* scales, const BlockGeometry& g,
                                                 std::int64_t r, std::int64_t c) {
  const std::int64_t s = (r / g.block_rows) * g.scale_cols + c / g.block_cols;
  if constexpr (kE8M0) {
    return device::e8m0_to_float(static_cast<const std::uint8_t*>(scales)[s]);
  } else {
    return static_cast<const float*>(scales)[s];
  }
}

// vectorized requires cols % 8 == 0, so that a vector lies within one row.
template <typename OutT, DType kFmt, bool kE8M0>
__global__ void __launch_bounds__(kThreads)
    dequantize_blocks_kernel(const std::uint8_t* q, std::size_t n, const void* scales,
                             BlockGeometry g, OutT* out, bool vectorized) {
  device::grid_stride<kDequantVec>(
      n, vectorized,
      [&](std::size_t i) {
        const auto r = static_cast<std::int64_t>(i) / g.cols;
        const auto c = static_cast<std::int64_t>(i) % g.cols;
        float s_inv[kDequantVec];
#pragma unroll
        for (int j = 0; j < kDequantVec; ++j)
          s_inv[j] = block_scale_inv<kE8M0>(scales, g, r, c + j);
        store_dequantized<OutT, kFmt>(out, i, *reinterpret_cast<const uint2*>(q + i), s_inv);
      },
      [&](std::size_t i) {
        const auto r = static_cast<std::int64_t>(i) / g.cols;
        const auto c = static_cast<std::int64_t>(i) % g.cols;
        const float s_inv = block_scale_inv<kE8M0>(scales, g, r, c);
        out[i] = device::from_float<OutT>(__fmul_rn(device::fp8_to_float<kFmt>(q[i]), s_inv));
      });
}

}  // namespace

void compute_scale_cuda(const float* amax, float* scale, float* scale_inv, std::size_t n,
                        DType fp8_dtype, const ScaleOptions& options, cudaStream_t stream) {
  if (n == 0) return;
  compute_scale_kernel<<<grid_size(n, kThreads, 0), kThreads, 0, stream>>>(
      amax, scale, scale_inv, n, fp8_max_value(fp8_dtype), options.margin, options.power_of_2,
      options.epsilon);
  OVERLAP_CHECK_LAUNCH("compute_scale_kernel");
}

void cast_to_fp8_cuda(const void* x, DType x_dtype, std::size_t n, const float* scale,
                      std::uint8_t* out, float* scale_inv, float* amax, DType fp8_dtype,
                      cudaStream_t stream) {
  constexpr const char* kOp = "cast_to_fp8_cuda";
  // NOTE [amax bits]: zeroed in stream order, then max-reduced into by the kernel.
  if (amax != nullptr) OVERLAP_CHECK_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  dispatch_float_type(x_dtype, kOp, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr std::size_t kStep = kCastStep<T>;
    const bool vectorized = aligned_to(x, 16) && aligned_to(out, kStep);
    const unsigned grid = grid_size(vectorized ? n / kStep : n, kThreads, 0);
    dispatch_fp8(fp8_dtype, kOp, [&](auto fmt_tag) {
      constexpr DType kFmt = decltype(fmt_tag)::value;
      cast_kernel<T, kFmt>
          <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), n, scale, out, scale_inv,
                                          reinterpret_cast<unsigned*>(amax), vectorized);
      OVERLAP_CHECK_LAUNCH("cast_kernel");
    });
  });
}

void dequantize_cuda(const std::uint8_t* data, std::size_t n, const float* scale_inv, void* out,
                     DType out_dtype, DType fp8_dtype, cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_cuda";
  if (n == 0) return;
  const bool vectorized = aligned_to(data, kDequantVec) && aligned_to(out, 16);
  const unsigned grid = grid_size(vectorized ? n / kDequantVec : n, kThreads, 0);
  dispatch_float_type(out_dtype, kOp, [&](auto type_tag) {
    using OutT = typename decltype(type_tag)::type;
    dispatch_fp8(fp8_dtype, kOp, [&](auto fmt_tag) {
      constexpr DType kFmt = decltype(fmt_tag)::value;
      dequantize_kernel<OutT, kFmt>
          <<<grid, kThreads, 0, stream>>>(data, n, scale_inv, static_cast<OutT*>(out), vectorized);
      OVERLAP_CHECK_LAUNCH("dequantize_kernel");
    });
  });
}

void dequantize_blocks_cuda(const std::uint8_t* data, std::int64_t rows, std::int64_t cols,
                            const void* scale_inv, bool e8m0, std::int64_t block_rows,
                            std::int64_t block_cols, void* out, DType out_dtype, DType fp8_dtype,
                            cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_blocks_cuda";
  const auto n = static_cast<std::size_t>(rows * cols);
  if (n == 0) return;
  const BlockGeometry g{cols, block_rows, block_cols, (cols + block_cols - 1) / block_cols};
  const bool vectorized =
      aligned_to(data, kDequantVec) && aligned_to(out, 16) && cols % kDequantVec == 0;
  const unsigned grid = grid_size(vectorized ? n / kDequantVec : n, kThreads, 0);
  dispatch_float_type(out_dtype, kOp, [&](auto type_tag) {
    using OutT = typename decltype(type_tag)::type;
    dispatch_fp8(fp8_dtype, kOp, [&](auto fmt_tag) {
      constexpr DType kFmt = decltype(fmt_tag)::value;
      if (e8m0) {
        dequantize_blocks_kernel<OutT, kFmt, true><<<grid, kThreads, 0, stream>>>(
            data, n, scale_inv, g, static_cast<OutT*>(out), vectorized);
      } else {
        dequantize_blocks_kernel<OutT, kFmt, false><<<grid, kThreads, 0, stream>>>(
            data, n, scale_inv, g, static_cast<OutT*>(out), vectorized);
      }
      OVERLAP_CHECK_LAUNCH("dequantize_blocks_kernel");
    });
  });
}

}  // namespace overlap::kernels

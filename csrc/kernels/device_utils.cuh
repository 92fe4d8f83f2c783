// Device-side building blocks shared by the quantization and reduction kernels (CUDA only).
//
// NOTE [bit-exact kernels]: every kernel must produce the bytes of its host reference. The
// float operations are therefore spelled with the IEEE round-to-nearest intrinsics
// (__fmul_rn, __fadd_rn, __fdiv_rn) in the host's order, so that nvcc can neither contract a
// multiply and an add into an FMA nor replace a division by a reciprocal multiply, and the
// conversions are the correctly rounded hardware ones:
//
//   float -> FP8   cvt.rn.satfinite (round to nearest even, saturating: NOTE [fp8 encoding])
//   FP8 -> float   exact (through half)
//   float -> bf16 / fp16   round to nearest even
//
// The one place the bytes may differ is NaN: the hardware returns canonical NaNs (FP8 0x7F,
// float 0x7FFFFFFF), while the host reference keeps the sign (FP8 0xFF for a negative NaN)
// and the payload. Only the bit pattern of a NaN differs; a NaN is a NaN on both sides.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/cuda/cuda_check.h"
#include "common/dtype.h"

namespace overlap::kernels::device {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- element types ---------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) {
  return v;
}
__device__ __forceinline__ float to_float(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Raw bits of one element (16-bit types in the low half).
__device__ __forceinline__ std::uint32_t bits_of(float v) {
  return __float_as_uint(v);
}
__device__ __forceinline__ std::uint32_t bits_of(__half v) {
  return __half_as_ushort(v);
}
__device__ __forceinline__ std::uint32_t bits_of(__nv_bfloat16 v) {
  return __bfloat16_as_ushort(v);
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Element j of 16 bytes holding elements of T, as float (j a compile-time index after
// unrolling, so this stays in registers).
template <typename T>
__device__ __forceinline__ float element(const uint4& v, int j) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(word_of(v, j));
  } else {
    const std::uint32_t w = word_of(v, j / 2);
    const auto half_bits = static_cast<unsigned short>(j % 2 ? w >> 16 : w & 0xffffu);
    if constexpr (std::is_same_v<T, __half>) {
      return __half2float(__ushort_as_half(half_bits));
    } else {
      return __bfloat162float(__ushort_as_bfloat16(half_bits));
    }
  }
}

// 16 bytes of T read element by element: the first `valid` elements from src, zeros after
// (the scalar path for unaligned or ragged data; zeros never raise an amax).
template <typename T>
__device__ __forceinline__ uint4 load_partial(const T* src, int valid) {
  constexpr int kVec = 16 / sizeof(T);
  std::uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (j < valid) {
      if constexpr (sizeof(T) == 4) {
        w[j] = bits_of(src[j]);
      } else {
        w[j / 2] |= bits_of(src[j]) << (16 * (j % 2));
      }
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// kN floats rounded to T and packed little-endian into words.
template <typename T, int kN>
__device__ __forceinline__ void pack_elements(const float (&v)[kN],
                                              std::uint32_t (&w)[kN * sizeof(T) / 4]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < kN; ++j) w[j] = __float_as_uint(v[j]);
  } else {
    static_assert(kN % 2 == 0, "pack_elements: pairs of 16-bit elements");
#pragma unroll
    for (int j = 0; j < kN / 2; ++j) {
      w[j] = bits_of(from_float<T>(v[2 * j])) | (bits_of(from_float<T>(v[2 * j + 1])) << 16);
    }
  }
}

__device__ __forceinline__ std::uint8_t byte_of(const std::uint32_t* words, int j) {
  return static_cast<std::uint8_t>(words[j / 4] >> (8 * (j % 4)));
}

// ---- FP8 -------------------------------------------------------------------------------------

template <DType kFmt>
constexpr __nv_fp8_interpretation_t fp8_interpretation() {
  static_assert(kFmt == DType::kFloat8E4M3 || kFmt == DType::kFloat8E5M2, "not an FP8 format");
  return kFmt == DType::kFloat8E4M3 ? __NV_E4M3 : __NV_E5M2;
}

template <DType kFmt>
constexpr float fp8_max() {
  return kFmt == DType::kFloat8E4M3 ? 448.0f : 57344.0f;
}

// The exponent of the largest power of two the element format holds (NOTE [mxfp8 scale]).
template <DType kFmt>
constexpr int fp8_emax() {
  return kFmt == DType::kFloat8E4M3 ? 8 : 15;
}

template <DType kFmt>
__device__ __forceinline__ std::uint8_t to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fp8_interpretation<kFmt>());
}

// Two at once (one cvt instruction); a lands in the low byte.
template <DType kFmt>
__device__ __forceinline__ std::uint16_t to_fp8x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, fp8_interpretation<kFmt>());
}

template <DType kFmt>
__device__ __forceinline__ float fp8_to_float(std::uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, fp8_interpretation<kFmt>());
  return __half2float(__half(h));
}

// Quantizes kN floats (kN even) into kN bytes packed little-endian into kN / 4 words.
template <DType kFmt, int kN>
__device__ __forceinline__ void pack_fp8(const float (&v)[kN], std::uint32_t (&out)[kN / 4]) {
  static_assert(kN % 4 == 0, "pack_fp8 packs whole words");
#pragma unroll
  for (int w = 0; w < kN / 4; ++w) {
    const std::uint32_t lo = to_fp8x2<kFmt>(v[4 * w], v[4 * w + 1]);
    const std::uint32_t hi = to_fp8x2<kFmt>(v[4 * w + 2], v[4 * w + 3]);
    out[w] = lo | (hi << 16);
  }
}

// Stores kWords packed words at p (aligned to 4 * kWords bytes, up to 16).
template <int kWords>
__device__ __forceinline__ void store_words(void* p, const std::uint32_t (&w)[kWords]) {
  if constexpr (kWords == 1) {
    *static_cast<std::uint32_t*>(p) = w[0];
  } else if constexpr (kWords == 2) {
    *static_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    static_assert(kWords % 4 == 0, "store_words: 1, 2 or a multiple of 4 words");
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      static_cast<uint4*>(p)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
    }
  }
}

// ---- grid-stride loops -----------------------------------------------------------------------

// NOTE [vector and scalar paths]: elementwise kernels read and write 16-byte (or narrower)
// vectors when every pointer involved is aligned for them, and fall back to one element at a
// time otherwise (a slice at an odd offset). With `vectorized`, vec_op(i) handles elements
// [i, i + kVec) for every whole vector and scalar_op(i) the tail; without, scalar_op does all.
template <int kVec, typename VecOp, typename ScalarOp>
__device__ __forceinline__ void grid_stride(std::size_t n, bool vectorized, VecOp&& vec_op,
                                            ScalarOp&& scalar_op) {
  const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t scalar_begin = 0;
  if (vectorized) {
    const std::size_t n_vec = n / kVec;
    for (std::size_t v = tid; v < n_vec; v += stride) vec_op(v * kVec);
    scalar_begin = n_vec * kVec;
  }
  for (std::size_t i = scalar_begin + tid; i < n; i += stride) scalar_op(i);
}

// ---- amax ------------------------------------------------------------------------------------

// NOTE [amax bits]: max over non-negative floats and NaN taken on their bit patterns as
// unsigned integers: NaN (>= 0x7f800001 after fabs) sorts above +inf, so NaN propagates
// through max and atomicMax. An amax output is zeroed (cudaMemsetAsync) in stream order
// before the kernel, then every block contributes one atomicMax: overwrite semantics
// (NOTE [amax output]) without a second pass over the data.
__device__ __forceinline__ unsigned abs_bits(float v) {
  return __float_as_uint(fabsf(v));
}

__device__ __forceinline__ unsigned warp_max(unsigned v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Max of `local` over the block, returned to every thread. Every thread of the block must call
// it (it synchronizes); kThreads is the block size, a multiple of 32.
template <int kThreads>
__device__ __forceinline__ unsigned block_max(unsigned local) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_max: whole warps");
  __shared__ unsigned warp_maxes[kThreads / 32];
  local = warp_max(local);
  if (threadIdx.x % 32 == 0) warp_maxes[threadIdx.x / 32] = local;
  __syncthreads();
  unsigned result = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) result = max(result, warp_maxes[w]);
  __syncthreads();  // warp_maxes may be reused by a later call
  return result;
}

// Folds the block's amax into *out (an amax output zeroed before the launch).
template <int kThreads>
__device__ __forceinline__ void block_amax_to(unsigned local, unsigned* out) {
  const unsigned m = block_max<kThreads>(local);
  if (threadIdx.x == 0 && m != 0u) atomicMax(out, m);
}

// ---- scales ----------------------------------------------------------------------------------

// NOTE [scale convention] (kernels/scale.h), the same operations as scale_from_amax on the
// host: a true division, an exact ldexp, the clamps, and the power-of-two rounding as a mask
// of the exponent bits (exact for the normal scale left by the clamp, = 2^ilogb(scale)).
__device__ __forceinline__ float scale_from_amax(float amax, float fp8_max, int margin,
                                                 bool power_of_2, float epsilon) {
  if (!isfinite(amax)) return 1.0f;
  if (amax < epsilon) amax = epsilon;
  if (amax == 0.0f) return 1.0f;
  float scale = ldexpf(__fdiv_rn(fp8_max, amax), -margin);
  if (!(scale <= FLT_MAX)) scale = FLT_MAX;
  if (scale < FLT_MIN) scale = FLT_MIN;
  if (power_of_2) scale = __uint_as_float(__float_as_uint(scale) & 0x7f800000u);
  return scale;
}

__device__ __forceinline__ float reciprocal(float v) {
  return __fdiv_rn(1.0f, v);
}

// floor(log2(a)) for a finite a > 0, subnormals included (= std::ilogb).
__device__ __forceinline__ int ilogb_positive(float a) {
  const unsigned bits = __float_as_uint(a);
  const int exponent = static_cast<int>(bits >> 23);
  if (exponent != 0) return exponent - 127;
  return (31 - __clz(static_cast<int>(bits))) - 149;  // subnormal: the top mantissa bit
}

constexpr std::uint8_t kE8M0NaN = 0xFF;

// NOTE [mxfp8 scale] (kernels/mxfp8.h): the E8M0 byte of a block with this amax.
template <DType kFmt>
__device__ __forceinline__ std::uint8_t mx_scale_byte(float amax) {
  if (isnan(amax)) return kE8M0NaN;
  if (amax == 0.0f) return 0;
  if (isinf(amax)) return 254;
  const int shared = min(max(ilogb_positive(amax) - fp8_emax<kFmt>(), -127), 127);
  return static_cast<std::uint8_t>(shared + 127);
}

// 2^(byte - 127), exact (ldexpf is exact); 0xFF is NaN.
__device__ __forceinline__ float e8m0_to_float(std::uint8_t byte) {
  if (byte == kE8M0NaN) return __uint_as_float(0x7fc00000u);
  return ldexpf(1.0f, static_cast<int>(byte) - 127);
}

}  // namespace overlap::kernels::device

namespace overlap::kernels {

// Blocks for a grid-stride kernel with `threads` per block over `work` items (vectors or
// elements): enough to cover the work, at most enough to fill every SM of the current device
// (or `max_blocks` when > 0), at least one.
inline unsigned grid_size(std::size_t work, int threads, int max_blocks) {
  int device = 0;
  int sm_count = 0;
  OVERLAP_CHECK_CUDA(cudaGetDevice(&device));
  OVERLAP_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  std::size_t blocks = static_cast<std::size_t>(sm_count) * (2048 / threads);
  if (max_blocks > 0 && static_cast<std::size_t>(max_blocks) < blocks) blocks = max_blocks;
  const std::size_t needed = (work + threads - 1) / threads;
  if (needed < blocks) blocks = needed;
  return blocks > 0 ? static_cast<unsigned>(blocks) : 1u;
}

inline bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

template <typename T>
struct TypeTag {
  using type = T;
};
template <DType kDType>
using DTypeTag = std::integral_constant<DType, kDType>;

// Calls fn(TypeTag<T>{}) with T the CUDA type of a float32/float16/bfloat16 dtype.
template <typename Fn>
void dispatch_float_type(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(TypeTag<float>{});
    case DType::kFloat16:
      return fn(TypeTag<__half>{});
    case DType::kBFloat16:
      return fn(TypeTag<__nv_bfloat16>{});
    default:
      OVERLAP_THROW(kInvalidArgument,
                    op << ": expected float32, float16 or bfloat16, got " << dtype_name(dtype));
  }
}

// Calls fn(DTypeTag<kFmt>{}) for an FP8 format.
template <typename Fn>
void dispatch_fp8(DType fmt, const char* op, Fn&& fn) {
  switch (fmt) {
    case DType::kFloat8E4M3:
      return fn(DTypeTag<DType::kFloat8E4M3>{});
    case DType::kFloat8E5M2:
      return fn(DTypeTag<DType::kFloat8E5M2>{});
    default:
      OVERLAP_THROW(kInvalidArgument,
                    op << ": expected float8_e4m3fn or float8_e5m2, got " << dtype_name(fmt));
  }
}

}  // namespace overlap::kernels

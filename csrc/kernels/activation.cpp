#include "kernels/activation.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/errors.h"
#include "kernels/kernel_args.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

namespace {

// NOTE [host swiglu loops]: the host reference is what the layers run on CPU tensors (CI's
// path), so it is written to be vectorized by the compiler: each row is worked through in
// chunks converted to float32 up front (the dtype switch stays out of the inner loops), and
// the inner loops are plain loops over float arrays with no library call and no float
// comparison in them. That is why exp is spelled out below rather than taken from <cmath>
// (std::exp is one call per element), and why bfloat16 converts inline; float16 converts
// through common/dtype.h's functions, one call per element.
constexpr std::int64_t kChunk = 256;

inline std::uint32_t bits_of(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

inline float float_of(std::uint32_t u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// bf16 <-> float32 as bf16_to_float / float_to_bf16 in common/dtype.cpp (round to nearest
// even, NaN kept quiet), inline so that the conversion loops vectorize.
inline float bf16_bits_to_float(std::uint16_t b) {
  return float_of(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t float_to_bf16_bits(float v) {
  const std::uint32_t u = bits_of(v);
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(v != v ? (u >> 16) | 0x40u : rounded);
}

// exp(-x) for 0 <= x <= 104 in float32, within about one unit in the last place (Cephes'
// expf): -x = k ln2 + r with |r| <= ln2 / 2, exp(r) by a polynomial, times 2^k. 2^k is applied
// as two factors, each a normal float, so that the result underflows through the subnormals to
// 0 as exp does (exp(-104) rounds to 0). The integer k is read from the bits of a float (the
// 1.5 * 2^23 rounding trick): no float-to-int conversion, no branch.
inline float exp_neg(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * -1.44269504088896341f + kMagic;
  const float kf = t - kMagic;  // round(-x / ln2), in [-150, 0]
  const auto k = static_cast<std::int32_t>(bits_of(t) - bits_of(kMagic));
  float r = -x - kf * 0.693359375f;  // ln2 in two parts, the first exact in float
  r = r + kf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::int32_t k1 = k / 2;  // both halves in [-75, 0]
  const std::int32_t k2 = k - k1;
  const float two_k1 = float_of(static_cast<std::uint32_t>(k1 + 127) << 23);
  const float two_k2 = float_of(static_cast<std::uint32_t>(k2 + 127) << 23);
  return p * two_k1 * two_k2;
}

// sigmoid(g) = 1 / (1 + exp(-g)) (NOTE [fused swiglu]; activation.cu spells it that way on
// the device), here from e = exp(-|g|) on both sides, e / (1 + e) for a negative g, so that exp
// never overflows. The cases are chosen by masks on the bits of g, not by float comparisons or
// selects, which the compiler does not vectorize (they may trap; NOTE [host swiglu loops]). |g|
// is clamped to 104, beyond which e is 0 anyway; a NaN g comes out as itself.
inline float sigmoid(float g) {
  constexpr std::int32_t kClamp = 0x42D00000;  // 104.0f
  constexpr std::int32_t kInf = 0x7F800000;
  const std::uint32_t bits = bits_of(g);
  const auto mag = static_cast<std::int32_t>(bits & 0x7FFFFFFFu);
  const float e = exp_neg(float_of(static_cast<std::uint32_t>(mag < kClamp ? mag : kClamp)));
  const float q = 1.0f / (1.0f + e);
  const std::uint32_t negative = 0u - (bits >> 31);                       // all ones if g < 0
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>(mag > kInf);  // all ones if NaN
  const std::uint32_t s = (bits_of(e * q) & negative) | (bits_of(q) & ~negative);
  return float_of((bits & nan) | (s & ~nan));
}

void load_floats(const void* src, DType dtype, std::int64_t begin, std::int64_t n, float* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, static_cast<const float*>(src) + begin,
                  static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::kBFloat16: {
      const auto* p = static_cast<const std::uint16_t*>(src) + begin;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(p[i]);
      return;
    }
    case DType::kFloat16: {
      const auto* p = static_cast<const std::uint16_t*>(src) + begin;
      for (std::int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(p[i]);
      return;
    }
    default:
      OVERLAP_THROW(kInternal, "swiglu host: unexpected dtype " << dtype_name(dtype));
  }
}

void store_floats(const float* src, std::int64_t n, void* dst, DType dtype, std::int64_t begin) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(static_cast<float*>(dst) + begin, src,
                  static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::kBFloat16: {
      auto* p = static_cast<std::uint16_t*>(dst) + begin;
      for (std::int64_t i = 0; i < n; ++i) p[i] = float_to_bf16_bits(src[i]);
      return;
    }
    case DType::kFloat16: {
      auto* p = static_cast<std::uint16_t*>(dst) + begin;
      for (std::int64_t i = 0; i < n; ++i) p[i] = float_to_fp16(src[i]);
      return;
    }
    default:
      OVERLAP_THROW(kInternal, "swiglu host: unexpected dtype " << dtype_name(dtype));
  }
}

// h is [rows, 2 * cols]: gate, then up.
void check_gated_input(const TensorRef& h, const char* op) {
  check_float_matrix(h, op, "h");
  OVERLAP_CHECK_ARG(h.shape[1] % 2 == 0,
                    op << ": h must be [rows, 2 * cols] (the gate columns, then the up columns), "
                          "so its last dimension must be even; got "
                       << h.describe());
}

// t holds h's dtype and the given shape, contiguous.
void check_like(const TensorRef& t, const TensorRef& h, const std::vector<std::int64_t>& shape,
                const char* op, const char* what) {
  OVERLAP_CHECK_ARG(t.dtype == h.dtype, op << ": " << what << " must have h's dtype "
                                           << dtype_name(h.dtype) << ", got " << t.describe());
  check_shape(t, shape, op, what);
}

// An output must not share memory with an input: on CUDA, threads read and write in no
// particular order, so an overlap would read values already overwritten.
void check_output_disjoint(const char* op, const TensorRef& out, const char* out_name,
                           const TensorRef& in, const char* in_name) {
  const auto o = reinterpret_cast<std::uintptr_t>(out.data);
  const auto i = reinterpret_cast<std::uintptr_t>(in.data);
  const bool overlap = o < i + in.nbytes() && i < o + out.nbytes();
  OVERLAP_CHECK_ARG(!overlap, op << ": " << out_name << " must not share memory with " << in_name
                                 << "; pass a separate output tensor");
}

}  // namespace

void swiglu_forward_host(const void* h, DType dtype, std::int64_t rows, std::int64_t cols,
                         void* out) {
  float g[kChunk], u[kChunk], a[kChunk];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t gate = r * 2 * cols;
    for (std::int64_t c = 0; c < cols; c += kChunk) {
      const std::int64_t n = std::min(kChunk, cols - c);
      load_floats(h, dtype, gate + c, n, g);
      load_floats(h, dtype, gate + cols + c, n, u);
      for (std::int64_t i = 0; i < n; ++i) a[i] = g[i] * sigmoid(g[i]) * u[i];
      store_floats(a, n, out, dtype, r * cols + c);
    }
  }
}

void swiglu_backward_host(const void* da, const void* h, DType dtype, std::int64_t rows,
                          std::int64_t cols, void* dh) {
  float d[kChunk], g[kChunk], u[kChunk], dg[kChunk], du[kChunk];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t gate = r * 2 * cols;
    for (std::int64_t c = 0; c < cols; c += kChunk) {
      const std::int64_t n = std::min(kChunk, cols - c);
      load_floats(da, dtype, r * cols + c, n, d);
      load_floats(h, dtype, gate + c, n, g);
      load_floats(h, dtype, gate + cols + c, n, u);
      for (std::int64_t i = 0; i < n; ++i) {
        const float s = sigmoid(g[i]);
        dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = d[i] * (g[i] * s);
      }
      store_floats(dg, n, dh, dtype, gate + c);
      store_floats(du, n, dh, dtype, gate + cols + c);
    }
  }
}

void swiglu_forward(const TensorRef& h, const TensorRef& out, cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_forward";
  check_gated_input(h, kOp);
  const std::int64_t rows = h.shape[0];
  const std::int64_t cols = h.shape[1] / 2;
  check_like(out, h, {rows, cols}, kOp, "out");
  const int device = require_one_device(kOp, {&h, &out});
  check_output_disjoint(kOp, out, "out", h, "h");
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    swiglu_forward_cuda(h.data, h.dtype, rows, cols, out.data, stream);
    return;
#else
    throw_no_cuda(kOp, h);
#endif
  }
  swiglu_forward_host(h.data, h.dtype, rows, cols, out.data);
}

void swiglu_backward(const TensorRef& da, const TensorRef& h, const TensorRef& dh,
                     cudaStream_t stream) {
  constexpr const char* kOp = "swiglu_backward";
  check_gated_input(h, kOp);
  const std::int64_t rows = h.shape[0];
  const std::int64_t cols = h.shape[1] / 2;
  check_like(da, h, {rows, cols}, kOp, "da (the gradient of the [rows, cols] output)");
  check_like(dh, h, {rows, 2 * cols}, kOp, "dh");
  const int device = require_one_device(kOp, {&da, &h, &dh});
  check_output_disjoint(kOp, dh, "dh", h, "h");
  check_output_disjoint(kOp, dh, "dh", da, "da");
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    swiglu_backward_cuda(da.data, h.data, h.dtype, rows, cols, dh.data, stream);
    return;
#else
    throw_no_cuda(kOp, h);
#endif
  }
  swiglu_backward_host(da.data, h.data, h.dtype, rows, cols, dh.data);
}

}  // namespace overlap::kernels

// The host reference GEMM (NOTE [gemm output] in gemm.h): the host transport's GEMM and the
// oracle of the GPU tests.
//
// Every operand element is dequantized exactly (an FP8 value times a float32 scale_inv is
// exact in float64), products are summed in float64 over k in order, and the result is
// rounded once to the output dtype. It is the answer the GPU approximates, not a bit-exact
// model of any cuBLASLt kernel (those sum in float32, in tiles, with FP8 tensor-core
// accumulation when fast_accum is on).
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/errors.h"
#include "gemm/gemm.h"

namespace overlap::gemm {

namespace {

constexpr std::int64_t kBlock = 128;

// The scale_inv that applies to stored element (r, c) of x (NOTE [gemm scaling]).
double scale_at(const GemmOperand& x, std::int64_t r, std::int64_t c) {
  const std::int64_t col_blocks = (x.cols + kBlock - 1) / kBlock;
  switch (x.scaling) {
    case ScalingMode::kNone:
      return 1.0;
    case ScalingMode::kTensor:
      return x.scale_inv[0];
    case ScalingMode::kBlock1x128:
      return x.scale_inv[r * col_blocks + c / kBlock];
    case ScalingMode::kBlock128x128:
      return x.scale_inv[(r / kBlock) * col_blocks + c / kBlock];
    case ScalingMode::kMxfp8:
      break;
  }
  OVERLAP_THROW(kInternal,
                "gemm_host: scaling " << scaling_mode_name(x.scaling) << " passed validation");
}

// Dequantized op(x) (k_inner = false) or op(x)^T (k_inner = true) as a dense row-major
// float64 matrix whose rows run along k, so that the inner loop is contiguous:
//   A -> op(A) [m, k]          (k_inner = false: rows of op(A))
//   B -> op(B)^T [n, k]        (k_inner = true: columns of op(B))
std::vector<double> dequantize_k_rows(const GemmOperand& x, bool columns_of_op) {
  // Stored (r, c) is op(x)(r, c) when not transposed. "Rows along k" of op(A) are op(A)'s
  // rows; of op(B) they are op(B)'s columns, i.e. rows of op(B)^T.
  const bool read_transposed = x.transposed != columns_of_op;
  const std::int64_t out_rows = read_transposed ? x.cols : x.rows;
  const std::int64_t out_cols = read_transposed ? x.rows : x.cols;
  std::vector<double> out(static_cast<std::size_t>(out_rows * out_cols));
  for (std::int64_t r = 0; r < x.rows; ++r) {
    for (std::int64_t c = 0; c < x.cols; ++c) {
      const double v = static_cast<double>(
                           load_as_float(x.data, x.dtype, static_cast<std::size_t>(r * x.ld + c))) *
                       scale_at(x, r, c);
      const std::int64_t i = read_transposed ? c * out_cols + r : r * out_cols + c;
      out[static_cast<std::size_t>(i)] = v;
    }
  }
  return out;
}

double gelu_tanh(double x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

}  // namespace

void gemm_host(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
               const GemmOptions& o) {
  const GemmShape s = validate_gemm(a, b, d, o, GemmTarget{});
  const std::vector<double> av = dequantize_k_rows(a, false);  // [m, k]
  const std::vector<double> bv = dequantize_k_rows(b, true);   // [n, k]
  const bool fp8_out = dtype_is_fp8(d.dtype);
  const float out_scale = fp8_out ? *d.scale : 1.0f;
  float amax = 0.0f;
  bool nan = false;
  for (std::int64_t i = 0; i < s.m; ++i) {
    const double* arow = av.data() + i * s.k;
    for (std::int64_t j = 0; j < s.n; ++j) {
      const double* brow = bv.data() + j * s.k;
      double acc = 0.0;
      for (std::int64_t kk = 0; kk < s.k; ++kk) acc += arow[kk] * brow[kk];
      const auto idx = static_cast<std::size_t>((d.row_offset + i) * d.ld + j);
      double v = static_cast<double>(o.alpha) * acc;
      // D_old is read only when beta != 0: a poisoned (NaN) output must not leak into a
      // GEMM that overwrites it.
      if (o.beta != 0.0f) v += static_cast<double>(o.beta) * load_as_float(d.data, d.dtype, idx);
      if (o.bias != nullptr) {
        v += load_as_float(o.bias, o.bias_dtype, static_cast<std::size_t>(j));
      }
      if (o.gelu) v = gelu_tanh(v);
      if (fp8_out) {
        const float fv = static_cast<float>(v);
        nan |= std::isnan(fv);
        amax = std::fabs(fv) > amax ? std::fabs(fv) : amax;
        static_cast<std::uint8_t*>(d.data)[idx] = float_to_fp8(fv * out_scale, d.dtype);
      } else {
        store_from_float(d.data, d.dtype, idx, static_cast<float>(v));
      }
    }
  }
  if (d.amax != nullptr) *d.amax = nan ? std::numeric_limits<float>::quiet_NaN() : amax;
}

}  // namespace overlap::gemm

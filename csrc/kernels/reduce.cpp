#include "kernels/reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/errors.h"
#include "kernels/kernel_args.h"

namespace overlap::kernels {

float reduce_pointers_host(const void* const* inputs, DType dtype, std::size_t k, std::size_t n,
                           void* out, DType out_format, float scale) {
  const bool fp8 = dtype_is_fp8(out_format);
  float amax = 0.0f;
  bool has_nan = false;
  for (std::size_t j = 0; j < n; ++j) {
    float acc = load_as_float(inputs[0], dtype, j);  // NOTE [reduction order]
    for (std::size_t p = 1; p < k; ++p) acc += load_as_float(inputs[p], dtype, j);
    const float a = std::fabs(acc);
    has_nan |= std::isnan(a);
    amax = a > amax ? a : amax;
    if (fp8) {
      static_cast<std::uint8_t*>(out)[j] = float_to_fp8(acc * scale, out_format);
    } else {
      store_from_float(out, out_format, j, acc);
    }
  }
  return has_nan ? std::numeric_limits<float>::quiet_NaN() : amax;
}

float reduce_partials_host(const void* partials, DType dtype, std::size_t k, std::size_t n,
                           void* out, DType out_format, float scale) {
  std::vector<const void*> inputs(k);
  for (std::size_t p = 0; p < k; ++p) {
    inputs[p] = static_cast<const char*>(partials) + p * n * dtype_size(dtype);
  }
  return reduce_pointers_host(inputs.data(), dtype, k, n, out, out_format, scale);
}

void reduce_partials(const TensorRef& partials, const TensorRef& out, DType out_format,
                     const TensorRef* scale, const TensorRef* scale_inv, const TensorRef* amax,
                     cudaStream_t stream) {
  constexpr const char* kOp = "reduce_partials";
  check_float_input(partials, kOp, "partials");
  OVERLAP_CHECK_ARG(!partials.shape.empty() && partials.shape[0] >= 1,
                    kOp << ": partials must be [k, ...] with k >= 1 partial buffers stacked "
                           "along dim 0, got "
                        << partials.describe());
  const std::vector<std::int64_t> out_shape(partials.shape.begin() + 1, partials.shape.end());
  const bool fp8 = dtype_is_fp8(out_format);
  if (fp8) {
    check_fp8_data(out, out_format, kOp, "out");
    OVERLAP_CHECK_ARG(scale != nullptr, kOp << ": an FP8 output (" << dtype_name(out_format)
                                            << ") needs a float32[1] scale; pass scale=");
    check_float32_elements(*scale, 1, kOp, "scale");
    if (scale_inv != nullptr) check_float32_elements(*scale_inv, 1, kOp, "scale_inv");
  } else {
    OVERLAP_CHECK_ARG(out_format == DType::kFloat32 || out_format == DType::kBFloat16 ||
                          out_format == DType::kFloat16,
                      kOp << ": out_format must be float32, bfloat16, float16 or an FP8 format, "
                             "got "
                          << dtype_name(out_format));
    OVERLAP_CHECK_ARG(out.dtype == out_format, kOp << ": out must hold " << dtype_name(out_format)
                                                   << ", got " << out.describe());
    OVERLAP_CHECK_ARG(
        scale == nullptr && scale_inv == nullptr,
        kOp << ": scale and scale_inv apply to FP8 outputs only; out is " << out.describe());
  }
  check_shape(out, out_shape, kOp, "out (partials without the leading k dimension)");
  if (amax != nullptr) check_float32_elements(*amax, 1, kOp, "amax");
  require_host(kOp, {&partials, &out, scale, scale_inv, amax});

  const auto k = static_cast<std::size_t>(partials.shape[0]);
  const auto n = static_cast<std::size_t>(out.numel());
  const float s = fp8 ? *static_cast<const float*>(scale->data) : 1.0f;
  const float sum_amax =
      reduce_partials_host(partials.data, partials.dtype, k, n, out.data, out_format, s);
  if (scale_inv != nullptr) *static_cast<float*>(scale_inv->data) = 1.0f / s;
  if (amax != nullptr) *static_cast<float*>(amax->data) = sum_amax;
}

}  // namespace overlap::kernels

#include "kernels/scale.h"

#include <cfloat>
#include <cmath>

#include "common/errors.h"
#include "kernels/kernel_args.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

void check_scale_options(const ScaleOptions& options, const char* op) {
  OVERLAP_CHECK_ARG(options.margin >= 0 && options.margin <= 127,
                    op << ": margin must be an integer in [0, 127] (headroom in powers of two), "
                          "got "
                       << options.margin);
  OVERLAP_CHECK_ARG(std::isfinite(options.epsilon) && options.epsilon >= 0.0f,
                    op << ": epsilon must be finite and >= 0, got " << options.epsilon);
}

float scale_from_amax(float amax, float fp8_max, const ScaleOptions& options) {
  if (!std::isfinite(amax)) return 1.0f;  // NOTE [scale convention]: inf/NaN amax
  if (amax < options.epsilon) amax = options.epsilon;
  if (amax == 0.0f) return 1.0f;
  // ldexp by -margin is an exact division by 2^margin (short of underflow, clamped below).
  float scale = std::ldexp(fp8_max / amax, -options.margin);
  if (!(scale <= FLT_MAX)) scale = FLT_MAX;
  if (scale < FLT_MIN) scale = FLT_MIN;
  if (options.power_of_2) scale = std::ldexp(1.0f, std::ilogb(scale));
  return scale;
}

void compute_scale(const TensorRef& amax, const TensorRef& scale, const TensorRef& scale_inv,
                   DType fp8_dtype, const ScaleOptions& options, cudaStream_t stream) {
  constexpr const char* kOp = "compute_scale";
  check_fp8_format(fp8_dtype, kOp);
  check_scale_options(options, kOp);
  const std::int64_t n = amax.numel();
  check_float32_elements(amax, n, kOp, "amax");
  check_float32_elements(scale, n, kOp, "scale");
  check_float32_elements(scale_inv, n, kOp, "scale_inv");
  const int device = require_one_device(kOp, {&amax, &scale, &scale_inv});
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    compute_scale_cuda(static_cast<const float*>(amax.data), static_cast<float*>(scale.data),
                       static_cast<float*>(scale_inv.data), static_cast<std::size_t>(n), fp8_dtype,
                       options, stream);
    return;
#else
    throw_no_cuda(kOp, amax);
#endif
  }

  const float fp8_max = fp8_max_value(fp8_dtype);
  const auto* a = static_cast<const float*>(amax.data);
  auto* s = static_cast<float*>(scale.data);
  auto* s_inv = static_cast<float*>(scale_inv.data);
  for (std::int64_t i = 0; i < n; ++i) {
    const float value = scale_from_amax(a[i], fp8_max, options);
    s[i] = value;
    s_inv[i] = 1.0f / value;
  }
}

}  // namespace overlap::kernels

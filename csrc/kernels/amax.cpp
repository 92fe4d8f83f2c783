#include "kernels/amax.h"

#include <cmath>
#include <limits>

#include "common/errors.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

float amax_host(const void* x, DType dtype, std::size_t n) {
  float result = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = std::fabs(load_as_float(x, dtype, i));
    if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
    result = v > result ? v : result;
  }
  return result;
}

void amax(const TensorRef& x, const TensorRef& out, cudaStream_t stream) {
  OVERLAP_CHECK_ARG(
      x.dtype == DType::kFloat32 || x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16,
      "amax: input must be float32, float16 or bfloat16, got " << x.describe());
  check_contiguous(x, "amax input");
  OVERLAP_CHECK_ARG(out.dtype == DType::kFloat32 && out.numel() == 1,
                    "amax: out must be a float32 tensor of one element, got " << out.describe());
  OVERLAP_CHECK_ARG(out.device == x.device, "amax: out must be on the device of the input; input "
                                                << x.describe() << ", out " << out.describe());
  const auto n = static_cast<std::size_t>(x.numel());
  if (x.on_host()) {
    *static_cast<float*>(out.data) = amax_host(x.data, x.dtype, n);
    return;
  }
#ifdef OVERLAP_WITH_CUDA
  DeviceGuard guard(x.device);
  amax_cuda(x.data, x.dtype, n, static_cast<float*>(out.data), stream);
#else
  OVERLAP_THROW(kUnsupported,
                "amax on " << x.describe() << ": this build of overlap has no CUDA support");
#endif
}

}  // namespace overlap::kernels

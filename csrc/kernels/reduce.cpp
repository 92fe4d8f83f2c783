#include "kernels/reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/errors.h"
#include "kernels/kernel_args.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

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

namespace {

constexpr std::size_t kMaxCudaInputs = 64;  // reduce_pointers_cuda's limit

// The output side of a reduction, shared by reduce_partials and reduce_tensors.
void check_reduce_outputs(const char* op, const TensorRef& out,
                          const std::vector<std::int64_t>& out_shape, const char* out_what,
                          DType out_format, const TensorRef* scale, const TensorRef* scale_inv,
                          const TensorRef* amax) {
  if (dtype_is_fp8(out_format)) {
    check_fp8_data(out, out_format, op, "out");
    OVERLAP_CHECK_ARG(scale != nullptr, op << ": an FP8 output (" << dtype_name(out_format)
                                           << ") needs a float32[1] scale; pass scale=");
    check_float32_elements(*scale, 1, op, "scale");
    if (scale_inv != nullptr) check_float32_elements(*scale_inv, 1, op, "scale_inv");
  } else {
    OVERLAP_CHECK_ARG(out_format == DType::kFloat32 || out_format == DType::kBFloat16 ||
                          out_format == DType::kFloat16,
                      op << ": out_format must be float32, bfloat16, float16 or an FP8 format, "
                            "got "
                         << dtype_name(out_format));
    OVERLAP_CHECK_ARG(out.dtype == out_format, op << ": out must hold " << dtype_name(out_format)
                                                  << ", got " << out.describe());
    OVERLAP_CHECK_ARG(
        scale == nullptr && scale_inv == nullptr,
        op << ": scale and scale_inv apply to FP8 outputs only; out is " << out.describe());
  }
  check_shape(out, out_shape, op, out_what);
  if (amax != nullptr) check_float32_elements(*amax, 1, op, "amax");
}

float* float_ptr(const TensorRef* t) {
  return t != nullptr ? static_cast<float*>(t->data) : nullptr;
}

// Sums `inputs` (validated, all on `device`) into out: the host reference or the CUDA kernel.
void run_reduce(const char* op, int device, const std::vector<const void*>& inputs, DType dtype,
                const TensorRef& out, DType out_format, const TensorRef* scale,
                const TensorRef* scale_inv, const TensorRef* amax, int max_blocks,
                cudaStream_t stream) {
  const std::size_t k = inputs.size();
  const auto n = static_cast<std::size_t>(out.numel());
  if (device >= 0) {
    OVERLAP_CHECK_ARG(k <= kMaxCudaInputs, op << ": at most " << kMaxCudaInputs
                                              << " partial buffers on CUDA, got k = " << k
                                              << "; reduce in several steps");
    if (scale != nullptr) {
      check_disjoint(op, *scale, "scale", scale_inv, "scale_inv");
      check_disjoint(op, *scale, "scale", amax, "amax");
    }
    if (amax != nullptr) check_disjoint(op, *amax, "amax", scale_inv, "scale_inv");
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    reduce_pointers_cuda(inputs.data(), dtype, k, n, out.data, out_format, float_ptr(scale),
                         float_ptr(scale_inv), float_ptr(amax), max_blocks, stream);
    return;
#else
    throw_no_cuda(op, out);
#endif
  }
  const float s = dtype_is_fp8(out_format) ? *static_cast<const float*>(scale->data) : 1.0f;
  const float sum_amax = reduce_pointers_host(inputs.data(), dtype, k, n, out.data, out_format, s);
  if (scale_inv != nullptr) *static_cast<float*>(scale_inv->data) = 1.0f / s;
  if (amax != nullptr) *static_cast<float*>(amax->data) = sum_amax;
}

}  // namespace

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
  check_reduce_outputs(kOp, out, out_shape, "out (partials without the leading k dimension)",
                       out_format, scale, scale_inv, amax);
  const int device = require_one_device(kOp, {&partials, &out, scale, scale_inv, amax});

  const auto k = static_cast<std::size_t>(partials.shape[0]);
  const std::size_t bytes = static_cast<std::size_t>(out.numel()) * dtype_size(partials.dtype);
  std::vector<const void*> inputs(k);
  for (std::size_t p = 0; p < k; ++p)
    inputs[p] = static_cast<const char*>(partials.data) + p * bytes;
  run_reduce(kOp, device, inputs, partials.dtype, out, out_format, scale, scale_inv, amax, 0,
             stream);
}

void reduce_tensors(const std::vector<TensorRef>& inputs, const TensorRef& out, DType out_format,
                    const TensorRef* scale, const TensorRef* scale_inv, const TensorRef* amax,
                    int max_blocks, cudaStream_t stream) {
  constexpr const char* kOp = "reduce_tensors";
  OVERLAP_CHECK_ARG(!inputs.empty(), kOp << ": give at least one input tensor");
  const TensorRef& first = inputs.front();
  check_float_input(first, kOp, "inputs[0]");
  for (std::size_t p = 1; p < inputs.size(); ++p) {
    OVERLAP_CHECK_ARG(inputs[p].dtype == first.dtype && inputs[p].shape == first.shape &&
                          inputs[p].is_contiguous(),
                      kOp << ": every input must be contiguous with the dtype and shape of "
                             "inputs[0] ("
                          << first.describe() << "); inputs[" << p << "] is "
                          << inputs[p].describe());
  }
  check_reduce_outputs(kOp, out, first.shape, "out (the shape of the inputs)", out_format, scale,
                       scale_inv, amax);
  const int device = require_one_device(kOp, {&out, scale, scale_inv, amax});
  std::vector<const void*> pointers;
  for (std::size_t p = 0; p < inputs.size(); ++p) {
    OVERLAP_CHECK_ARG(inputs[p].device == out.device, kOp << ": all tensors must be on one device; "
                                                          << out.describe() << " and inputs[" << p
                                                          << "] " << inputs[p].describe());
    pointers.push_back(inputs[p].data);
  }
  run_reduce(kOp, device, pointers, first.dtype, out, out_format, scale, scale_inv, amax,
             max_blocks, stream);
}

}  // namespace overlap::kernels

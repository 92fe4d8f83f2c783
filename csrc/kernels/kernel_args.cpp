#include "kernels/kernel_args.h"

#include <sstream>

#include "common/errors.h"

namespace overlap::kernels {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream oss;
  oss << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) oss << (i ? ", " : "") << shape[i];
  oss << "]";
  return oss.str();
}

void check_float_input(const TensorRef& x, const char* op, const char* what) {
  OVERLAP_CHECK_ARG(
      x.dtype == DType::kFloat32 || x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16,
      op << ": " << what << " must be float32, float16 or bfloat16, got " << x.describe());
  OVERLAP_CHECK_ARG(x.is_contiguous(), op << ": " << what << " must be contiguous, got "
                                          << x.describe() << " with strides "
                                          << shape_string(x.strides) << "; call .contiguous()");
}

void check_float_matrix(const TensorRef& x, const char* op, const char* what) {
  check_float_input(x, op, what);
  OVERLAP_CHECK_ARG(x.shape.size() == 2, op << ": " << what << " must be 2-D [rows, cols], got "
                                            << x.describe()
                                            << "; flatten leading dimensions with .view(-1, "
                                               "cols)");
}

void check_fp8_format(DType fp8_dtype, const char* op) {
  OVERLAP_CHECK_ARG(dtype_is_fp8(fp8_dtype), op << ": fp8_dtype must be float8_e4m3fn or "
                                                   "float8_e5m2, got "
                                                << dtype_name(fp8_dtype));
}

void check_fp8_data(const TensorRef& t, DType fp8_dtype, const char* op, const char* what) {
  OVERLAP_CHECK_ARG(t.dtype == DType::kUInt8 || t.dtype == fp8_dtype,
                    op << ": " << what << " must be uint8 or " << dtype_name(fp8_dtype)
                       << " (the requested fp8_dtype), got " << t.describe()
                       << "; pass fp8_dtype matching the tensor's FP8 dtype");
  OVERLAP_CHECK_ARG(t.is_contiguous(), op << ": " << what << " must be contiguous, got "
                                          << t.describe() << " with strides "
                                          << shape_string(t.strides));
}

void check_shape(const TensorRef& t, const std::vector<std::int64_t>& shape, const char* op,
                 const char* what) {
  OVERLAP_CHECK_ARG(t.shape == shape, op << ": " << what << " must have shape "
                                         << shape_string(shape) << ", got " << t.describe());
  OVERLAP_CHECK_ARG(t.is_contiguous(), op << ": " << what << " must be contiguous, got "
                                          << t.describe() << " with strides "
                                          << shape_string(t.strides));
}

void check_float32_elements(const TensorRef& t, std::int64_t numel, const char* op,
                            const char* what) {
  OVERLAP_CHECK_ARG(t.dtype == DType::kFloat32 && t.numel() == numel && t.is_contiguous(),
                    op << ": " << what << " must be a contiguous float32 tensor of " << numel
                       << " element" << (numel == 1 ? "" : "s") << ", got " << t.describe());
}

int require_one_device(const char* op, std::initializer_list<const TensorRef*> tensors) {
  const TensorRef* first = nullptr;
  for (const TensorRef* t : tensors) {
    if (t == nullptr) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    OVERLAP_CHECK_ARG(t->device == first->device, op << ": all tensors must be on one device; "
                                                     << first->describe() << " and "
                                                     << t->describe());
  }
  return first == nullptr ? -1 : first->device;
}

void throw_no_cuda(const char* op, const TensorRef& t) {
  OVERLAP_THROW(kUnsupported, op << " on " << t.describe()
                                 << ": this build of overlap has no CUDA support; pass CPU "
                                    "tensors or rebuild with CUDA");
}

void check_disjoint(const char* op, const TensorRef& a, const char* a_name, const TensorRef* b,
                    const char* b_name) {
  if (b == nullptr) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b->data);
  const bool overlap = a0 < b0 + b->nbytes() && b0 < a0 + a.nbytes();
  OVERLAP_CHECK_ARG(!overlap, op << ": " << a_name << " and " << b_name
                                 << " must not share memory on CUDA (every block reads the "
                                    "scale while scale_inv and amax are written); pass "
                                    "separate tensors");
}

std::pair<bool, bool> check_output_pairs(const QuantizedOutputs& outs, const char* op) {
  const bool rowwise = outs.rowwise_data != nullptr;
  const bool columnwise = outs.columnwise_data != nullptr;
  OVERLAP_CHECK_ARG(rowwise == (outs.rowwise_scale_inv != nullptr),
                    op << ": rowwise_data and rowwise_scale_inv must be given together (data "
                       << (rowwise ? "given" : "missing") << ", scale_inv "
                       << (outs.rowwise_scale_inv ? "given" : "missing") << ")");
  OVERLAP_CHECK_ARG(columnwise == (outs.columnwise_scale_inv != nullptr),
                    op << ": columnwise_data and columnwise_scale_inv must be given together "
                          "(data "
                       << (columnwise ? "given" : "missing") << ", scale_inv "
                       << (outs.columnwise_scale_inv ? "given" : "missing") << ")");
  OVERLAP_CHECK_ARG(rowwise || columnwise,
                    op << ": nothing to do: ask for the rowwise output, the columnwise output "
                          "or both");
  return {rowwise, columnwise};
}

}  // namespace overlap::kernels

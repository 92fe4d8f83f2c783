#include "common/tensor_ref.h"

#include <sstream>

#include "common/errors.h"

namespace overlap {

std::int64_t TensorRef::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

bool TensorRef::is_contiguous() const {
  // As torch defines it: a tensor without elements addresses no memory, whatever its strides
  // (torch.empty(3, 0) has strides [1, 1]).
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorRef::describe() const {
  std::ostringstream oss;
  oss << dtype_name(dtype) << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) oss << (i ? ", " : "") << shape[i];
  oss << "] on " << (device < 0 ? std::string("cpu") : "cuda:" + std::to_string(device));
  return oss.str();
}

void check_contiguous(const TensorRef& t, const char* what) {
  OVERLAP_CHECK_ARG(t.is_contiguous(), what << " must be contiguous, got " << t.describe()
                                            << " with non-contiguous strides; call .contiguous()");
}

}  // namespace overlap

// A non-owning, framework-neutral description of a tensor handed to the core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace overlap {

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  int device = -1;                    // CUDA device ordinal, -1 for host memory

  std::int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  bool on_host() const { return device < 0; }
  std::string describe() const;  // "bfloat16[128, 64] on cuda:0"
};

// Throws kInvalidArgument naming `what` unless t is contiguous.
void check_contiguous(const TensorRef& t, const char* what);

}  // namespace overlap

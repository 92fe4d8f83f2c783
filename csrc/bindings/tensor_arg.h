// Conversion of framework tensors (anything with torch's tensor protocol: data_ptr(), dtype,
// shape, stride(), device) into the core's TensorRef. The core never sees torch.
#pragma once

#include <pybind11/pybind11.h>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::bindings {

// `what` names the argument in error messages ("amax input").
TensorRef tensor_ref_from_py(pybind11::handle obj, const char* what);

// Python passes streams as integers (torch.cuda.current_stream().cuda_stream).
inline cudaStream_t stream_from_py(std::uintptr_t handle) {
  return reinterpret_cast<cudaStream_t>(handle);
}

}  // namespace overlap::bindings

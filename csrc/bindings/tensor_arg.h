// Conversion of framework tensors (anything with torch's tensor protocol: data_ptr(), dtype,
// shape, stride(), device) into the core's TensorRef. The core never sees torch.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::bindings {

// `what` names the argument in error messages ("amax input").
TensorRef tensor_ref_from_py(pybind11::handle obj, const char* what);

// None -> nullopt; anything else as tensor_ref_from_py.
std::optional<TensorRef> optional_tensor_ref_from_py(pybind11::handle obj, const char* what);

// Pointer to the contained TensorRef, or nullptr: the core's spelling of an optional tensor.
inline const TensorRef* ptr(const std::optional<TensorRef>& t) {
  return t ? &*t : nullptr;
}

// A framework dtype object (torch.float8_e4m3fn, ...) as a core DType; `what` names it.
DType dtype_from_py(pybind11::handle dtype, const char* what);

// Python passes streams as integers (torch.cuda.current_stream().cuda_stream).
inline cudaStream_t stream_from_py(std::uintptr_t handle) {
  return reinterpret_cast<cudaStream_t>(handle);
}

}  // namespace overlap::bindings

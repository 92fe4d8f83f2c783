// Conversion of framework tensors (anything with torch's tensor protocol: data_ptr(), dtype,
// shape, stride(), device) into the core's TensorRef. The core never sees torch.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::bindings {

// `what` names the argument in error messages ("amax input").
TensorRef tensor_ref_from_py(pybind11::handle obj, const char* what);

// NOTE [gather dtypes]: the gathers move bytes, so they take a tensor of ANY dtype (int64,
// bool, complex64, ... which the core's DType does not name) as a uint8 view of its bytes
// (TensorRef of shape [nbytes]), and `*type` receives a 64-bit identity of its dtype (a hash of
// its name) for the op record, so that ranks gathering different types of one size still get
// a mismatch. Throws kInvalidArgument unless it is a contiguous tensor on the cpu or cuda.
TensorRef tensor_bytes_from_py(pybind11::handle obj, const char* what, std::uint64_t* type);

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

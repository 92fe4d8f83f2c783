#include "bindings/tensor_arg.h"

#include <string>
#include <unordered_map>

#include "common/errors.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

DType dtype_from_name(const std::string& name, const char* what) {
  static const std::unordered_map<std::string, DType> kByName = {
      {"torch.float32", DType::kFloat32},        {"torch.float16", DType::kFloat16},
      {"torch.bfloat16", DType::kBFloat16},      {"torch.float8_e4m3fn", DType::kFloat8E4M3},
      {"torch.float8_e5m2", DType::kFloat8E5M2}, {"torch.uint8", DType::kUInt8},
      {"torch.float8_e8m0fnu", DType::kUInt8},   {"torch.int32", DType::kInt32},
      {"torch.float64", DType::kFloat64},
  };
  auto it = kByName.find(name);
  OVERLAP_CHECK_ARG(it != kByName.end(),
                    what << ": dtype " << name << " is not supported by overlap's core");
  return it->second;
}

}  // namespace

DType dtype_from_py(py::handle dtype, const char* what) {
  return dtype_from_name(py::str(dtype).cast<std::string>(), what);
}

std::optional<TensorRef> optional_tensor_ref_from_py(py::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return tensor_ref_from_py(obj, what);
}

TensorRef tensor_ref_from_py(py::handle obj, const char* what) {
  OVERLAP_CHECK_ARG(
      py::hasattr(obj, "data_ptr") && py::hasattr(obj, "stride"),
      what << ": expected a tensor, got " << py::str(py::type::of(obj)).cast<std::string>());
  TensorRef t;
  t.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<std::uintptr_t>());
  t.dtype = dtype_from_name(py::str(obj.attr("dtype")).cast<std::string>(), what);
  for (py::handle d : obj.attr("shape")) t.shape.push_back(d.cast<std::int64_t>());
  for (py::handle s : obj.attr("stride")()) t.strides.push_back(s.cast<std::int64_t>());
  py::object device = obj.attr("device");
  const std::string type = device.attr("type").cast<std::string>();
  if (type == "cuda") {
    py::object index = device.attr("index");
    t.device = index.is_none() ? 0 : index.cast<int>();
  } else {
    OVERLAP_CHECK_ARG(type == "cpu", what << ": tensors must be on cpu or cuda, got " << type);
    t.device = -1;
  }
  return t;
}

}  // namespace overlap::bindings

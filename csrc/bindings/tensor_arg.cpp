#include "bindings/tensor_arg.h"

#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

// NOTE [tensor conversion cost]: every tensor argument of every call goes through
// tensor_ref_from_py, so its attribute reads are on the host's launch path (a cast_transpose
// call converts six tensors). The attribute names are interned once, a dtype object's DType is
// remembered by identity, and a CUDA tensor's device comes from is_cuda / get_device() rather
// than a torch.device object and its type string; anything else takes the general path.

// An interned attribute name, made on first use and deliberately never released (a static
// py::object would be destroyed after the interpreter at exit).
PyObject* intern(const char* s) {
  PyObject* n = PyUnicode_InternFromString(s);
  if (n == nullptr) throw py::error_already_set();
  return n;
}

py::object get_attr(py::handle obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj.ptr(), name);
  if (r == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

// The CUDA ordinal of a tensor with is_cuda == True and get_device(), else -1 (no Python
// error left set): the caller then reads .device.
int fast_cuda_device(py::handle obj) {
  static PyObject* const kIsCuda = intern("is_cuda");
  static PyObject* const kGetDevice = intern("get_device");
  const auto general_path = [] {
    PyErr_Clear();  // harmless where none is set
    return -1;
  };
  const auto is_cuda = py::reinterpret_steal<py::object>(PyObject_GetAttr(obj.ptr(), kIsCuda));
  if (!is_cuda || PyObject_IsTrue(is_cuda.ptr()) != 1) return general_path();
  const auto index =
      py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(obj.ptr(), kGetDevice));
  if (!index) return general_path();
  const long device = PyLong_AsLong(index.ptr());
  return device >= 0 ? static_cast<int>(device) : general_path();
}

}  // namespace

DType dtype_from_py(py::handle dtype, const char* what) {
  // Framework dtypes are singletons (torch.bfloat16, ...): each one's DType is remembered by
  // identity. The GIL serializes the callers; a cached object is kept alive by its reference,
  // so an identity never goes stale. Bounded, in case some framework makes dtype objects anew.
  static std::vector<std::pair<PyObject*, DType>> known;
  for (const auto& [obj, d] : known) {
    if (obj == dtype.ptr()) return d;
  }
  const DType d = dtype_from_name(py::str(dtype).cast<std::string>(), what);
  if (known.size() < 64) known.emplace_back(dtype.inc_ref().ptr(), d);
  return d;
}

std::optional<TensorRef> optional_tensor_ref_from_py(py::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return tensor_ref_from_py(obj, what);
}

namespace {

// The device of a tensor: its CUDA ordinal, or -1 on the cpu (kInvalidArgument otherwise).
int device_from_py(py::handle obj, const char* what) {
  const int fast = fast_cuda_device(obj);
  if (fast >= 0) return fast;
  py::object device = obj.attr("device");
  const std::string type = device.attr("type").cast<std::string>();
  if (type == "cuda") {
    py::object index = device.attr("index");
    return index.is_none() ? 0 : index.cast<int>();
  }
  OVERLAP_CHECK_ARG(type == "cpu", what << ": tensors must be on cpu or cuda, got " << type);
  return -1;
}

}  // namespace

TensorRef tensor_bytes_from_py(py::handle obj, const char* what, std::uint64_t* type) {
  static PyObject* const kDataPtr = intern("data_ptr");
  static PyObject* const kStride = intern("stride");
  static PyObject* const kDtype = intern("dtype");
  static PyObject* const kShape = intern("shape");
  static PyObject* const kElementSize = intern("element_size");
  OVERLAP_CHECK_ARG(
      PyObject_HasAttr(obj.ptr(), kDataPtr) && PyObject_HasAttr(obj.ptr(), kStride) &&
          PyObject_HasAttr(obj.ptr(), kElementSize),
      what << ": expected a tensor, got " << py::str(py::type::of(obj)).cast<std::string>());
  const std::string dtype = py::str(get_attr(obj, kDtype)).cast<std::string>();
  TensorRef elements;  // shape and strides in elements; its dtype is not used
  for (py::handle d : get_attr(obj, kShape)) elements.shape.push_back(d.cast<std::int64_t>());
  for (py::handle s : get_attr(obj, kStride)()) elements.strides.push_back(s.cast<std::int64_t>());
  if (!elements.is_contiguous()) {
    std::ostringstream shape;
    for (std::size_t i = 0; i < elements.shape.size(); ++i) {
      shape << (i ? ", " : "") << elements.shape[i];
    }
    OVERLAP_THROW(kInvalidArgument, what << " must be contiguous, got " << dtype << "["
                                         << shape.str()
                                         << "] with non-contiguous strides; call .contiguous()");
  }
  const auto itemsize = get_attr(obj, kElementSize)().cast<std::int64_t>();
  TensorRef t;
  t.data = reinterpret_cast<void*>(get_attr(obj, kDataPtr)().cast<std::uintptr_t>());
  t.dtype = DType::kUInt8;
  t.shape = {elements.numel() * itemsize};
  t.strides = {1};
  t.device = device_from_py(obj, what);
  // FNV-1a of the dtype's name: the same on every rank for one dtype.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : dtype) h = (h ^ c) * 1099511628211ull;
  *type = h;
  return t;
}

TensorRef tensor_ref_from_py(py::handle obj, const char* what) {
  // NOTE [tensor conversion cost].
  static PyObject* const kDataPtr = intern("data_ptr");
  static PyObject* const kStride = intern("stride");
  static PyObject* const kDtype = intern("dtype");
  static PyObject* const kShape = intern("shape");
  OVERLAP_CHECK_ARG(
      PyObject_HasAttr(obj.ptr(), kDataPtr) && PyObject_HasAttr(obj.ptr(), kStride),
      what << ": expected a tensor, got " << py::str(py::type::of(obj)).cast<std::string>());
  TensorRef t;
  t.data = reinterpret_cast<void*>(get_attr(obj, kDataPtr)().cast<std::uintptr_t>());
  t.dtype = dtype_from_py(get_attr(obj, kDtype), what);
  for (py::handle d : get_attr(obj, kShape)) t.shape.push_back(d.cast<std::int64_t>());
  for (py::handle s : get_attr(obj, kStride)()) t.strides.push_back(s.cast<std::int64_t>());
  t.device = device_from_py(obj, what);
  return t;
}

}  // namespace overlap::bindings

#include "bindings/dlpack.h"

#include <Python.h>

namespace py = pybind11;

namespace overlap::bindings {

namespace {

// --- DLPack ABI (v0.8) ---
enum DLDeviceType : std::int32_t { kDLCPU = 1, kDLCUDA = 2 };
struct DLDevice {
  DLDeviceType device_type;
  std::int32_t device_id;
};
enum DLDataTypeCode : std::uint8_t { kDLUInt = 1 };
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
// --- end of the ABI ---

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// Everything one exported tensor owns; freed by the DLPack deleter.
struct Export {
  DLManagedTensor managed{};
  std::int64_t shape[1] = {0};
  std::shared_ptr<const void> owner;
};

void delete_export(DLManagedTensor* self) {
  delete static_cast<Export*>(self->manager_ctx);
}

// A capsule that no consumer took still owns its tensor (DLPack's capsule protocol).
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed == nullptr) {
    PyErr_Clear();
    return;
  }
  managed->deleter(managed);
}

}  // namespace

py::capsule byte_view_capsule(void* data, std::size_t nbytes, int device,
                              std::shared_ptr<const void> owner) {
  auto* e = new Export;
  e->owner = std::move(owner);
  e->shape[0] = static_cast<std::int64_t>(nbytes);
  DLTensor& t = e->managed.dl_tensor;
  t.data = data;
  t.device = device < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, device};
  t.ndim = 1;
  t.dtype = DLDataType{kDLUInt, 8, 1};
  t.shape = e->shape;
  t.strides = nullptr;  // compact row-major
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  PyObject* capsule = PyCapsule_New(&e->managed, kCapsuleName, capsule_destructor);
  if (capsule == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace overlap::bindings

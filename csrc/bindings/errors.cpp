// Maps overlap::Error kinds onto the Python exception classes of overlap.errors.
#include <pybind11/pybind11.h>

#include "bindings/registry.h"
#include "bindings/signals.h"
#include "common/errors.h"

namespace py = pybind11;

namespace overlap::bindings {

namespace {

const char* python_class_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "InvalidArgumentError";
    case ErrorKind::kConfig:
      return "ConfigError";
    case ErrorKind::kState:
      return "StateError";
    case ErrorKind::kTimeout:
      return "CommTimeoutError";
    case ErrorKind::kUnsupported:
      return "UnsupportedHardwareError";
    case ErrorKind::kCuda:
      return "CudaError";
    case ErrorKind::kBootstrap:
      return "BootstrapError";
    case ErrorKind::kSystem:
      return "SystemResourceError";
    case ErrorKind::kAborted:
      return "CommAbortedError";
    case ErrorKind::kInternal:
      break;
  }
  return "OverlapError";
}

}  // namespace

void register_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // NOTE [interrupting waits]: a wait cut short by a signal handler raises what it raised.
      if (e.kind() == ErrorKind::kAborted && restore_signal_error()) return;
      // overlap.errors is pure Python and imported before _C is used.
      py::object cls = py::module_::import("overlap.errors").attr(python_class_for(e.kind()));
      py::set_error(cls, e.what());
    }
  });
}

}  // namespace overlap::bindings

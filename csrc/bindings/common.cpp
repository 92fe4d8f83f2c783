// Build/runtime information, logging and lifecycle hooks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/registry.h"
#include "common/errors.h"
#include "common/lifecycle.h"
#include "common/runtime_info.h"

namespace py = pybind11;

namespace overlap::bindings {

void register_common(py::module_& m) {
  m.def(
      "runtime_info",
      [] {
        RuntimeInfo info;
        {
          py::gil_scoped_release release;  // cudaGetDeviceCount can take a while the first time
          info = runtime_info();
        }
        py::list devices;
        for (const DeviceInfo& d : info.devices) {
          py::dict dev;
          dev["ordinal"] = d.ordinal;
          dev["name"] = d.name;
          dev["compute_capability"] = py::make_tuple(d.cc_major, d.cc_minor);
          dev["sm_count"] = d.sm_count;
          dev["total_memory"] = d.total_memory;
          dev["pci_bus_id"] = d.pci_bus_id;
          dev["peer_access"] = d.peer_access;
          devices.append(dev);
        }
        py::dict out;
        out["cuda_compiled"] = info.cuda_compiled;
        out["no_cuda_reason"] = info.no_cuda_reason;
        out["cuda_archs"] = info.cuda_archs;
        out["cudart_build_version"] = info.cudart_build_version;
        out["cudart_version"] = info.cudart_version;
        out["driver_version"] = info.driver_version;
        out["device_count"] = info.device_count;
        out["device_error"] = info.device_error;
        out["cublaslt_version"] = info.cublaslt_version;
        out["cublaslt_build_library"] = info.cublaslt_build_library;
        out["cublaslt_loaded_library"] = info.cublaslt_loaded_library;
        out["cudart_loaded_library"] = info.cudart_loaded_library;
        out["devices"] = devices;
        return out;
      },
      "Build and machine facts as a dict; never raises for a missing driver or GPU.");
  m.def(
      "set_log_level", [](int level) { set_log_level(static_cast<LogLevel>(level)); },
      py::arg("level"), "Threshold of the core's stderr log, in `logging` levels.");
  m.def("mark_process_finalizing", &mark_process_finalizing,
        "Called at interpreter exit: owners stop making driver calls.");
  m.def(
      "_raise_for_test",
      [](const std::string& kind_name, const std::string& message) {
        static const std::pair<const char*, ErrorKind> kKinds[] = {
            {"internal", ErrorKind::kInternal}, {"invalid_argument", ErrorKind::kInvalidArgument},
            {"config", ErrorKind::kConfig},     {"state", ErrorKind::kState},
            {"timeout", ErrorKind::kTimeout},   {"unsupported", ErrorKind::kUnsupported},
            {"cuda", ErrorKind::kCuda},         {"bootstrap", ErrorKind::kBootstrap},
            {"system", ErrorKind::kSystem},     {"aborted", ErrorKind::kAborted},
        };
        for (const auto& [name, kind] : kKinds) {
          if (kind_name == name) {
            detail::throw_error(kind, __FILE__, __LINE__, __func__, nullptr, message);
          }
        }
        OVERLAP_THROW(kInvalidArgument, "unknown error kind '" << kind_name << "'");
      },
      py::arg("kind"), py::arg("message"), "Test hook: raise an error of the given kind.");
  m.def(
      "_check_eq_for_test",
      [](std::int64_t expected, std::int64_t actual) {
        OVERLAP_CHECK_EQ(expected, actual, kConfig, "test values differ");
      },
      py::arg("expected"), py::arg("actual"), "Test hook: OVERLAP_CHECK_EQ on two integers.");
}

}  // namespace overlap::bindings

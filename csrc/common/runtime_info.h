// What this build of the core can do, and what the machine it runs on offers.
#pragma once

#include <string>
#include <vector>

namespace overlap {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  std::size_t total_memory = 0;
  std::string pci_bus_id;
  std::vector<bool> peer_access;  // peer_access[j]: this device can map device j's memory
};

struct RuntimeInfo {
  bool cuda_compiled = false;
  std::string no_cuda_reason;  // set when cuda_compiled is false
  std::string cuda_archs;      // architectures compiled, e.g. "90a"
  int cudart_build_version = 0;
  int cudart_version = 0;  // of the runtime library loaded
  int driver_version = 0;  // 0 when there is no driver
  int device_count = 0;
  std::string device_error;  // why device_count is 0, when it is
  std::size_t cublaslt_version = 0;
  std::string cublaslt_build_library;   // library linked at build time
  std::string cublaslt_loaded_library;  // library the process actually loaded
  std::string cudart_loaded_library;
  std::vector<DeviceInfo> devices;
};

// Never throws for a missing driver or GPU: those are reported in the struct.
RuntimeInfo runtime_info();

}  // namespace overlap

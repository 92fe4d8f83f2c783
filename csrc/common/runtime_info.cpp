#include "common/runtime_info.h"

#include <dlfcn.h>

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/cuda_check.h"
#endif

namespace overlap {

#ifdef OVERLAP_WITH_CUDA

namespace {
std::string library_of(const void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) return info.dli_fname;
  return "unknown";
}
}  // namespace

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.cuda_compiled = true;
  info.cuda_archs = OVERLAP_BUILD_CUDA_ARCHS;
  info.cudart_build_version = CUDART_VERSION;
  cudaRuntimeGetVersion(&info.cudart_version);
  cudaDriverGetVersion(&info.driver_version);  // leaves 0 without a driver
  info.cublaslt_version = cublasLtGetVersion();
  info.cublaslt_build_library = OVERLAP_BUILD_CUBLASLT_LIBRARY;
  info.cublaslt_loaded_library = library_of(reinterpret_cast<const void*>(&cublasLtGetVersion));
  info.cudart_loaded_library = library_of(reinterpret_cast<const void*>(&cudaRuntimeGetVersion));

  const cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess) {
    info.device_count = 0;
    info.device_error = detail::cuda_error_string(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return info;
  }
  for (int d = 0; d < info.device_count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    DeviceInfo dev;
    dev.ordinal = d;
    dev.name = prop.name;
    dev.cc_major = prop.major;
    dev.cc_minor = prop.minor;
    dev.sm_count = prop.multiProcessorCount;
    dev.total_memory = prop.totalGlobalMem;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), d) == cudaSuccess) dev.pci_bus_id = bus;
    for (int peer = 0; peer < info.device_count; ++peer) {
      int can = 0;
      if (peer != d) cudaDeviceCanAccessPeer(&can, d, peer);
      dev.peer_access.push_back(peer == d || can != 0);
    }
    info.devices.push_back(std::move(dev));
  }
  return info;
}

#else  // !OVERLAP_WITH_CUDA

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.cuda_compiled = false;
  info.no_cuda_reason = OVERLAP_BUILD_NO_CUDA_REASON;
  info.device_error = "overlap was built without CUDA support: " + info.no_cuda_reason;
  return info;
}

#endif

}  // namespace overlap

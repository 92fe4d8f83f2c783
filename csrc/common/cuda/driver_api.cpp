#include "common/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "common/cuda/cuda_check.h"

namespace overlap {

namespace {

template <typename Fn>
void load_entry(const char* symbol, unsigned int version, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    OVERLAP_THROW(kUnsupported, "CUDA driver entry point '"
                                    << symbol << "' (version " << version
                                    << ") is unavailable: " << detail::cuda_error_string(err)
                                    << ", query status " << static_cast<int>(status)
                                    << ". Is an NVIDIA driver >= 12.0 installed?");
  }
  *out = reinterpret_cast<Fn>(fn);
}

}  // namespace

const DriverApi& driver() {
  static std::once_flag once;
  static DriverApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
#define OVERLAP_LOAD_ENTRY(name, version) load_entry(#name, version, &api.name);
      OVERLAP_DRIVER_ENTRY_POINTS(OVERLAP_LOAD_ENTRY)
#undef OVERLAP_LOAD_ENTRY
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(ErrorKind::kUnsupported, failure);
  return api;
}

namespace detail {

std::string cuda_error_string(cudaError_t err) {
  std::ostringstream oss;
  oss << cudaGetErrorName(err) << " (" << static_cast<int>(err) << "): " << cudaGetErrorString(err);
  return oss.str();
}

std::string cu_result_string(CUresult res) {
  const char* name = nullptr;
  const char* text = nullptr;
  try {
    const DriverApi& api = driver();
    api.cuGetErrorName(res, &name);
    api.cuGetErrorString(res, &text);
  } catch (const Error&) {
  }
  std::ostringstream oss;
  oss << (name ? name : "CUresult") << " (" << static_cast<int>(res)
      << "): " << (text ? text : "unknown driver error");
  return oss.str();
}

std::string cublas_status_string(cublasStatus_t status) {
  std::ostringstream oss;
  oss << cublasLtGetStatusName(status) << " (" << static_cast<int>(status)
      << "): " << cublasLtGetStatusString(status);
  return oss.str();
}

}  // namespace detail
}  // namespace overlap

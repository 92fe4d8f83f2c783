#include "comm/cuda/cuda_memory.h"

#include <cstring>

#include "common/cuda/cuda_check.h"
#include "common/cuda/device_guard.h"
#include "common/errors.h"
#include "common/lifecycle.h"

namespace overlap::comm::cuda {

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

std::string to_hex(const void* bytes, std::size_t n) {
  std::string out(2 * n, '0');
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHexDigits[p[i] >> 4];
    out[2 * i + 1] = kHexDigits[p[i] & 15];
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

void from_hex(const std::string& hex, void* bytes, std::size_t n) {
  OVERLAP_CHECK(hex.size() == 2 * n, kBootstrap,
                "malformed CUDA IPC handle: " << hex.size() << " hex digits, expected " << 2 * n);
  auto* p = static_cast<unsigned char*>(bytes);
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = hex_value(hex[2 * i]);
    const int lo = hex_value(hex[2 * i + 1]);
    OVERLAP_CHECK(hi >= 0 && lo >= 0, kBootstrap, "malformed CUDA IPC handle '" << hex << "'");
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
}

// Cleanup paths (destructors): run `release` with `device` current, then restore the caller's
// device; failures are logged, never thrown, and nothing runs once the process is finalizing.
template <typename Release>
void release_on_device(int device, Release&& release) {
  if (process_finalizing()) return;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  OVERLAP_WARN_CUDA(cudaSetDevice(device));
  release();
  OVERLAP_WARN_CUDA(cudaSetDevice(previous));
}

}  // namespace

DeviceAllocation::DeviceAllocation(int device, std::size_t bytes)
    : device_(device),
      size_(bytes),
      allocated_((bytes + kAllocationRounding - 1) / kAllocationRounding *
                 kAllocationRounding) {  // NOTE [allocation granularity]
  DeviceGuard guard(device);
  const cudaError_t err = cudaMalloc(&data_, allocated_);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of the runtime
    OVERLAP_THROW(kCuda, "cannot allocate a symmetric buffer of "
                             << bytes << " bytes on cuda:" << device << ": "
                             << detail::cuda_error_string(err)
                             << "; free memory or ask for a smaller buffer");
  }
}

DeviceAllocation::~DeviceAllocation() {
  if (data_ == nullptr) return;
  release_on_device(device_, [this] { OVERLAP_WARN_CUDA(cudaFree(data_)); });
}

LocalFlagMemory::LocalFlagMemory(int device, std::size_t bytes) : device_(device) {
  DeviceGuard guard(device);
  OVERLAP_CHECK_CUDA(cudaMalloc(&data_, bytes));
  const cudaError_t err = cudaMemset(data_, 0, bytes);  // synchronous: zero before any op
  if (err != cudaSuccess) {
    OVERLAP_WARN_CUDA(cudaFree(data_));
    OVERLAP_CHECK_CUDA(err);
  }
}

LocalFlagMemory::~LocalFlagMemory() {
  if (data_ == nullptr) return;
  release_on_device(device_, [this] { OVERLAP_WARN_CUDA(cudaFree(data_)); });
}

std::string DeviceAllocation::export_ipc_handle() const {
  DeviceGuard guard(device_);
  cudaIpcMemHandle_t handle;
  OVERLAP_CHECK_CUDA(cudaIpcGetMemHandle(&handle, data_));
  return to_hex(&handle, sizeof(handle));
}

IpcMapping::IpcMapping(int device, const std::string& hex_handle) : device_(device) {
  cudaIpcMemHandle_t handle;
  from_hex(hex_handle, &handle, sizeof(handle));
  DeviceGuard guard(device);
  const cudaError_t err = cudaIpcOpenMemHandle(&data_, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    OVERLAP_THROW(kBootstrap, "cuda:" << device << " cannot map a peer's buffer by CUDA IPC: "
                                      << detail::cuda_error_string(err)
                                      << ". Are the GPUs of the group peer-to-peer capable "
                                         "(nvidia-smi topo -m), and is each rank on its own "
                                         "process?");
  }
}

IpcMapping::~IpcMapping() {
  if (data_ == nullptr) return;
  release_on_device(device_, [this] { OVERLAP_WARN_CUDA(cudaIpcCloseMemHandle(data_)); });
}

HostRegistration::HostRegistration(void* data, std::size_t bytes) : data_(data) {
  OVERLAP_CHECK_CUDA(
      cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
}

HostRegistration::~HostRegistration() {
  if (process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaHostUnregister(data_));
}

PinnedHostMemory::PinnedHostMemory(std::size_t bytes) {
  OVERLAP_CHECK_CUDA(cudaHostAlloc(&data_, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(data_, 0, bytes);
}

PinnedHostMemory::~PinnedHostMemory() {
  if (process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaFreeHost(data_));
}

OwnedStream::OwnedStream(int device) {
  DeviceGuard guard(device);
  int least = 0;
  int greatest = 0;
  OVERLAP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  OVERLAP_CHECK_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
}

OwnedStream::~OwnedStream() {
  if (process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaStreamDestroy(stream_));
}

OwnedEvent::OwnedEvent() {
  OVERLAP_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

OwnedEvent::~OwnedEvent() {
  if (process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaEventDestroy(event_));
}

}  // namespace overlap::comm::cuda

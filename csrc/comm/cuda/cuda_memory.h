// RAII owners of the cuda transport's driver resources.
// NOTE [finalizing]: every destructor skips its CUDA call once the interpreter is finalizing
// (common/lifecycle.h): the runtime may be gone already, and the OS reclaims everything.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace overlap::comm::cuda {

// NOTE [allocation granularity]: a region's cudaMalloc is rounded up to a whole number of 2 MiB
// (the GPU's large page): an allocation with a small tail beyond whole MiBs made every
// copy-engine copy through its IPC mapping slower (why is undocumented). Verdict: round up; it
// costs at most 2 MiB a region, and size() stays the size asked for. Measured:
// docs/performance-log.md [allocation granularity].
constexpr std::size_t kAllocationRounding = std::size_t{2} << 20;

// cudaMalloc'd device memory, shareable by CUDA IPC (NOTE [allocation granularity]).
class DeviceAllocation {
 public:
  DeviceAllocation(int device, std::size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t allocated() const { return allocated_; }
  int device() const { return device_; }
  // The IPC handle of the allocation, hex-encoded (128 characters).
  std::string export_ipc_handle() const;

 private:
  int device_;
  std::size_t size_;
  std::size_t allocated_;
  void* data_ = nullptr;
};

// NOTE [local flags] (comm/transport.h): a small cudaMalloc'd, zero-initialised block of flags
// that only this process's GPU reads; not shared, so not rounded up.
class LocalFlagMemory {
 public:
  LocalFlagMemory(int device, std::size_t bytes);
  ~LocalFlagMemory();
  LocalFlagMemory(const LocalFlagMemory&) = delete;
  LocalFlagMemory& operator=(const LocalFlagMemory&) = delete;
  std::uint64_t* data() const { return static_cast<std::uint64_t*>(data_); }

 private:
  int device_;
  void* data_ = nullptr;
};

// A peer's allocation opened from its IPC handle (cudaIpcOpenMemHandle, peer access enabled).
class IpcMapping {
 public:
  IpcMapping(int device, const std::string& hex_handle);
  ~IpcMapping();
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;

  void* data() const { return data_; }

 private:
  int device_;
  void* data_ = nullptr;
};

// Page-locks host memory we mapped (a shared-memory segment) and maps it for the GPU.
// NOTE [flags in host memory]: the device address of registered memory must equal its host
// address (cudaDevAttrCanUseHostPointerForRegisteredMem); checked once at creation.
class HostRegistration {
 public:
  HostRegistration(void* data, std::size_t bytes);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  void* data_;
};

// cudaHostAlloc'd (pinned, mapped, portable) host memory, zero-initialised.
class PinnedHostMemory {
 public:
  explicit PinnedHostMemory(std::size_t bytes);
  ~PinnedHostMemory();
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// A non-blocking stream of the highest priority (comm lanes never queue behind a GEMM).
class OwnedStream {
 public:
  explicit OwnedStream(int device);
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing, for fork/join of lanes.
class OwnedEvent {
 public:
  OwnedEvent();
  ~OwnedEvent();
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace overlap::comm::cuda

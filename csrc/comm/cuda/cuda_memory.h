// RAII owners of the cuda transport's driver resources (one class per resource).
//
// NOTE [finalizing]: every destructor skips its CUDA call once the interpreter is finalizing
// (common/lifecycle.h): the runtime may already be gone, and the OS reclaims everything.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace overlap::comm::cuda {

// cudaMalloc'd device memory on `device`, shareable by CUDA IPC.
class DeviceAllocation {
 public:
  DeviceAllocation(int device, std::size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  int device() const { return device_; }
  // The IPC handle of the allocation, hex-encoded (128 characters).
  std::string export_ipc_handle() const;

 private:
  int device_;
  std::size_t size_;
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
// NOTE [flags in host memory]: the cuda transport requires that the device address of
// registered memory equals its host address (cudaDevAttrCanUseHostPointerForRegisteredMem,
// true on x86-64 Linux with UVA); the transport checks it once at creation.
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

// A stream this library owns (non-blocking, highest priority: comm lanes should never queue
// behind a GEMM's blocks).
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

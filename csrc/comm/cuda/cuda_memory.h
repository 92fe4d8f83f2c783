// RAII owners of the cuda transport's driver resources (one class per resource).
//
// NOTE [finalizing]: every destructor skips its CUDA call once the interpreter is finalizing
// (common/lifecycle.h): the runtime may already be gone, and the OS reclaims everything.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace overlap::comm::cuda {

// NOTE [allocation granularity]: a region's cudaMalloc is rounded up to a whole number of
// 2 MiB (the GPU's large page). Peers read and write the region over NVLink through its CUDA
// IPC mapping, and an allocation with a small tail beyond a whole number of MiB came out
// slow for every copy-engine copy touching it: on 4xH200 (TP 4, scripts of 2026-11-22, torch
// async-TP's AG+GEMM schedule rebuilt with our GEMM, qkv FP8 M 8192, four 16 MB pulls per op
// between peers' regions at the same offsets) the op took 0.281 ms with regions of 64 MiB,
// 65, 66 or 128 MiB, and 0.308-0.310 ms with 64 MiB + 64 B (our AG+GEMM buffer: the shard
// slots + the FP8 scale slots), + 256 B or + 4 KiB, each 16 MB pull 60-83 us instead of 48.
// What the driver does differently with such sizes is not documented; the rounding costs at
// most 2 MiB per region and is invisible to callers (size() is the size asked for).
constexpr std::size_t kAllocationRounding = std::size_t{2} << 20;

// cudaMalloc'd device memory on `device`, shareable by CUDA IPC (NOTE [allocation
// granularity]: the allocation is rounded up to kAllocationRounding).
class DeviceAllocation {
 public:
  DeviceAllocation(int device, std::size_t bytes);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Bytes actually allocated: size() rounded up to kAllocationRounding.
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

// RAII: make `device` current for a scope, restoring the previous device on exit.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda/cuda_check.h"

namespace overlap {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    OVERLAP_CHECK_CUDA(cudaGetDevice(&previous_));
    if (device != previous_) OVERLAP_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) {
      OVERLAP_WARN_CUDA(cudaSetDevice(previous_));
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace overlap

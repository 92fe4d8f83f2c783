// copy: bytes moved by SM loads and stores, for puts into a peer GPU's memory (NVLink).
//
// NOTE [sm puts]: the copy engines move data between GPUs by default (no SM taken from the
// GEMMs), but they top out below NCCL's bus bandwidth, so a put may hand part of its bytes to
// this kernel (bounded blocks) where bandwidth matters more than SMs (standalone collectives).
// Measured: docs/performance-log.md [sm puts].
#pragma once

#include <cstddef>

#include "common/stream.h"

namespace overlap::kernels {

#ifdef OVERLAP_WITH_CUDA
// dst[0, bytes) = src[0, bytes) on `stream` with at most `blocks` blocks (>= 1); either may
// be a peer GPU's memory mapped by CUDA IPC. 16-byte accesses when both are 16-byte aligned.
void copy_cuda(void* dst, const void* src, std::size_t bytes, int blocks, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

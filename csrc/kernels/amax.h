// amax: the largest absolute value of a tensor (per-tensor FP8 scaling starts here).
//
// NaN propagates: a tensor holding a NaN has amax NaN, so a bad input is never silently
// quantized. The cross-rank reduction of amax is the caller's job (docs/design.md §3, invariant 3).
#pragma once

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// x: contiguous float32/float16/bfloat16, any number of elements (0 gives amax 0).
// out: float32 tensor of one element on the same device as x.
// Host tensors run the host reference; CUDA tensors launch on `stream` (no host sync).
void amax(const TensorRef& x, const TensorRef& out, cudaStream_t stream);

// The host reference (also the host transport's implementation).
float amax_host(const void* x, DType dtype, std::size_t n);

#ifdef OVERLAP_WITH_CUDA
void amax_cuda(const void* x, DType dtype, std::size_t n, float* out, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

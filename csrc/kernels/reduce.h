// reduce_partials: the sum of k partial buffers, the reduction step of a reduce-scatter.
//
// NOTE [reduction order]: element j is summed in float32 in partial order,
// ((p0 + p1) + p2) + ..., starting from p0 itself (not from +0.0, which would turn a -0.0 sum
// into +0.0). The order is fixed so that the result is deterministic and independent of how
// many ranks or chunks produced the partials; the CUDA kernel must use the same order to be
// bit-exact against this reference. The sum is rounded once, to the output format.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// partials: contiguous [k, d1, ...] (k >= 1) float32/bfloat16/float16.
// out: contiguous [d1, ...], holding `out_format` elements: out_format is float32, bfloat16 or
//   float16 (out's dtype), or an FP8 format (out's dtype, or uint8 carrying the bytes).
// scale: float32[1], required for an FP8 out_format (out = fp8(sum * scale)), else nullptr.
// scale_inv: nullptr, or float32[1] receiving 1 / scale (FP8 out_format only).
// amax: nullptr, or float32[1] receiving max |sum| of the unscaled sum (NaN propagates).
void reduce_partials(const TensorRef& partials, const TensorRef& out, DType out_format,
                     const TensorRef* scale, const TensorRef* scale_inv, const TensorRef* amax,
                     cudaStream_t stream);

// Host reference: k partials of n elements each; returns max |sum| (NaN if any sum is NaN).
// The same reduction over k separate input pointers (peer buffers of the host transport):
// inputs[p] holds n elements of `dtype`. out may alias an input.
float reduce_pointers_host(const void* const* inputs, DType dtype, std::size_t k, std::size_t n,
                           void* out, DType out_format, float scale);

float reduce_partials_host(const void* partials, DType dtype, std::size_t k, std::size_t n,
                           void* out, DType out_format, float scale);

#ifdef OVERLAP_WITH_CUDA
void reduce_pointers_cuda(const void* const* inputs, DType dtype, std::size_t k, std::size_t n,
                          void* out, DType out_format, const float* scale, float* scale_inv,
                          float* amax, int max_blocks, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

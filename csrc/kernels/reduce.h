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
#include <vector>

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

// The reduction of reduce_partials over k separate tensors (inputs[p]: contiguous, one dtype
// and shape, out's shape), on the host or on CUDA (all tensors on one device; on CUDA at most
// 64 inputs). max_blocks bounds the CUDA grid (<= 0: enough blocks for the GPU); other
// arguments as in reduce_partials.
void reduce_tensors(const std::vector<TensorRef>& inputs, const TensorRef& out, DType out_format,
                    const TensorRef* scale, const TensorRef* scale_inv, const TensorRef* amax,
                    int max_blocks, cudaStream_t stream);

#ifdef OVERLAP_WITH_CUDA
// The CUDA kernel (reduce.cu): inputs is a host array of k <= 64 device pointers (a peer
// GPU's memory mapped through CUDA IPC is fine; NOTE [peer inputs] in reduce.cu), each with n
// elements of `dtype`; out holds n elements of out_format and may alias an input. scale
// (required for an FP8 out_format, else nullptr), scale_inv and amax (nullptr or float32[1],
// NOTE [amax output] in cast.h) are device pointers, never read on the host. Summed in the
// order of NOTE [reduction order]. max_blocks bounds the grid (<= 0: enough blocks to fill
// the GPU) so that a reduce-scatter leaves SMs to a concurrent GEMM. Enqueued on `stream`
// (a stream of the current device, where out lives) without synchronizing the host. With
// accumulate_amax, amax is max-reduced into (the pieces of one output) instead of zeroed first.
void reduce_pointers_cuda(const void* const* inputs, DType dtype, std::size_t k, std::size_t n,
                          void* out, DType out_format, const float* scale, float* scale_inv,
                          float* amax, int max_blocks, cudaStream_t stream,
                          bool accumulate_amax = false);
#endif

}  // namespace overlap::kernels

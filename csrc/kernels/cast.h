// Per-tensor FP8 casts: cast_to_fp8 (rowwise) and cast_transpose (rowwise + columnwise).
//
// Both compute q = fp8(x * scale) with one float32 scale for the whole tensor (see
// NOTE [scale convention] in kernels/scale.h and NOTE [fp8 encoding] in common/dtype.h), and
// write scale_inv = 1 / scale next to the data: the data and its scale_inv are produced
// together so that they can travel together (docs/design.md §3, invariant 1).
//
// NOTE [amax output]: the optional amax output receives max |x| of the UNSCALED input,
// overwritten rather than max-accumulated (NaN propagates), so the result never depends on
// what the buffer held before. That is the amax of this tensor for the next step's scale.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// x: contiguous float32/float16/bfloat16, any shape. scale: float32, one element.
// out: contiguous uint8 or `fp8_dtype`, x's shape. scale_inv: float32, one element.
// amax: nullptr, or float32 with one element. All tensors on one device: host tensors run the
// host reference, CUDA tensors the kernel on `stream` (scale, scale_inv and amax distinct).
void cast_to_fp8(const TensorRef& x, const TensorRef& scale, const TensorRef& out,
                 const TensorRef& scale_inv, const TensorRef* amax, DType fp8_dtype,
                 cudaStream_t stream);

// x: contiguous 2-D [rows, cols] float32/float16/bfloat16. out: nullptr or [rows, cols];
// out_t: nullptr or [cols, rows] (the transpose, what FP8 GEMMs on Hopper need for the
// columnwise usage, docs/design.md §4); at least one of them. Other arguments as in cast_to_fp8.
void cast_transpose(const TensorRef& x, const TensorRef& scale, const TensorRef* out,
                    const TensorRef* out_t, const TensorRef& scale_inv, const TensorRef* amax,
                    DType fp8_dtype, cudaStream_t stream);

// Host references (also the host transport's implementation).
void cast_to_fp8_host(const void* x, DType x_dtype, std::size_t n, float scale, std::uint8_t* out,
                      DType fp8_dtype);
void cast_transpose_host(const void* x, DType x_dtype, std::int64_t rows, std::int64_t cols,
                         float scale, std::uint8_t* out, std::uint8_t* out_t, DType fp8_dtype);

#ifdef OVERLAP_WITH_CUDA
// Device pointers. scale, scale_inv: float32[1]; amax: float32[1] or nullptr. scale_inv and
// amax must not alias scale (NOTE [scalar aliasing] in kernel_args.h). cast_transpose runs
// the tile kernel of quantize_tiles.h.
void cast_to_fp8_cuda(const void* x, DType x_dtype, std::size_t n, const float* scale,
                      std::uint8_t* out, float* scale_inv, float* amax, DType fp8_dtype,
                      cudaStream_t stream);
#endif

}  // namespace overlap::kernels

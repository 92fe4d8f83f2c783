// transpose_fp8: out [cols, rows] = x [rows, cols]^T for one-byte elements (FP8 data).
//
// NOTE [fp8 transpose]: Hopper's FP8 GEMMs take both operands K-major (TN), so a weight
// gradient dW = dY^T X contracts over the tokens and needs dY and X as [N, T] and [K, T].
// A tensor quantized on this rank gets that layout from cast_transpose; a tensor gathered
// in FP8 (the sequence-parallel input of a column-parallel layer, the output gradient of a
// row-parallel one) arrives rowwise only, and is transposed after the gather. PyTorch's
// strided copy moves those bytes at a fraction of the memory bandwidth (one byte per thread,
// uncoalesced stores); this kernel stages 64 x 64 byte tiles in shared memory and moves
// 16-byte vectors both ways. Verdict: every FP8 weight gradient of a gathered operand uses it.
#pragma once

#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// x: contiguous 2-D [rows, cols] of uint8, float8_e4m3fn or float8_e5m2; out: contiguous
// [cols, rows] of x's dtype, not overlapping x. Host tensors run the host reference, CUDA
// tensors the kernel on `stream`.
void transpose_fp8(const TensorRef& x, const TensorRef& out, cudaStream_t stream);

// Host reference.
void transpose_bytes_host(const std::uint8_t* x, std::int64_t rows, std::int64_t cols,
                          std::uint8_t* out);

#ifdef OVERLAP_WITH_CUDA
// Device pointers; rows, cols >= 1.
void transpose_bytes_cuda(const std::uint8_t* x, std::int64_t rows, std::int64_t cols,
                          std::uint8_t* out, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

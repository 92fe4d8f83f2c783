// Dequantization of every FP8 format back to float32 / bfloat16 / float16:
// out = float(q) * scale_inv of q's tensor or block, computed in float32 and rounded once to
// out's dtype (round to nearest even).
//
// One block-scaled entry point serves all block formats, since they differ only in the block
// shape of the matrix handed in and in the scale encoding (see block_scaling.h, mxfp8.h):
//
//   format            data               block      scale_inv
//   1x128 rowwise     [rows, cols]       1 x 128    float32 [rows, ceil(cols/128)]
//   1x128 columnwise  [cols, rows]       1 x 128    float32 [cols, ceil(rows/128)]  -> x^T
//   128x128           [rows, cols] or ^T 128 x 128  float32 [ceil(../128), ceil(../128)]
//   MXFP8 rowwise     [rows, cols]       1 x 32     uint8 E8M0 [rows, cols/32]
//   MXFP8 columnwise  [rows, cols]       32 x 1     uint8 E8M0 [rows/32, cols]
//
// Columnwise 1x128 / 128x128 data is the transpose, so it dequantizes to x^T.
#pragma once

#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

// Per-tensor: data any shape, uint8 or `fp8_dtype`; scale_inv float32 with one element; out
// float32/bfloat16/float16 of data's shape.
void dequantize(const TensorRef& data, const TensorRef& scale_inv, const TensorRef& out,
                DType fp8_dtype, cudaStream_t stream);

// Block-scaled: data 2-D [R, C]; scale_inv float32 [ceil(R/block_rows), ceil(C/block_cols)]
// (partial blocks allowed) or uint8 E8M0 [R/block_rows, C/block_cols] (both must divide); out
// float32/bfloat16/float16 [R, C]. Host tensors run the host reference, CUDA tensors the
// kernel on `stream`.
void dequantize_blocks(const TensorRef& data, const TensorRef& scale_inv, const TensorRef& out,
                       DType fp8_dtype, std::int64_t block_rows, std::int64_t block_cols,
                       cudaStream_t stream);

#ifdef OVERLAP_WITH_CUDA
// Device pointers; out holds out_dtype (float32, bfloat16 or float16) elements.
void dequantize_cuda(const std::uint8_t* data, std::size_t n, const float* scale_inv, void* out,
                     DType out_dtype, DType fp8_dtype, cudaStream_t stream);
// scale_inv: float32, or E8M0 bytes when e8m0, laid out as in dequantize_blocks.
void dequantize_blocks_cuda(const std::uint8_t* data, std::int64_t rows, std::int64_t cols,
                            const void* scale_inv, bool e8m0, std::int64_t block_rows,
                            std::int64_t block_cols, void* out, DType out_dtype, DType fp8_dtype,
                            cudaStream_t stream);
#endif

}  // namespace overlap::kernels

// Block-scaled FP8 (DeepSeek-V3 style, native in cuBLASLt >= 12.9 on Hopper, as in
// TransformerEngine's Float8BlockScaling): one float32 scale per block of elements.
//
//   1x128   (activations, gradients): one scale per 128 consecutive elements of a row.
//   128x128 (weights): one scale per 128x128 tile.
//
// NOTE [block scaling layout]: x is [rows, cols]. Rowwise data is x's shape; columnwise data
// is the transpose [cols, rows] (Hopper FP8 GEMMs take both operands K-contiguous, docs/design.md
// §4) quantized with the same block shape applied to x^T:
//
//   format   direction   data          scale_inv (float32)
//   1x128    rowwise     [rows, cols]  [rows, ceil(cols/128)]
//   1x128    columnwise  [cols, rows]  [cols, ceil(rows/128)]   blocks run down x's columns
//   128x128  rowwise     [rows, cols]  [ceil(rows/128), ceil(cols/128)]
//   128x128  columnwise  [cols, rows]  [ceil(cols/128), ceil(rows/128)]  the same tiles, so
//                                      the same scales, transposed
//
// Neither dimension needs to be a multiple of 128: the last block of a row (or tile) is
// partial and its scale comes from the elements it has. The scale tensors are unpadded;
// padding to cuBLASLt's scale layout is the GEMM wrapper's job.
//
// NOTE [block scale]: scale = fp8_max / max(block_amax, epsilon), block amax 0 -> scale 1,
// power_of_2 rounds it down to a power of two; i.e. NOTE [scale convention] of
// kernels/scale.h with margin 0 (a block with inf/NaN gets scale 1). Each block stores
// scale_inv = 1 / scale; elements are fp8(x * scale).
#pragma once

#include "common/stream.h"
#include "common/tensor_ref.h"
#include "kernels/kernel_args.h"

namespace overlap::kernels {

enum class BlockShape {
  k1x128,    // 1 x 128
  k128x128,  // 128 x 128
};

constexpr std::int64_t kScaleBlock = 128;

struct BlockScalingOptions {
  bool power_of_2 = false;  // round each block's scale down to a power of two
  float epsilon = 0.0f;     // lower bound on each block's amax, finite and >= 0
};

// x: contiguous 2-D [rows, cols] float32/float16/bfloat16. Outputs per
// NOTE [block scaling layout]: data uint8 or `fp8_dtype`, scale_inv float32. Host tensors run
// the host reference; CUDA tensors the tile kernel of quantize_tiles.h on `stream`.
void quantize_block(const TensorRef& x, BlockShape shape, const QuantizedOutputs& outs,
                    DType fp8_dtype, const BlockScalingOptions& options, cudaStream_t stream);

}  // namespace overlap::kernels

// MXFP8 (OCP Microscaling Formats v1.0): blocks of 32 elements sharing one E8M0 scale.
//
// NOTE [mxfp8 scale]: per the OCP MX spec, a block's shared exponent is
//
//   shared_exp = floor(log2(block_amax)) - emax_elem      (emax_elem: 8 for e4m3, 15 for e5m2)
//
// clamped to E8M0's range [-127, 127] and stored as the byte shared_exp + 127 (scale
// 2^(byte - 127)). Elements are fp8(x / 2^shared_exp), saturating: the block's largest value
// lands in [2^emax, 2^(emax+1)), which for e4m3 can exceed 448 (it saturates), exactly as the
// spec's conversion does. TransformerEngine instead rounds the exponent up so that nothing
// saturates; the two choices of scale differ, so our bytes can differ from TE's.
// Special blocks: amax 0 -> byte 0 (elements are zeros); amax NaN -> byte 0xFF (E8M0's NaN)
// and every element NaN, as the spec says for a NaN scale; amax inf -> byte 254 (2^127) and
// the infinities saturate to +-fp8_max.
//
// NOTE [mxfp8 layout]: x is [rows, cols]. Both directions keep x's layout, as the MX GEMMs on
// Blackwell (cuBLASLt, TransformerEngine's MXFP8Tensor) consume them; only the blocks differ:
//
//   direction   data          blocks             scales (uint8 E8M0)
//   rowwise     [rows, cols]  1x32 along a row   [rows, cols/32]
//   columnwise  [rows, cols]  32x1 down a column [rows/32, cols]
//
// The blocked dimension must be a multiple of 32 (cols for rowwise, rows for columnwise);
// anything else is rejected rather than padded silently. Scales are unpadded and unswizzled.
#pragma once

#include <cstdint>

#include "common/stream.h"
#include "common/tensor_ref.h"
#include "kernels/kernel_args.h"

namespace overlap::kernels {

constexpr std::int64_t kMXBlock = 32;

// The E8M0 byte of a block with this amax (NOTE [mxfp8 scale]).
std::uint8_t mx_scale_byte(float block_amax, DType fp8_dtype);

// 2^(byte - 127); 0xFF is NaN.
float e8m0_to_float(std::uint8_t byte);

// x: contiguous 2-D [rows, cols] float32/float16/bfloat16. Outputs per NOTE [mxfp8 layout]:
// data uint8 or `fp8_dtype`, scales uint8 (torch.float8_e8m0fnu is accepted as bytes). Host
// tensors run the host reference; CUDA tensors the tile kernel of quantize_tiles.h.
void quantize_mxfp8(const TensorRef& x, const QuantizedOutputs& outs, DType fp8_dtype,
                    cudaStream_t stream);

}  // namespace overlap::kernels

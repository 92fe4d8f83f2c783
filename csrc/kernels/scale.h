// compute_scale: the FP8 scale that maps a tensor's (or a block's) amax onto the FP8 range.
//
// NOTE [scale convention]: FP8 data is q = fp8(x * scale) and x ~= float(q) * scale_inv with
// scale_inv = 1 / scale. The scale maps amax to fp8_max / 2^margin:
//
//   amax' = max(amax, epsilon)
//   scale = (fp8_max / amax') / 2^margin          (amax' == 0 -> scale 1)
//   scale = clamp(scale, FLT_MIN, FLT_MAX)        (a tiny amax must not give scale = inf)
//   power_of_2: scale = 2^floor(log2(scale))      (round down: never pushes amax past max)
//
// A non-finite amax (inf or NaN: the tensor held inf or NaN) gives scale 1, as in
// TransformerEngine's current scaling: the caller sees the NaN/inf in its amax and in the
// data (NaN stays NaN, inf saturates to +-fp8_max); the scale stays a usable number.
// Power-of-two scales make scale_inv exact (1 / 2^k = 2^-k), so dequantization is exact.
#pragma once

#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::kernels {

struct ScaleOptions {
  int margin = 0;           // headroom in powers of two, 0..127
  bool power_of_2 = false;  // round the scale down to a power of two
  float epsilon = 0.0f;     // lower bound on amax, finite and >= 0
};

// Throws kInvalidArgument naming `op` when an option is out of range.
void check_scale_options(const ScaleOptions& options, const char* op);

// The host reference of NOTE [scale convention] for one amax.
float scale_from_amax(float amax, float fp8_max, const ScaleOptions& options);

// amax, scale, scale_inv: contiguous float32 tensors with the same number of elements n
// (typically 1); scale[i] and scale_inv[i] are computed from amax[i] for `fp8_dtype`'s range.
// Host tensors run the host reference; CUDA tensors compute_scale_cuda on `stream`.
void compute_scale(const TensorRef& amax, const TensorRef& scale, const TensorRef& scale_inv,
                   DType fp8_dtype, const ScaleOptions& options, cudaStream_t stream);

#ifdef OVERLAP_WITH_CUDA
// Device pointers, n elements each; amax may alias scale or scale_inv element by element.
void compute_scale_cuda(const float* amax, float* scale, float* scale_inv, std::size_t n,
                        DType fp8_dtype, const ScaleOptions& options, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

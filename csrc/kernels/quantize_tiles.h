// The CUDA kernel behind every 2-D quantization: cast_transpose (per-tensor scale), 1x128 and
// 128x128 block scaling, and MXFP8. One launch quantizes both directions in one pass over x:
// each thread block owns a 128x128 tile of x, keeps it in registers, reduces the amaxes its
// scales need, writes the rowwise data directly and the transposed (columnwise) data through
// shared memory, with 16-byte loads and stores where the pointers and sizes allow.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/stream.h"
#include "common/tensor_ref.h"
#include "kernels/kernel_args.h"

namespace overlap::kernels {

#ifdef OVERLAP_WITH_CUDA

enum class TileScaling {
  kTensor,        // one scale for the whole tensor, read from device memory (cast_transpose)
  kBlock1x128,    // float32 scale_inv per 1x128 block of x and of x^T (block_scaling.h)
  kBlock128x128,  // float32 scale_inv per 128x128 tile (block_scaling.h)
  kMXFP8,         // E8M0 byte per 1x32 (rowwise) / 32x1 (columnwise) block (mxfp8.h)
};

// Device pointers; a direction not wanted has nullptr data. Arguments are validated by the
// dispatchers (cast.cpp, block_scaling.cpp, mxfp8.cpp) before this is called.
struct TileQuantizeArgs {
  TileScaling scaling = TileScaling::kTensor;
  const void* x = nullptr;  // [rows, cols], contiguous
  DType x_dtype = DType::kFloat32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  DType fp8_dtype = DType::kFloat8E4M3;
  std::uint8_t* rowwise = nullptr;     // [rows, cols]
  std::uint8_t* columnwise = nullptr;  // [cols, rows] (x^T); MXFP8 keeps x's layout [rows, cols]
  void* rowwise_scale_inv = nullptr;   // block formats: float32, or uint8 E8M0 for MXFP8
  void* columnwise_scale_inv = nullptr;
  bool power_of_2 = false;       // 1x128 / 128x128
  float epsilon = 0.0f;          // 1x128 / 128x128
  const float* scale = nullptr;  // kTensor: float32[1]
  float* scale_inv = nullptr;    // kTensor: float32[1], receives 1 / scale
  float* amax = nullptr;         // kTensor: float32[1] receiving max |x|, or nullptr
};

void quantize_tiles_cuda(const TileQuantizeArgs& args, cudaStream_t stream);

// The fields a block-scaled quantization's tensors give (scaling and options left default).
inline TileQuantizeArgs tile_args(const TensorRef& x, const QuantizedOutputs& outs,
                                  DType fp8_dtype) {
  auto data = [](const TensorRef* t) {
    return t != nullptr ? static_cast<std::uint8_t*>(t->data) : nullptr;
  };
  auto scales = [](const TensorRef* t) { return t != nullptr ? t->data : nullptr; };
  TileQuantizeArgs args;
  args.x = x.data;
  args.x_dtype = x.dtype;
  args.rows = x.shape[0];
  args.cols = x.shape[1];
  args.fp8_dtype = fp8_dtype;
  args.rowwise = data(outs.rowwise_data);
  args.columnwise = data(outs.columnwise_data);
  args.rowwise_scale_inv = scales(outs.rowwise_scale_inv);
  args.columnwise_scale_inv = scales(outs.columnwise_scale_inv);
  return args;
}

#endif  // OVERLAP_WITH_CUDA

}  // namespace overlap::kernels

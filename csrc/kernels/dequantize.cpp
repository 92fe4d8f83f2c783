#include "kernels/dequantize.h"

#include "common/errors.h"
#include "kernels/kernel_args.h"
#include "kernels/mxfp8.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

namespace {

void check_output(const TensorRef& out, const std::vector<std::int64_t>& shape, const char* op) {
  OVERLAP_CHECK_ARG(
      out.dtype == DType::kFloat32 || out.dtype == DType::kBFloat16 || out.dtype == DType::kFloat16,
      op << ": out must be float32, bfloat16 or float16, got " << out.describe());
  check_shape(out, shape, op, "out");
}

}  // namespace

void dequantize(const TensorRef& data, const TensorRef& scale_inv, const TensorRef& out,
                DType fp8_dtype, cudaStream_t stream) {
  constexpr const char* kOp = "dequantize";
  check_fp8_format(fp8_dtype, kOp);
  check_fp8_data(data, fp8_dtype, kOp, "data");
  check_float32_elements(scale_inv, 1, kOp, "scale_inv");
  check_output(out, data.shape, kOp);
  const int device = require_one_device(kOp, {&data, &scale_inv, &out});
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    dequantize_cuda(
        static_cast<const std::uint8_t*>(data.data), static_cast<std::size_t>(data.numel()),
        static_cast<const float*>(scale_inv.data), out.data, out.dtype, fp8_dtype, stream);
    return;
#else
    throw_no_cuda(kOp, data);
#endif
  }

  const float s_inv = *static_cast<const float*>(scale_inv.data);
  const auto* q = static_cast<const std::uint8_t*>(data.data);
  const auto n = static_cast<std::size_t>(data.numel());
  for (std::size_t i = 0; i < n; ++i) {
    store_from_float(out.data, out.dtype, i, fp8_to_float(q[i], fp8_dtype) * s_inv);
  }
}

void dequantize_blocks(const TensorRef& data, const TensorRef& scale_inv, const TensorRef& out,
                       DType fp8_dtype, std::int64_t block_rows, std::int64_t block_cols,
                       cudaStream_t stream) {
  constexpr const char* kOp = "dequantize_blocks";
  check_fp8_format(fp8_dtype, kOp);
  check_fp8_data(data, fp8_dtype, kOp, "data");
  OVERLAP_CHECK_ARG(data.shape.size() == 2,
                    kOp << ": data must be 2-D [rows, cols], got " << data.describe());
  OVERLAP_CHECK_ARG(
      block_rows >= 1 && block_cols >= 1,
      kOp << ": block shape must be positive, got " << block_rows << "x" << block_cols);
  const std::int64_t rows = data.shape[0];
  const std::int64_t cols = data.shape[1];
  const bool e8m0 = scale_inv.dtype == DType::kUInt8;
  OVERLAP_CHECK_ARG(e8m0 || scale_inv.dtype == DType::kFloat32,
                    kOp << ": scale_inv must be float32 (block FP8) or uint8 E8M0 bytes (MXFP8), "
                           "got "
                        << scale_inv.describe());
  if (e8m0) {
    // NOTE [mxfp8 layout]: MX blocks are never partial, so a ragged shape is a caller bug.
    OVERLAP_CHECK_ARG(rows % block_rows == 0 && cols % block_cols == 0,
                      kOp << ": E8M0-scaled (MXFP8) data must be a whole number of " << block_rows
                          << "x" << block_cols << " blocks, got " << data.describe());
  }
  const std::int64_t scale_cols = ceil_div(cols, block_cols);
  check_shape(scale_inv, {ceil_div(rows, block_rows), scale_cols}, kOp, "scale_inv");
  check_output(out, data.shape, kOp);
  const int device = require_one_device(kOp, {&data, &scale_inv, &out});
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    dequantize_blocks_cuda(static_cast<const std::uint8_t*>(data.data), rows, cols, scale_inv.data,
                           e8m0, block_rows, block_cols, out.data, out.dtype, fp8_dtype, stream);
    return;
#else
    throw_no_cuda(kOp, data);
#endif
  }

  const auto* q = static_cast<const std::uint8_t*>(data.data);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t s = (r / block_rows) * scale_cols + c / block_cols;
      const float s_inv = e8m0 ? e8m0_to_float(static_cast<const std::uint8_t*>(scale_inv.data)[s])
                               : static_cast<const float*>(scale_inv.data)[s];
      const auto i = static_cast<std::size_t>(r * cols + c);
      store_from_float(out.data, out.dtype, i, fp8_to_float(q[i], fp8_dtype) * s_inv);
    }
  }
}

}  // namespace overlap::kernels

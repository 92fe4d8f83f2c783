#include "kernels/mxfp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/errors.h"
#include "kernels/block_quantize_host.h"
#include "kernels/quantize_tiles.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

namespace {

// The largest power of two an element format holds: e4m3 448 = 1.75 * 2^8, e5m2 57344 =
// 1.75 * 2^15.
int emax_elem(DType fp8_dtype) {
  return fp8_dtype == DType::kFloat8E4M3 ? 8 : 15;
}

constexpr std::uint8_t kE8M0NaN = 0xFF;
constexpr int kE8M0Bias = 127;

void check_scale_tensor(const TensorRef& s, const std::vector<std::int64_t>& shape, const char* op,
                        const char* what) {
  OVERLAP_CHECK_ARG(s.dtype == DType::kUInt8,
                    op << ": " << what
                       << " must be uint8 (or torch.float8_e8m0fnu) E8M0 exponent bytes, got "
                       << s.describe());
  check_shape(s, shape, op, what);
}

}  // namespace

std::uint8_t mx_scale_byte(float block_amax, DType fp8_dtype) {
  if (std::isnan(block_amax)) return kE8M0NaN;
  if (block_amax == 0.0f) return 0;                  // log2(0) = -inf: clamped low
  if (std::isinf(block_amax)) return 2 * kE8M0Bias;  // log2(inf) = inf: clamped high
  // ilogb is floor(log2(|x|)) exactly, subnormals included.
  const int shared_exp =
      std::clamp(std::ilogb(block_amax) - emax_elem(fp8_dtype), -kE8M0Bias, kE8M0Bias);
  return static_cast<std::uint8_t>(shared_exp + kE8M0Bias);
}

float e8m0_to_float(std::uint8_t byte) {
  if (byte == kE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(byte) - kE8M0Bias);
}

void quantize_mxfp8(const TensorRef& x, const QuantizedOutputs& outs, DType fp8_dtype,
                    cudaStream_t stream) {
  constexpr const char* kOp = "quantize_mxfp8";
  check_fp8_format(fp8_dtype, kOp);
  check_float_matrix(x, kOp, "x");
  const auto [rowwise, columnwise] = check_output_pairs(outs, kOp);
  const std::int64_t rows = x.shape[0];
  const std::int64_t cols = x.shape[1];
  if (rowwise) {
    OVERLAP_CHECK_ARG(cols % kMXBlock == 0,
                      kOp << ": rowwise MXFP8 uses 1x32 blocks along rows, so cols must be a "
                             "multiple of 32; got x "
                          << x.describe() << " (cols = " << cols
                          << "); pad cols to a multiple of 32 or use another format");
    check_fp8_data(*outs.rowwise_data, fp8_dtype, kOp, "rowwise_data");
    check_shape(*outs.rowwise_data, {rows, cols}, kOp, "rowwise_data");
    check_scale_tensor(*outs.rowwise_scale_inv, {rows, cols / kMXBlock}, kOp, "rowwise_scale_inv");
  }
  if (columnwise) {
    OVERLAP_CHECK_ARG(rows % kMXBlock == 0,
                      kOp << ": columnwise MXFP8 uses 32x1 blocks down columns, so rows must be "
                             "a multiple of 32; got x "
                          << x.describe() << " (rows = " << rows
                          << "); pad rows to a multiple of 32 or use another format");
    check_fp8_data(*outs.columnwise_data, fp8_dtype, kOp, "columnwise_data");
    check_shape(*outs.columnwise_data, {rows, cols}, kOp,
                "columnwise_data (x's layout, not transposed)");
    check_scale_tensor(*outs.columnwise_scale_inv, {rows / kMXBlock, cols}, kOp,
                       "columnwise_scale_inv");
  }
  const int device = require_one_device(kOp, {&x, outs.rowwise_data, outs.rowwise_scale_inv,
                                              outs.columnwise_data, outs.columnwise_scale_inv});
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    TileQuantizeArgs args = tile_args(x, outs, fp8_dtype);
    args.scaling = TileScaling::kMXFP8;
    quantize_tiles_cuda(args, stream);
    return;
#else
    throw_no_cuda(kOp, x);
#endif
  }

  auto run = [&](const TensorRef& data, const TensorRef& scales, std::int64_t block_rows,
                 std::int64_t block_cols) {
    detail::BlockQuantizeView view;
    view.x = x.data;
    view.x_dtype = x.dtype;
    view.rows = rows;
    view.cols = cols;
    view.block_rows = block_rows;
    view.block_cols = block_cols;
    const std::int64_t scale_cols = cols / block_cols;
    auto* bytes = static_cast<std::uint8_t*>(scales.data);
    detail::quantize_blocks_host(view, static_cast<std::uint8_t*>(data.data), fp8_dtype,
                                 [&](std::int64_t br, std::int64_t bc, float amax) {
                                   const std::uint8_t byte = mx_scale_byte(amax, fp8_dtype);
                                   bytes[br * scale_cols + bc] = byte;
                                   // x / 2^e == x * 2^-e: one rounding of the same value.
                                   // A NaN scale makes every element NaN (OCP MX).
                                   return 1.0f / e8m0_to_float(byte);
                                 });
  };
  if (rowwise) run(*outs.rowwise_data, *outs.rowwise_scale_inv, 1, kMXBlock);
  if (columnwise) run(*outs.columnwise_data, *outs.columnwise_scale_inv, kMXBlock, 1);
}

}  // namespace overlap::kernels

#include "kernels/block_scaling.h"

#include "common/errors.h"
#include "kernels/block_quantize_host.h"
#include "kernels/quantize_tiles.h"
#include "kernels/scale.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

namespace {

// One direction (x or x^T) quantized into `data` with float32 scale_inv per block.
void quantize_direction(const TensorRef& x, bool transpose, BlockShape shape, const TensorRef& data,
                        const TensorRef& scale_inv, DType fp8_dtype,
                        const BlockScalingOptions& options) {
  detail::BlockQuantizeView view;
  view.x = x.data;
  view.x_dtype = x.dtype;
  view.rows = x.shape[0];
  view.cols = x.shape[1];
  view.transpose = transpose;
  view.block_rows = shape == BlockShape::k128x128 ? kScaleBlock : 1;
  view.block_cols = kScaleBlock;
  const std::int64_t vc = transpose ? view.rows : view.cols;
  const std::int64_t scale_cols = ceil_div(vc, view.block_cols);

  ScaleOptions scale_options;
  scale_options.power_of_2 = options.power_of_2;
  scale_options.epsilon = options.epsilon;
  const float fp8_max = fp8_max_value(fp8_dtype);
  auto* s_inv = static_cast<float*>(scale_inv.data);
  detail::quantize_blocks_host(view, static_cast<std::uint8_t*>(data.data), fp8_dtype,
                               [&](std::int64_t br, std::int64_t bc, float amax) {
                                 const float scale = scale_from_amax(amax, fp8_max, scale_options);
                                 s_inv[br * scale_cols + bc] = 1.0f / scale;
                                 return scale;
                               });
}

}  // namespace

void quantize_block(const TensorRef& x, BlockShape shape, const QuantizedOutputs& outs,
                    DType fp8_dtype, const BlockScalingOptions& options, cudaStream_t stream) {
  const char* op = shape == BlockShape::k1x128 ? "quantize_block_1x128" : "quantize_block_128x128";
  check_fp8_format(fp8_dtype, op);
  check_float_matrix(x, op, "x");
  ScaleOptions scale_options;
  scale_options.epsilon = options.epsilon;
  check_scale_options(scale_options, op);
  const auto [rowwise, columnwise] = check_output_pairs(outs, op);

  const std::int64_t rows = x.shape[0];
  const std::int64_t cols = x.shape[1];
  const std::int64_t block_rows = shape == BlockShape::k128x128 ? kScaleBlock : 1;
  if (rowwise) {
    check_fp8_data(*outs.rowwise_data, fp8_dtype, op, "rowwise_data");
    check_shape(*outs.rowwise_data, {rows, cols}, op, "rowwise_data");
    OVERLAP_CHECK_ARG(
        outs.rowwise_scale_inv->dtype == DType::kFloat32,
        op << ": rowwise_scale_inv must be float32, got " << outs.rowwise_scale_inv->describe());
    check_shape(*outs.rowwise_scale_inv, {ceil_div(rows, block_rows), ceil_div(cols, kScaleBlock)},
                op, "rowwise_scale_inv");
  }
  if (columnwise) {
    check_fp8_data(*outs.columnwise_data, fp8_dtype, op, "columnwise_data");
    check_shape(*outs.columnwise_data, {cols, rows}, op, "columnwise_data (x transposed)");
    OVERLAP_CHECK_ARG(outs.columnwise_scale_inv->dtype == DType::kFloat32,
                      op << ": columnwise_scale_inv must be float32, got "
                         << outs.columnwise_scale_inv->describe());
    check_shape(*outs.columnwise_scale_inv,
                {ceil_div(cols, block_rows), ceil_div(rows, kScaleBlock)}, op,
                "columnwise_scale_inv");
  }
  const int device = require_one_device(op, {&x, outs.rowwise_data, outs.rowwise_scale_inv,
                                             outs.columnwise_data, outs.columnwise_scale_inv});
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    TileQuantizeArgs args = tile_args(x, outs, fp8_dtype);
    args.scaling =
        shape == BlockShape::k1x128 ? TileScaling::kBlock1x128 : TileScaling::kBlock128x128;
    args.power_of_2 = options.power_of_2;
    args.epsilon = options.epsilon;
    quantize_tiles_cuda(args, stream);
    return;
#else
    throw_no_cuda(op, x);
#endif
  }

  if (rowwise) {
    quantize_direction(x, false, shape, *outs.rowwise_data, *outs.rowwise_scale_inv, fp8_dtype,
                       options);
  }
  if (columnwise) {
    quantize_direction(x, true, shape, *outs.columnwise_data, *outs.columnwise_scale_inv, fp8_dtype,
                       options);
  }
}

}  // namespace overlap::kernels

#include "kernels/cast.h"

#include "common/errors.h"
#include "kernels/amax.h"
#include "kernels/kernel_args.h"
#include "kernels/quantize_tiles.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

void cast_to_fp8_host(const void* x, DType x_dtype, std::size_t n, float scale, std::uint8_t* out,
                      DType fp8_dtype) {
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = float_to_fp8(load_as_float(x, x_dtype, i) * scale, fp8_dtype);
  }
}

void cast_transpose_host(const void* x, DType x_dtype, std::int64_t rows, std::int64_t cols,
                         float scale, std::uint8_t* out, std::uint8_t* out_t, DType fp8_dtype) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      const std::uint8_t q = float_to_fp8(load_as_float(x, x_dtype, i) * scale, fp8_dtype);
      if (out != nullptr) out[i] = q;
      // Both directions hold the same bytes: the columnwise copy is an exact transpose.
      if (out_t != nullptr) out_t[c * rows + r] = q;
    }
  }
}

namespace {

// Checks shared by both casts.
void check_scale_args(const TensorRef& scale, const TensorRef& scale_inv, const TensorRef* amax,
                      const char* op) {
  check_float32_elements(scale, 1, op, "scale");
  check_float32_elements(scale_inv, 1, op, "scale_inv");
  if (amax != nullptr) check_float32_elements(*amax, 1, op, "amax");
}

// NOTE [scalar aliasing] (kernel_args.h), for CUDA tensors.
void check_scales_disjoint(const TensorRef& scale, const TensorRef& scale_inv,
                           const TensorRef* amax, const char* op) {
  check_disjoint(op, scale, "scale", &scale_inv, "scale_inv");
  check_disjoint(op, scale, "scale", amax, "amax");
  check_disjoint(op, scale_inv, "scale_inv", amax, "amax");
}

float* float_ptr(const TensorRef* t) {
  return t != nullptr ? static_cast<float*>(t->data) : nullptr;
}

// Reads the scale first: scale_inv or amax may alias it.
void finish_scales(const TensorRef& x, const TensorRef& scale, const TensorRef& scale_inv,
                   const TensorRef* amax) {
  const float s = *static_cast<const float*>(scale.data);
  const float x_amax =
      amax != nullptr ? amax_host(x.data, x.dtype, static_cast<std::size_t>(x.numel())) : 0.0f;
  *static_cast<float*>(scale_inv.data) = 1.0f / s;
  if (amax != nullptr) *static_cast<float*>(amax->data) = x_amax;
}

}  // namespace

void cast_to_fp8(const TensorRef& x, const TensorRef& scale, const TensorRef& out,
                 const TensorRef& scale_inv, const TensorRef* amax, DType fp8_dtype,
                 cudaStream_t stream) {
  constexpr const char* kOp = "cast_to_fp8";
  check_fp8_format(fp8_dtype, kOp);
  check_float_input(x, kOp, "x");
  check_fp8_data(out, fp8_dtype, kOp, "out");
  check_shape(out, x.shape, kOp, "out");
  check_scale_args(scale, scale_inv, amax, kOp);
  const int device = require_one_device(kOp, {&x, &scale, &out, &scale_inv, amax});
  if (device >= 0) {
    check_scales_disjoint(scale, scale_inv, amax, kOp);
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    cast_to_fp8_cuda(x.data, x.dtype, static_cast<std::size_t>(x.numel()),
                     static_cast<const float*>(scale.data), static_cast<std::uint8_t*>(out.data),
                     static_cast<float*>(scale_inv.data), float_ptr(amax), fp8_dtype, stream);
    return;
#else
    throw_no_cuda(kOp, x);
#endif
  }

  const float s = *static_cast<const float*>(scale.data);
  cast_to_fp8_host(x.data, x.dtype, static_cast<std::size_t>(x.numel()), s,
                   static_cast<std::uint8_t*>(out.data), fp8_dtype);
  finish_scales(x, scale, scale_inv, amax);
}

void cast_transpose(const TensorRef& x, const TensorRef& scale, const TensorRef* out,
                    const TensorRef* out_t, const TensorRef& scale_inv, const TensorRef* amax,
                    DType fp8_dtype, cudaStream_t stream) {
  constexpr const char* kOp = "cast_transpose";
  check_fp8_format(fp8_dtype, kOp);
  check_float_matrix(x, kOp, "x");
  OVERLAP_CHECK_ARG(out != nullptr || out_t != nullptr,
                    kOp << ": give out (rowwise), out_t (columnwise) or both; got neither");
  const std::int64_t rows = x.shape[0];
  const std::int64_t cols = x.shape[1];
  if (out != nullptr) {
    check_fp8_data(*out, fp8_dtype, kOp, "out");
    check_shape(*out, {rows, cols}, kOp, "out");
  }
  if (out_t != nullptr) {
    check_fp8_data(*out_t, fp8_dtype, kOp, "out_t");
    check_shape(*out_t, {cols, rows}, kOp, "out_t (the transpose of x)");
  }
  check_scale_args(scale, scale_inv, amax, kOp);
  const int device = require_one_device(kOp, {&x, &scale, out, out_t, &scale_inv, amax});
  if (device >= 0) {
    check_scales_disjoint(scale, scale_inv, amax, kOp);
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    TileQuantizeArgs args;
    args.scaling = TileScaling::kTensor;
    args.x = x.data;
    args.x_dtype = x.dtype;
    args.rows = rows;
    args.cols = cols;
    args.fp8_dtype = fp8_dtype;
    args.rowwise = out ? static_cast<std::uint8_t*>(out->data) : nullptr;
    args.columnwise = out_t ? static_cast<std::uint8_t*>(out_t->data) : nullptr;
    args.scale = static_cast<const float*>(scale.data);
    args.scale_inv = static_cast<float*>(scale_inv.data);
    args.amax = float_ptr(amax);
    quantize_tiles_cuda(args, stream);
    return;
#else
    throw_no_cuda(kOp, x);
#endif
  }

  const float s = *static_cast<const float*>(scale.data);
  cast_transpose_host(x.data, x.dtype, rows, cols, s,
                      out ? static_cast<std::uint8_t*>(out->data) : nullptr,
                      out_t ? static_cast<std::uint8_t*>(out_t->data) : nullptr, fp8_dtype);
  finish_scales(x, scale, scale_inv, amax);
}

}  // namespace overlap::kernels

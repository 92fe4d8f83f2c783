#include "kernels/transpose.h"

#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "kernels/kernel_args.h"

#ifdef OVERLAP_WITH_CUDA
#include "common/cuda/device_guard.h"
#endif

namespace overlap::kernels {

void transpose_bytes_host(const std::uint8_t* x, std::int64_t rows, std::int64_t cols,
                          std::uint8_t* out) {
  // Blocks of 64 x 64 keep both sides' lines in cache (CI runs the layers on the host).
  constexpr std::int64_t kB = 64;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kB) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kB) {
      const std::int64_t r1 = r0 + kB < rows ? r0 + kB : rows;
      const std::int64_t c1 = c0 + kB < cols ? c0 + kB : cols;
      for (std::int64_t c = c0; c < c1; ++c) {
        for (std::int64_t r = r0; r < r1; ++r) out[c * rows + r] = x[r * cols + c];
      }
    }
  }
}

void transpose_fp8(const TensorRef& x, const TensorRef& out, cudaStream_t stream) {
  constexpr const char* kOp = "transpose_fp8";
  OVERLAP_CHECK_ARG(
      x.dtype == DType::kUInt8 || dtype_is_fp8(x.dtype),
      kOp << ": x must be uint8, float8_e4m3fn or float8_e5m2 (FP8 data), got " << x.describe());
  OVERLAP_CHECK_ARG(x.shape.size() == 2,
                    kOp << ": x must be 2-D [rows, cols], got " << x.describe());
  OVERLAP_CHECK_ARG(x.is_contiguous(), kOp << ": x must be contiguous, got " << x.describe()
                                           << " with strides " << shape_string(x.strides));
  OVERLAP_CHECK_ARG(out.dtype == x.dtype, kOp << ": out must have x's dtype " << dtype_name(x.dtype)
                                              << ", got " << out.describe());
  const std::int64_t rows = x.shape[0];
  const std::int64_t cols = x.shape[1];
  const int device = require_one_device(kOp, {&x, &out});
  if (x.numel() == 0) {  // an empty tensor's strides say nothing: its shape is all there is
    OVERLAP_CHECK_ARG(
        out.shape == (std::vector<std::int64_t>{cols, rows}),
        kOp << ": out must have shape [" << cols << ", " << rows << "], got " << out.describe());
    return;
  }
  check_shape(out, {cols, rows}, kOp, "out (the transpose of x)");
  const auto x0 = reinterpret_cast<std::uintptr_t>(x.data);
  const auto o0 = reinterpret_cast<std::uintptr_t>(out.data);
  OVERLAP_CHECK_ARG(x0 + x.nbytes() <= o0 || o0 + out.nbytes() <= x0,
                    kOp << ": out must not share memory with x (a transpose is not done in "
                           "place); pass a separate output tensor");
  const auto* src = static_cast<const std::uint8_t*>(x.data);
  auto* dst = static_cast<std::uint8_t*>(out.data);
  if (device >= 0) {
#ifdef OVERLAP_WITH_CUDA
    DeviceGuard guard(device);
    transpose_bytes_cuda(src, rows, cols, dst, stream);
    return;
#else
    throw_no_cuda(kOp, x);
#endif
  }
  transpose_bytes_host(src, rows, cols, dst);
}

}  // namespace overlap::kernels

// The host reference shared by every block-scaled format (1x128, 128x128, MXFP8 1x32/32x1).
//
// NOTE [block traversal]: the quantized matrix V is either x [rows, cols] or its transpose
// x^T [cols, rows] (`transpose`), never a copy: V(r, c) reads x directly. V is cut into
// blocks of block_rows x block_cols; the blocks of the last block row/column may be partial
// (the caller decides whether it allows that). For each block, amax is taken over the
// elements that exist (NaN propagates), `scale_for_block(block_r, block_c, amax)` turns it
// into the multiplier applied before the FP8 cast (and stores the block's scale_inv itself,
// in whatever encoding its format uses), and every element becomes fp8(V(r, c) * multiplier).
// out is V's shape, row-major.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/dtype.h"

namespace overlap::kernels::detail {

struct BlockQuantizeView {
  const void* x = nullptr;
  DType x_dtype = DType::kFloat32;
  std::int64_t rows = 0;  // of x
  std::int64_t cols = 0;  // of x
  bool transpose = false;
  std::int64_t block_rows = 1;  // of V
  std::int64_t block_cols = 1;  // of V
};

template <typename ScaleForBlock>
void quantize_blocks_host(const BlockQuantizeView& v, std::uint8_t* out, DType fp8_dtype,
                          ScaleForBlock&& scale_for_block) {
  const std::int64_t vr = v.transpose ? v.cols : v.rows;
  const std::int64_t vc = v.transpose ? v.rows : v.cols;
  auto load = [&](std::int64_t r, std::int64_t c) {
    const std::int64_t i = v.transpose ? c * v.cols + r : r * v.cols + c;
    return load_as_float(v.x, v.x_dtype, static_cast<std::size_t>(i));
  };
  for (std::int64_t r0 = 0; r0 < vr; r0 += v.block_rows) {
    const std::int64_t r1 = std::min(r0 + v.block_rows, vr);
    for (std::int64_t c0 = 0; c0 < vc; c0 += v.block_cols) {
      const std::int64_t c1 = std::min(c0 + v.block_cols, vc);
      float amax = 0.0f;
      bool has_nan = false;
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          const float a = std::fabs(load(r, c));
          has_nan |= std::isnan(a);
          amax = a > amax ? a : amax;
        }
      }
      if (has_nan) amax = std::numeric_limits<float>::quiet_NaN();
      const float multiplier = scale_for_block(r0 / v.block_rows, c0 / v.block_cols, amax);
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          out[r * vc + c] = float_to_fp8(load(r, c) * multiplier, fp8_dtype);
        }
      }
    }
  }
}

}  // namespace overlap::kernels::detail

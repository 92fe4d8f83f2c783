// The FP8 transpose kernels (NOTE [fp8 transpose] in transpose.h).
//
// Vector path (rows and cols multiples of 16, both pointers 16-byte aligned): a block of 256
// threads owns a 64 x 64 byte tile. Four threads load one row of it as four 16-byte vectors
// (64 contiguous bytes) into shared memory; four threads then build one row of out^T (64
// contiguous bytes) from 16 bytes of a tile column each and store them as 16-byte vectors.
// The tile's rows are 17 words apart, so a warp's column reads fall on distinct banks but for
// the pair of row groups 32 rows apart (a 2-way conflict on shared memory, which is not the
// bound: HBM is). Any other shape or alignment takes the byte path: 32 x 32 tiles, one byte
// per thread each way.
#include <cstdint>

#include "common/cuda/cuda_check.h"
#include "kernels/transpose.h"

namespace overlap::kernels {

namespace {

constexpr int kTile = 64;  // bytes per side of the vector path's tile
constexpr int kWords = kTile / 4;
constexpr int kThreads = 256;  // 4 threads per tile row, 64 rows
constexpr int kByteTile = 32;  // the byte path's tile
constexpr int kByteRows = 8;   // its block: 32 x 8 threads, 4 rows each

__global__ void __launch_bounds__(kThreads)
    transpose_vec16(const std::uint8_t* __restrict__ x, std::int64_t rows, std::int64_t cols,
                    std::int64_t tiles_c, std::uint8_t* __restrict__ out) {
  __shared__ std::uint32_t tile[kTile][kWords + 1];
  const std::int64_t r0 = (static_cast<std::int64_t>(blockIdx.x) / tiles_c) * kTile;
  const std::int64_t c0 = (static_cast<std::int64_t>(blockIdx.x) % tiles_c) * kTile;
  const int t = static_cast<int>(threadIdx.x);
  {
    const int lr = t >> 2;
    const int lw = (t & 3) * 4;
    const std::int64_t r = r0 + lr;
    const std::int64_t c = c0 + lw * 4;
    if (r < rows && c < cols) {
      const uint4 v = *reinterpret_cast<const uint4*>(x + r * cols + c);
      tile[lr][lw] = v.x;
      tile[lr][lw + 1] = v.y;
      tile[lr][lw + 2] = v.z;
      tile[lr][lw + 3] = v.w;
    }
  }
  __syncthreads();
  const int oc = t >> 2;        // a column of the tile: a row of out
  const int rc = (t & 3) * 16;  // 16 rows of the tile: 16 bytes of that row of out
  if (c0 + oc >= cols || r0 + rc >= rows) return;
  const int word = oc >> 2;
  const int shift = 8 * (oc & 3);
  std::uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    std::uint32_t acc = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      acc |= ((tile[rc + 4 * k + b][word] >> shift) & 0xffu) << (8 * b);
    }
    w[k] = acc;
  }
  *reinterpret_cast<uint4*>(out + (c0 + oc) * rows + r0 + rc) = make_uint4(w[0], w[1], w[2], w[3]);
}

__global__ void __launch_bounds__(kByteTile* kByteRows)
    transpose_bytes(const std::uint8_t* __restrict__ x, std::int64_t rows, std::int64_t cols,
                    std::int64_t tiles_c, std::uint8_t* __restrict__ out) {
  __shared__ std::uint8_t tile[kByteTile][kByteTile + 1];
  const std::int64_t r0 = (static_cast<std::int64_t>(blockIdx.x) / tiles_c) * kByteTile;
  const std::int64_t c0 = (static_cast<std::int64_t>(blockIdx.x) % tiles_c) * kByteTile;
  const int tx = static_cast<int>(threadIdx.x);
  const int ty = static_cast<int>(threadIdx.y);
  for (int j = ty; j < kByteTile; j += kByteRows) {
    const std::int64_t r = r0 + j;
    const std::int64_t c = c0 + tx;
    if (r < rows && c < cols) tile[j][tx] = x[r * cols + c];
  }
  __syncthreads();
  for (int j = ty; j < kByteTile; j += kByteRows) {
    const std::int64_t oc = c0 + j;    // a row of out
    const std::int64_t orr = r0 + tx;  // a column of out
    if (oc < cols && orr < rows) out[oc * rows + orr] = tile[tx][j];
  }
}

}  // namespace

void transpose_bytes_cuda(const std::uint8_t* x, std::int64_t rows, std::int64_t cols,
                          std::uint8_t* out, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  if (aligned && rows % 16 == 0 && cols % 16 == 0) {
    const std::int64_t tiles_c = (cols + kTile - 1) / kTile;
    const std::int64_t tiles = ((rows + kTile - 1) / kTile) * tiles_c;
    OVERLAP_CHECK(tiles <= 0x7fffffff, kInvalidArgument,
                  "transpose_fp8: " << rows << " x " << cols << " bytes is too large");
    transpose_vec16<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(x, rows, cols, tiles_c,
                                                                           out);
    OVERLAP_CHECK_LAUNCH("transpose_vec16");
    return;
  }
  const std::int64_t tiles_c = (cols + kByteTile - 1) / kByteTile;
  const std::int64_t tiles = ((rows + kByteTile - 1) / kByteTile) * tiles_c;
  OVERLAP_CHECK(tiles <= 0x7fffffff, kInvalidArgument,
                "transpose_fp8: " << rows << " x " << cols << " bytes is too large");
  transpose_bytes<<<static_cast<unsigned>(tiles), dim3(kByteTile, kByteRows), 0, stream>>>(
      x, rows, cols, tiles_c, out);
  OVERLAP_CHECK_LAUNCH("transpose_bytes");
}

}  // namespace overlap::kernels

// The tile quantization kernel (see quantize_tiles.h).
//
// NOTE [tile layout]: a block of 256 threads owns the 128x128 tile of x at (r0, c0). A row of
// the tile is kTPR = 128 / kVec threads, each holding one 16-byte vector (kVec elements:
// 8 bf16/fp16 or 4 fp32); the block covers kRP = 256 / kTPR rows per pass and kPasses passes
// (8 for 16-bit inputs, 16 for fp32), all loaded before any arithmetic so that every load of
// the tile is in flight at once. Thread t holds rows tr + kRP * i, columns [tc, tc + kVec).
//
//   rowwise block amax (1x128, 1x32)  shuffles among the threads of a row (lanes of one warp)
//   columnwise block amax (128x1 of x^T, 32x1)  per-thread max over its passes, a shuffle
//                                      between the rows of a warp, then shared memory over warps
//   128x128 tile amax                  a block reduction
//
// Every scale is computed by the same device functions as the host reference's
// (NOTE [bit-exact kernels]); elements are fp8(x * multiplier) with __fmul_rn.
//
// NOTE [transpose tile]: the transposed bytes go through a 128 x kPitch byte tile in shared
// memory, written in x's layout (row of the tile, column bytes). Each thread then reads a 16 x 4
// byte block (16 rows, 4 adjacent columns) as sixteen 32-bit words, transposes it in registers
// with byte permutes (4x4 blocks, transpose_4x4) and stores four 16-byte vectors of out^T, one
// per column: 16 shared loads and 4 global stores for 64 bytes. Warp w takes column groups
// 16 * (w % 2) + m (m = lane / 2) and 16-row chunks 2 * (w / 2) + lane % 2: the two lanes of a
// pair take the same columns and adjacent chunks, so their stores fill whole 32-byte sectors,
// and a warp's load of one word reads 16 consecutive words from two rows 16 apart: with
// kPitch = 132, 16 rows are 528 words = 16 banks apart, so the loads are free of bank
// conflicts.
#include "kernels/device_utils.cuh"
#include "kernels/quantize_tiles.h"

namespace overlap::kernels {

namespace {

using device::abs_bits;
using device::element;
using device::kFullMask;
using device::reciprocal;

constexpr int kTile = 128;
constexpr int kThreads = 256;
constexpr int kPitch = kTile + 4;
constexpr int kMXBlockLen = 32;

static_assert(kThreads == 2 * kTile, "NOTE [transpose tile] pairs two lanes per column");

struct TileParams {
  const void* x;
  std::int64_t rows, cols;
  std::int64_t tiles_r, tiles_c, num_tiles;
  std::uint8_t* row_data;
  std::uint8_t* col_data;
  void* row_scale;
  void* col_scale;
  const float* scale;
  float* scale_inv;
  unsigned* amax;
  bool x_vec;    // x 16-byte aligned and cols % kVec == 0
  bool row_vec;  // row_data aligned to kVec bytes and cols % kVec == 0
  bool col_vec;  // transposed: col_data 16-byte aligned, rows % 16 == 0; MXFP8: as row_vec
  bool power_of_2;
  float epsilon;
};

// kVec bytes (packed in words) into row r of a [rows, cols] byte matrix at column cg.
template <int kVec>
__device__ __forceinline__ void store_row_bytes(std::uint8_t* base, std::int64_t r, std::int64_t cg,
                                                const TileParams& p, bool vec,
                                                const std::uint32_t (&w)[kVec / 4]) {
  std::uint8_t* dst = base + r * p.cols + cg;
  if (vec) {
    if (cg < p.cols) device::store_words<kVec / 4>(dst, w);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (cg + j < p.cols) dst[j] = device::byte_of(w, j);
    }
  }
}

// In place: a[i] holds bytes (i, 0..3) of a 4x4 byte block (byte j of a[i] is column j of
// row i); afterwards a[j] holds column j, rows 0..3 in bytes 0..3.
__device__ __forceinline__ void transpose_4x4(std::uint32_t (&a)[4]) {
  const std::uint32_t t0 = __byte_perm(a[0], a[1], 0x5140);  // a0c0 a1c0 a0c1 a1c1
  const std::uint32_t t1 = __byte_perm(a[0], a[1], 0x7362);  // a0c2 a1c2 a0c3 a1c3
  const std::uint32_t t2 = __byte_perm(a[2], a[3], 0x5140);  // a2c0 a3c0 a2c1 a3c1
  const std::uint32_t t3 = __byte_perm(a[2], a[3], 0x7362);  // a2c2 a3c2 a2c3 a3c3
  a[0] = __byte_perm(t0, t2, 0x5410);
  a[1] = __byte_perm(t0, t2, 0x7632);
  a[2] = __byte_perm(t1, t3, 0x5410);
  a[3] = __byte_perm(t1, t3, 0x7632);
}

// NOTE [tile occupancy]: resident blocks per SM asked of ptxas (__launch_bounds__), which caps
// the registers at 65536 / (256 * blocks): every resident block keeps its whole tile's loads in
// flight at once, so more blocks per SM are more bytes in flight. For 16-bit inputs the tile
// is 32 registers a thread: per-tensor scaling fits 48 registers (5 blocks, no spills), the
// 1x128 / 128x128 formats 64 (4 blocks), MXFP8 80 (3 blocks, as unbounded: 2 would let ptxas
// take 84); fp32 inputs (64 registers of tile) 128 (2 blocks, as unbounded). ptxas -v shows
// the effect (the aim: the largest count without more than a few bytes of spills).
template <typename T, TileScaling kMode>
constexpr int tile_min_blocks() {
  if constexpr (sizeof(T) != 2) return 2;
  if constexpr (kMode == TileScaling::kMXFP8) return 3;
  return kMode == TileScaling::kTensor ? 5 : 4;
}

template <typename T, DType kFmt, TileScaling kMode>
__global__ void __launch_bounds__(kThreads, (tile_min_blocks<T, kMode>()))
    quantize_tile_kernel(const TileParams p) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kWords = kVec / 4;
  constexpr int kTPR = kTile / kVec;
  constexpr int kRP = kThreads / kTPR;
  constexpr int kPasses = kTile / kRP;
  constexpr bool kMX = kMode == TileScaling::kMXFP8;
  constexpr bool kPerBlock = kMode == TileScaling::kBlock1x128 || kMX;  // row/column blocks
  constexpr bool kTransposed = !kMX;
  constexpr int kRowBlockLanes = (kMX ? kMXBlockLen : kTile) / kVec;
  constexpr int kColGroups = kMX ? kTile / kMXBlockLen : 1;  // column blocks per tile column
  constexpr int kPassesPerGroup = kPasses / kColGroups;
  constexpr int kWarps = kThreads / 32;
  constexpr float kFp8Max = device::fp8_max<kFmt>();
  static_assert(kTPR <= 32 && kPasses % kColGroups == 0, "tile geometry");

  __shared__ std::uint32_t tile_t[kTransposed ? kTile * kPitch / 4 : 1];
  __shared__ unsigned col_red[kPerBlock ? kWarps * kColGroups * kTile : 1];
  __shared__ float col_mult[kPerBlock ? kColGroups * kTile : 1];
  constexpr bool kTensorScale = kMode == TileScaling::kTensor;
  __shared__ unsigned warp_amax[kTensorScale ? kWarps : 1];

  if constexpr (kTensorScale) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = reciprocal(*p.scale);
  }
  if (blockIdx.x >= p.num_tiles) return;  // an empty tensor: only scale_inv to write

  const std::int64_t tile_r = blockIdx.x / p.tiles_c;
  const std::int64_t tile_c = blockIdx.x % p.tiles_c;
  const std::int64_t r0 = tile_r * kTile;
  const std::int64_t c0 = tile_c * kTile;
  const int tr = threadIdx.x / kTPR;
  const int tc = (threadIdx.x % kTPR) * kVec;
  const std::int64_t cg = c0 + tc;
  const T* x = static_cast<const T*>(p.x);
  const bool want_row = p.row_data != nullptr;
  const bool want_col = p.col_data != nullptr;

  // 1. The whole tile into registers (zeros outside x).
  uint4 raw[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const std::int64_t r = r0 + tr + kRP * i;
    raw[i] = make_uint4(0u, 0u, 0u, 0u);
    if (r < p.rows && cg < p.cols) {
      const T* src = x + r * p.cols + cg;
      if (p.x_vec) {
        raw[i] = *reinterpret_cast<const uint4*>(src);
      } else {
        const std::int64_t left = p.cols - cg;
        raw[i] = device::load_partial(src, left < kVec ? static_cast<int>(left) : kVec);
      }
    }
  }

  // 2. Scales.
  float row_mult[kPerBlock ? kPasses : 1];
  float tile_mult = 1.0f;
  if constexpr (kPerBlock) {
    if (want_row) {
      unsigned row_amax[kMX ? 1 : kPasses];  // per pass: the amax of this row's block
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        unsigned m = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) m = max(m, abs_bits(element<T>(raw[i], j)));
#pragma unroll
        for (int o = 1; o < kRowBlockLanes; o *= 2) m = max(m, __shfl_xor_sync(kFullMask, m, o));
        if constexpr (kMX) {
          const std::uint8_t byte = device::mx_scale_byte<kFmt>(__uint_as_float(m));
          row_mult[i] = reciprocal(device::e8m0_to_float(byte));
          const std::int64_t r = r0 + tr + kRP * i;
          if (threadIdx.x % kRowBlockLanes == 0 && r < p.rows && cg < p.cols) {
            static_cast<std::uint8_t*>(p.row_scale)[r * (p.cols / kMXBlockLen) + cg / kMXBlockLen] =
                byte;
          }
        } else {
          row_amax[i] = m;
        }
      }
      if constexpr (!kMX) {
        // NOTE [row scales spread]: a 1x128 block is one row of the tile, held by the
        // kRowBlockLanes (= kTPR) lanes of that row, which all hold its amax for every pass.
        // Rather than each lane working out all kPasses scales (a division, an ldexp and the
        // clamps each, plus the divergent reciprocal of the writer), lane j of the row works out
        // pass j's scale (kPasses <= kRowBlockLanes), writes its scale_inv, and the scales go
        // back to every lane of the row by shuffles.
        static_assert(kPasses <= kRowBlockLanes && kRowBlockLanes == kTPR, "row scale lanes");
        const int lane = threadIdx.x % 32;
        const int my_pass = lane % kRowBlockLanes;
        unsigned mine = 0;
#pragma unroll
        for (int i = 0; i < kPasses; ++i) mine = i == my_pass ? row_amax[i] : mine;
        float s = 1.0f;
        if (my_pass < kPasses) {
          s = device::scale_from_amax(__uint_as_float(mine), kFp8Max, 0, p.power_of_2, p.epsilon);
          // (Every row of an existing tile has a block: its first column c0 is < cols.)
          const std::int64_t r = r0 + tr + kRP * my_pass;
          if (r < p.rows) static_cast<float*>(p.row_scale)[r * p.tiles_c + tile_c] = reciprocal(s);
        }
        const int row_base = lane - my_pass;
#pragma unroll
        for (int i = 0; i < kPasses; ++i) row_mult[i] = __shfl_sync(kFullMask, s, row_base + i);
      }
    }
    if (want_col) {
      unsigned cm[kColGroups][kVec];
#pragma unroll
      for (int g = 0; g < kColGroups; ++g) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) cm[g][j] = 0u;
      }
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          cm[i / kPassesPerGroup][j] =
              max(cm[i / kPassesPerGroup][j], abs_bits(element<T>(raw[i], j)));
        }
      }
      // The rows of one warp that share these columns, then the warps through shared memory.
      const int warp = threadIdx.x / 32;
      const int lane = threadIdx.x % 32;
#pragma unroll
      for (int g = 0; g < kColGroups; ++g) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
#pragma unroll
          for (int o = kTPR; o < 32; o *= 2) {
            cm[g][j] = max(cm[g][j], __shfl_xor_sync(kFullMask, cm[g][j], o));
          }
          if (lane < kTPR) col_red[(warp * kColGroups + g) * kTile + tc + j] = cm[g][j];
        }
      }
      __syncthreads();
      for (int idx = threadIdx.x; idx < kColGroups * kTile; idx += kThreads) {
        const int g = idx / kTile;
        const int c = idx % kTile;
        unsigned m = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m = max(m, col_red[(w * kColGroups + g) * kTile + c]);
        const float amax = __uint_as_float(m);
        const std::int64_t gc = c0 + c;
        if constexpr (kMX) {
          const std::uint8_t byte = device::mx_scale_byte<kFmt>(amax);
          col_mult[idx] = reciprocal(device::e8m0_to_float(byte));
          const std::int64_t block_row = tile_r * kColGroups + g;
          if (gc < p.cols && block_row * kMXBlockLen < p.rows) {
            static_cast<std::uint8_t*>(p.col_scale)[block_row * p.cols + gc] = byte;
          }
        } else {
          const float s = device::scale_from_amax(amax, kFp8Max, 0, p.power_of_2, p.epsilon);
          col_mult[idx] = s;
          if (gc < p.cols)
            static_cast<float*>(p.col_scale)[gc * p.tiles_r + tile_r] = reciprocal(s);
        }
      }
      __syncthreads();
    }
  } else if constexpr (kMode == TileScaling::kBlock128x128) {
    unsigned m = 0;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) m = max(m, abs_bits(element<T>(raw[i], j)));
    }
    m = device::block_max<kThreads>(m);
    tile_mult = device::scale_from_amax(__uint_as_float(m), kFp8Max, 0, p.power_of_2, p.epsilon);
    if (threadIdx.x == 0) {
      const float s_inv = reciprocal(tile_mult);
      if (want_row) static_cast<float*>(p.row_scale)[tile_r * p.tiles_c + tile_c] = s_inv;
      if (want_col) static_cast<float*>(p.col_scale)[tile_c * p.tiles_r + tile_r] = s_inv;
    }
  } else {  // kTensor
    tile_mult = *p.scale;
    if (p.amax != nullptr) {
      unsigned m = 0;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) m = max(m, abs_bits(element<T>(raw[i], j)));
      }
      // Per warp now; over the warps after the barrier before step 4, so that no warp waits
      // for the others' loads before it quantizes its own rows.
      m = device::warp_max(m);
      if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = m;
    }
  }

  // 3. Quantize; rowwise (and MXFP8 columnwise) bytes straight to global memory, transposed
  // bytes into the shared tile.
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row_in_tile = tr + kRP * i;
    const std::int64_t r = r0 + row_in_tile;
    float v[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = element<T>(raw[i], j);
    std::uint32_t* shared_row = kTransposed ? tile_t + (row_in_tile * kPitch + tc) / 4 : nullptr;
    // The tile-wide multiplier serves both directions (per-tensor and 128x128): the
    // transposed bytes are the rowwise bytes.
    constexpr bool kShared = !kPerBlock;
    if (want_row || (kShared && want_col)) {
      float q[kVec];
      const float mult = kPerBlock ? row_mult[kPerBlock ? i : 0] : tile_mult;
#pragma unroll
      for (int j = 0; j < kVec; ++j) q[j] = __fmul_rn(v[j], mult);
      std::uint32_t w[kWords];
      device::pack_fp8<kFmt, kVec>(q, w);
      if (want_row && r < p.rows) store_row_bytes<kVec>(p.row_data, r, cg, p, p.row_vec, w);
      if constexpr (kShared) {
        if (want_col) {
#pragma unroll
          for (int k = 0; k < kWords; ++k) shared_row[k] = w[k];
        }
      }
    }
    if constexpr (kPerBlock) {
      if (want_col) {
        const float* mult = col_mult + (kMX ? (i / kPassesPerGroup) * kTile : 0) + tc;
        float q[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) q[j] = __fmul_rn(v[j], mult[j]);
        std::uint32_t w[kWords];
        device::pack_fp8<kFmt, kVec>(q, w);
        if constexpr (kMX) {
          if (r < p.rows) store_row_bytes<kVec>(p.col_data, r, cg, p, p.col_vec, w);
        } else {
#pragma unroll
          for (int k = 0; k < kWords; ++k) shared_row[k] = w[k];
        }
      }
    }
  }

  // 4. The transposed tile out (NOTE [transpose tile]); the block's amax (per-tensor scaling)
  // is folded in after the same barrier.
  const bool block_amax = kTensorScale && p.amax != nullptr;
  if ((kTransposed && want_col) || block_amax) __syncthreads();
  if constexpr (kTensorScale) {
    if (block_amax && threadIdx.x == 0) {
      unsigned m = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = max(m, warp_amax[w]);
      if (m != 0u) atomicMax(p.amax, m);
    }
  }
  if constexpr (kTransposed) {
    if (want_col) {
      const int warp = threadIdx.x / 32;
      const int lane = threadIdx.x % 32;
      const int c4 = 4 * (16 * (warp % 2) + lane / 2);  // first of the thread's 4 columns
      const int chunk = 2 * (warp / 2) + lane % 2;      // its 16 rows: chunk * 16 + [0, 16)
      const std::int64_t gr = r0 + chunk * 16;
      std::uint32_t cols[4][4];  // cols[j][b]: column c4 + j, rows chunk * 16 + 4b + [0, 4)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        std::uint32_t a[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = tile_t[((chunk * 16 + 4 * b + e) * kPitch + c4) / 4];
        transpose_4x4(a);
#pragma unroll
        for (int j = 0; j < 4; ++j) cols[j][b] = a[j];
      }
      if (gr < p.rows) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const std::int64_t gc = c0 + c4 + j;
          if (gc < p.cols) {
            std::uint8_t* dst = p.col_data + gc * p.rows + gr;
            if (p.col_vec) {
              device::store_words<4>(dst, cols[j]);
            } else {
#pragma unroll
              for (int e = 0; e < 16; ++e) {
                if (gr + e < p.rows) dst[e] = device::byte_of(cols[j], e);
              }
            }
          }
        }
      }
    }
  }
}

template <typename T, DType kFmt, TileScaling kMode>
void launch(const TileParams& p, unsigned grid, cudaStream_t stream) {
  quantize_tile_kernel<T, kFmt, kMode><<<grid, kThreads, 0, stream>>>(p);
  OVERLAP_CHECK_LAUNCH("quantize_tile_kernel");
}

}  // namespace

void quantize_tiles_cuda(const TileQuantizeArgs& a, cudaStream_t stream) {
  constexpr const char* kOp = "quantize_tiles_cuda";
  TileParams p{};
  p.x = a.x;
  p.rows = a.rows;
  p.cols = a.cols;
  p.tiles_r = (a.rows + kTile - 1) / kTile;
  p.tiles_c = (a.cols + kTile - 1) / kTile;
  p.num_tiles = p.tiles_r * p.tiles_c;
  p.row_data = a.rowwise;
  p.col_data = a.columnwise;
  p.row_scale = a.rowwise_scale_inv;
  p.col_scale = a.columnwise_scale_inv;
  p.scale = a.scale;
  p.scale_inv = a.scale_inv;
  p.amax = reinterpret_cast<unsigned*>(a.amax);
  p.power_of_2 = a.power_of_2;
  p.epsilon = a.epsilon;
  OVERLAP_CHECK_ARG(p.num_tiles < (std::int64_t{1} << 31),
                    kOp << ": " << a.rows << " x " << a.cols << " is too large for one launch");
  const bool tensor = a.scaling == TileScaling::kTensor;
  // NOTE [amax bits]: the amax output is zeroed in stream order, then max-reduced into.
  if (tensor && a.amax != nullptr) {
    OVERLAP_CHECK_CUDA(cudaMemsetAsync(a.amax, 0, sizeof(float), stream));
  }
  if (p.num_tiles == 0 && !tensor) return;  // nothing to write: the scale tensors are empty
  const auto grid = static_cast<unsigned>(p.num_tiles > 0 ? p.num_tiles : 1);

  dispatch_float_type(a.x_dtype, kOp, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr std::int64_t kVec = 16 / sizeof(T);
    p.x_vec = aligned_to(a.x, 16) && a.cols % kVec == 0;
    p.row_vec = aligned_to(a.rowwise, kVec) && a.cols % kVec == 0;
    p.col_vec = a.scaling == TileScaling::kMXFP8
                    ? aligned_to(a.columnwise, kVec) && a.cols % kVec == 0
                    : aligned_to(a.columnwise, 16) && a.rows % 16 == 0;
    dispatch_fp8(a.fp8_dtype, kOp, [&](auto fmt_tag) {
      constexpr DType kFmt = decltype(fmt_tag)::value;
      switch (a.scaling) {
        case TileScaling::kTensor:
          return launch<T, kFmt, TileScaling::kTensor>(p, grid, stream);
        case TileScaling::kBlock1x128:
          return launch<T, kFmt, TileScaling::kBlock1x128>(p, grid, stream);
        case TileScaling::kBlock128x128:
          return launch<T, kFmt, TileScaling::kBlock128x128>(p, grid, stream);
        case TileScaling::kMXFP8:
          return launch<T, kFmt, TileScaling::kMXFP8>(p, grid, stream);
      }
    });
  });
}

}  // namespace overlap::kernels

// Helpers shared by the overlap ops (internal).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "comm/overlap/overlap_ops.h"
#include "common/errors.h"

namespace overlap::comm::detail {

constexpr std::size_t kSlotAlign = kSlotAlignment;

inline std::size_t round_up(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

// The tuning limits of NOTE [overlap defaults].
inline void check_lanes(int compute_lanes, const char* op) {
  OVERLAP_CHECK(
      compute_lanes >= 1 && compute_lanes <= kMaxComputeLanes, kConfig,
      op << ": compute_lanes must be in [1, " << kMaxComputeLanes << "], got " << compute_lanes);
}

inline void check_pieces(int pieces, const char* op) {
  OVERLAP_CHECK(pieces >= 1 && pieces <= kMaxPieces, kConfig,
                op << ": pieces must be in [1, " << kMaxPieces << "], got " << pieces);
}

// FP8 operands of the overlap ops are per-tensor scaled (block formats: not yet).
inline void check_scaling(const gemm::GemmOperand& x, const char* op, const char* what) {
  OVERLAP_CHECK(x.scaling == gemm::ScalingMode::kNone || x.scaling == gemm::ScalingMode::kTensor,
                kUnsupported,
                op << ": " << what << " uses " << gemm::scaling_mode_name(x.scaling)
                   << " scaling; the overlap ops take bf16/fp16/fp32 or per-tensor FP8 operands");
}

// What every overlap op checks first (buffer ready, compute lanes, per-tensor or no scaling).
inline void check_op(const SymmetricBuffer& buf, int compute_lanes, const gemm::GemmOperand& a,
                     const gemm::GemmOperand& b, const char* op) {
  buf.check_ready(op);
  check_lanes(compute_lanes, op);
  check_scaling(a, op, "the input");
  check_scaling(b, op, "the weight");
}

// The buffer is large enough for `needed` bytes of the op's layout.
inline void check_fits(const SymmetricBuffer& buf, std::size_t needed, const char* op) {
  OVERLAP_CHECK_ARG(needed <= buf.bytes(), op << ": the op needs " << needed
                                              << " bytes of buffer per rank but the buffer has "
                                              << buf.bytes() << "; create a larger one");
}

// ---- pieces (NOTE [ag_gemm pieces], NOTE [gemm_rs pieces]) -----------------------------------

// A chunk of m rows split into P = min(pieces, m) pieces: piece p = rows [lo(p), lo(p + 1)).
class Pieces {
 public:
  Pieces(std::int64_t m, int pieces)
      : m_(m), p_(static_cast<int>(std::min<std::int64_t>(std::max(1, pieces), m))) {}
  int count() const { return p_; }
  std::int64_t lo(int p) const { return m_ * p / p_; }
  std::int64_t rows(int p) const { return lo(p + 1) - lo(p); }

 private:
  std::int64_t m_;
  int p_;
};

// Right after begin_op returned e: takes e+1 .. e+kPieceEpochs-1 too (NOTE [ag_gemm pieces]).
inline void take_piece_epochs(SymmetricBuffer& buf, cudaStream_t stream) {
  for (std::uint64_t i = 1; i < kPieceEpochs; ++i) {
    buf.transport().note_op(buf, buf.next_epoch(), stream);
  }
}

// ---- GEMM -> RS (gemm_rs.cpp, gemm_rs_ring.cpp) ----------------------------------------------

// The facts of a GEMM -> RS call once its arguments have passed check_gemm_rs.
struct GemmRsShape {
  std::int64_t m = 0;     // rows per rank (of the output, and of each chunk of the input)
  std::int64_t cols = 0;  // n, the output's columns
  DType partial = DType::kBFloat16;
};

// The argument rules both GEMM -> RS methods share (gemm_rs.cpp); `op` names the caller.
GemmRsShape check_gemm_rs(const SymmetricBuffer& buf, const gemm::GemmOperand& a,
                          const gemm::GemmOperand& b, const gemm::GemmOutput& d,
                          const float* out_scale_inv, const gemm::GemmOptions& options,
                          int compute_lanes, const char* op);

// How both GEMM -> RS methods store their sum into `d` (FP8: scale, amax, out_scale_inv).
inline ReduceOutput gemm_rs_output(const gemm::GemmOutput& d, float* out_scale_inv,
                                   int reduce_max_blocks) {
  ReduceOutput o;
  o.format = d.dtype;
  o.scale = d.scale;
  o.scale_inv = out_scale_inv;
  o.amax = d.amax;
  o.max_blocks = reduce_max_blocks;
  return o;
}

// Rows [row0, row0 + rows) of a non-transposed operand.
inline gemm::GemmOperand row_block(const gemm::GemmOperand& a, std::int64_t row0,
                                   std::int64_t rows) {
  gemm::GemmOperand c = a;
  c.data = static_cast<const char*>(a.data) + row0 * a.ld * dtype_size(a.dtype);
  c.rows = rows;
  return c;
}

}  // namespace overlap::comm::detail

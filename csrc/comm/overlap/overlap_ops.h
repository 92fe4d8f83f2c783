// Comm-GEMM overlap ops: the tensor-parallel collective of a linear layer hidden behind its
// GEMM, written once against the Transport interface (host transport in CI, cuda on GPUs).
//
//   ag_gemm:  Y[M, N] = AllGather(X_shard)[M, K] @ op(W)        (sequence-parallel input)
//   gemm_rs:  Y_shard[M/tp, N] = ReduceScatter(X[M, K_shard] @ op(W_shard))
//
// Both are COLLECTIVE over the buffer's group, open with begin_op (epochs, acknowledgements,
// op records: NOTE [buffer reuse] in collectives.h) and are stream-ordered on `stream`: every
// internal lane (compute and copy streams, NOTE [lanes]) forks from it and joins back, so the
// caller sees one op on one stream. All arguments are validated before begin_op, so a rejected
// call communicates nothing and leaves the buffer usable. The stream timelines are above each
// function in ag_gemm.cpp and gemm_rs.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/symmetric_buffer.h"
#include "gemm/gemm.h"

namespace overlap::comm {

// Tuning of an overlap op; the result does not depend on it.
struct OverlapConfig {
  // Streams (lanes) the chunk GEMMs alternate over, 1..kMaxComputeLanes. Two let a chunk's
  // GEMM start as soon as its data is there while the previous one still runs.
  int compute_lanes = 1;
  // gemm_rs: bound on the reduction kernel's grid (<= 0: fill the GPU).
  int reduce_max_blocks = 0;
  // ag_gemm: push the shard to one peer after the other (r+1 first) instead of to all at
  // once. Each push then has the copy engines to itself, so the first peer chunk lands after
  // about 1/(size-1) of the all-gather time, not at its end (NOTE [ag_gemm schedule]).
  bool staggered_puts = false;
};
constexpr int kMaxComputeLanes = 4;

// ---- AG -> GEMM ------------------------------------------------------------------------------

// NOTE [ag_gemm layout]: each rank's region holds the gathered input as one row-major
// [size * m, k] matrix (rank j's shard in rows [j m, (j + 1) m), slot j), then, for FP8
// per-tensor inputs, one 16-byte slot per rank holding that shard's float32 scale_inv at
// `scale_offset` (DESIGN.md invariant 1: the scale travels with its data, and each chunk's
// GEMM reads its chunk's scale_inv from the buffer).
struct AgGemmLayout {
  std::size_t shard_bytes = 0;   // one rank's shard (m * k elements)
  std::size_t scale_offset = 0;  // first scale slot (256-byte aligned); 0 when not scaled
  std::size_t bytes = 0;         // bytes of the region the op uses
};
constexpr std::size_t kScaleSlotBytes = 16;
AgGemmLayout ag_gemm_layout(int size, std::size_t shard_bytes, bool scaled);

// a_shard: this rank's rows [m, k], contiguous (ld == k), not transposed; bf16/fp16/fp32, or
//   FP8 with per-tensor scaling (a_shard.scale_inv: this rank's float32[1]).
// b: the local weight, any layout gemm() accepts (a linear layer: W [n, k], transposed).
// d: the whole output [size * m, n] (rows == size * m, row_offset 0); not FP8 (a per-tensor
//   amax over chunk GEMMs is not implemented).
// options: the GEMM's options (alpha, bias, gelu, fast_accum, sm_count; beta == 0).
// After the op, the buffer holds the gathered input (NOTE [ag_gemm layout]) until the next op.
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, const gemm::GemmOptions& options,
             const OverlapConfig& config, cudaStream_t stream);

// ---- GEMM -> RS ------------------------------------------------------------------------------

// NOTE [gemm_rs layout]: each rank's region holds `size` send slots (its partial sums of
// the rows destined to rank j, [m, n] of the partial dtype, in slot j), then `size` receive
// slots (rank j's partial sums of this rank's rows, pulled from rank j's send slot, in slot
// j). Slots are 256-byte aligned.
struct GemmRsLayout {
  std::size_t slot_bytes = 0;  // one [m, n] partial, rounded up to 256 bytes
  std::size_t recv_offset = 0;
  std::size_t bytes = 0;
};
GemmRsLayout gemm_rs_layout(int size, std::size_t partial_bytes);

// The dtype partial sums are kept in: the output's, or bfloat16 for an FP8 output.
DType gemm_rs_partial_dtype(DType out);

// a: X [M, k] (rows not transposed, any ld), M divisible by the group size; b: the local
//   weight shard (op(b) = [k, n]); FP8 operands per-tensor scaled.
// d: this rank's output [M / size, n], contiguous (ld == n), row_offset 0; bf16/fp16/fp32,
//   or FP8 with d.scale (required) and d.amax (optional, max |sum| before scaling).
// out_scale_inv: FP8 outputs only, optional float32[1] receiving 1 / scale.
// options: alpha, fast_accum, sm_count (bias, gelu and beta would apply to partial sums and
//   are refused).
void gemm_rs(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
             const OverlapConfig& config, cudaStream_t stream);

}  // namespace overlap::comm

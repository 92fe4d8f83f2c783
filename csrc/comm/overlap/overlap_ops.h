// Comm-GEMM overlap ops, written once against the Transport interface:
//   ag_gemm:  Y[M, N] = AllGather(X_shard)[M, K] @ op(W)
//   gemm_rs:  Y_shard[M/tp, N] = ReduceScatter(X[M, K_shard] @ op(W_shard))
// All are COLLECTIVE, open with begin_op (NOTE [buffer reuse] in collectives.h) and fork their
// lanes from `stream` and join them back (NOTE [lanes]). Every argument is validated before
// begin_op, so a rejected call communicates nothing. Timelines: above each function's definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/symmetric_buffer.h"
#include "gemm/gemm.h"

namespace overlap::comm {

// ---- tuning: limits and defaults (defaults.cpp) --------------------------------------------
// NOTE [overlap defaults]: every limit and default of the ops' tuning is defined here, once:
// the config structs' initialisers (any group size) and `<op>_defaults(size)` (defaults.cpp).
// The binding exposes them; overlap.ops and overlap.ub write no number down
// (tests/unit/test_defaults.py). Results never depend on tuning. Verdict: a default changes in
// one line.
constexpr int kMaxComputeLanes = 4;
constexpr int kMaxRingSubchunks = 4;
constexpr int kMaxPieces = 4;
// Alignment of every slot and region (cuBLASLt's fastest kernels; overlap/buffers/layout.py).
constexpr std::size_t kSlotAlignment = 256;
// The pull rate a fused AG+GEMM assumes when it tells its waiting GEMM when the last shard
// should land (NOTE [waiting gemm choice] in gemm/gemm.h): one copy-engine pull over NVLink,
// the pulls back to back (4xH200: ~340 GB/s, docs/performance-log.md [gemm_rs pieces]). Only
// the kernel choice reads it.
constexpr double kFusedPullBytesPerMs = 340e6;

struct AgGemmConfig {
  int compute_lanes = 2;  // streams the chunk GEMMs alternate over, 1..kMaxComputeLanes
  // One peer after the other, r+1 first (NOTE [ag_gemm schedule]; docs/performance-log.md
  // [ag_gemm op defaults]).
  bool staggered_puts = true;
  bool pull_shards = false;  // NOTE [ag_gemm pulls]; staggered_puts and put_split do not apply
  // Pieces each peer's shard travels and is multiplied in, 1..kMaxPieces (NOTE [ag_gemm pieces]).
  int pieces = 1;
  // Pushes: also copy our own shard into our slot (NOTE [ag_gemm own slot]); pulls always do.
  bool keep_gathered = false;
  // Pulls only: ONE waiting GEMM consumes the shards as they land (NOTE [fused ag_gemm]);
  // compute_lanes does not apply.
  bool fused_gemm = false;
};

struct GemmRsConfig {
  int compute_lanes = 1;      // 1..kMaxComputeLanes (1 finishes each chunk earliest)
  int reduce_max_blocks = 0;  // bound on the reduction's grid (<= 0: fill the GPU)
  int pieces = 1;             // rounds, 1..kMaxPieces (NOTE [gemm_rs pieces])
};

struct GemmRsRingConfig {
  int compute_lanes = 1;
  int reduce_max_blocks = 0;  // bound on the FP8 output cast's grid
  int ring_subchunks = 2;     // 1..kMaxRingSubchunks (NOTE [gemm_rs_ring schedule])
  bool pull_shards = false;   // NOTE [gemm_rs_ring pulls]; put_split does not apply
};

// How a GEMM -> RS moves and sums the partial sums: gemm_rs or gemm_rs_ring.
enum class RsMethod : int { kPipelined = 0, kRing = 1 };

// The GEMM -> RS that runs where the caller chooses none.
struct GemmRsDefault {
  RsMethod method = RsMethod::kPipelined;
  bool pull_shards = false;
};

// reduce_scatter_beside_gemm (all_gather_beside_gemm has no tuning of its own).
struct BulkRsConfig {
  int reduce_max_blocks = 64;  // 256-thread blocks, 4 per SM: 64 fill 16 SMs
  int gemm_sm_margin = 8;      // cuda: SMs a side GEMM without sm_count leaves free
  int pieces = 2;              // 1..kMaxPieces (NOTE [bulk_rs pieces] in bulk.cpp)
};

// The defaults at `size` ranks (<= 0: the structs' own; NOTE [ub tp 2]).
AgGemmConfig ag_gemm_defaults(int size);
GemmRsConfig gemm_rs_defaults(int size);
GemmRsRingConfig gemm_rs_ring_defaults(int size);
GemmRsDefault gemm_rs_default(int size);
BulkRsConfig bulk_rs_defaults(int size);

// Epochs an ag_gemm or gemm_rs takes, whatever P (NOTE [ag_gemm pieces]).
constexpr std::uint64_t kPieceEpochs = 5;
static_assert(kPieceEpochs % 2 == 1 && kPieceEpochs >= kMaxPieces);

// ---- AG -> GEMM ------------------------------------------------------------------------------

// NOTE [ag_gemm layout]: the gathered input as one row-major [size * m, k] matrix (rank j's
// shard in slot j), then, for FP8 per-tensor inputs, one 16-byte scale_inv slot per rank at
// `scale_offset` (docs/design.md §3, invariant 1: the scale travels with its data).
struct AgGemmLayout {
  std::size_t shard_bytes = 0;   // one rank's shard (m * k elements)
  std::size_t scale_offset = 0;  // first scale slot (256-byte aligned); 0 when not scaled
  std::size_t bytes = 0;         // bytes of the region the op uses
};
constexpr std::size_t kScaleSlotBytes = 16;
AgGemmLayout ag_gemm_layout(int size, std::size_t shard_bytes, bool scaled);

// a_shard: our rows [m, k], contiguous, bf16/fp16/fp32 or per-tensor FP8; b: any layout gemm()
// accepts; d: the whole [size * m, n], not FP8; beta == 0. Afterwards the buffer holds the
// gathered input until the next op (our own slot only with pulls or keep_gathered).
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, const gemm::GemmOptions& options,
             const AgGemmConfig& config, cudaStream_t stream);

// ---- GEMM -> RS ------------------------------------------------------------------------------

// NOTE [gemm_rs layout]: `size` send slots (slot j: our partial sums of rank j's rows), then
// `size - 1` receive slots (slot gemm_rs_recv_slot(rank, j): peer j's partial sums of our rows,
// pulled), 256-byte aligned. Our own rows' partial sums are summed from their send slot, so no
// receive slot is kept for them (NOTE [userbuffer memory] in overlap/ub/handle.py).
struct GemmRsLayout {
  std::size_t slot_bytes = 0;  // one [m, n] partial, rounded up to 256 bytes
  std::size_t recv_offset = 0;
  std::size_t bytes = 0;
};
GemmRsLayout gemm_rs_layout(int size, std::size_t partial_bytes);
// The receive slot of `peer`'s partial sums in `rank`'s region (peer != rank).
std::size_t gemm_rs_recv_slot(int rank, int peer);

// The dtype partial sums are kept in: the output's, or bfloat16 for an FP8 output.
DType gemm_rs_partial_dtype(DType out);

// a: X [M, k], not transposed, M a multiple of the group size; b: the local weight shard.
// d: this rank's contiguous [M / size, n]; bf16/fp16/fp32, or FP8 with d.scale (and optional
// d.amax, out_scale_inv). Bias, gelu and beta would apply to partial sums: refused.
void gemm_rs(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
             const GemmRsConfig& config, cudaStream_t stream);

// ---- bulk overlap: a collective beside an unrelated GEMM (comm/overlap/bulk.cpp) ----------
// A backward's collective beside a GEMM that does not depend on it, with the contract above
// (NOTE [bulk independence] in bulk.cpp).

// The GEMM beside a bulk collective: any call gemm() accepts on the buffer's transport.
struct SideGemm {
  gemm::GemmOperand a;
  gemm::GemmOperand b;
  gemm::GemmOutput d;
  gemm::GemmOptions options;
};

// `bytes` contiguous bytes (+ an FP8 scale_inv), gathered as in NOTE [ag_gemm layout].
struct GatherShard {
  const void* data = nullptr;
  std::size_t bytes = 0;
  const float* scale_inv = nullptr;
};

// Gathers every rank's shard into the buffer (copy engines, no SM) while `gemm` runs.
void all_gather_beside_gemm(SymmetricBuffer& buf, const GatherShard& shard, const SideGemm& gemm,
                            cudaStream_t stream);

// NOTE [bulk_rs layout]: `size - 1` 256-byte aligned slots (one at size 1); slot
// bulk_rs_slot(rank, j) receives peer j's partial sums of our rows. Our own partial is read
// from the input, so no slot is kept for it (NOTE [userbuffer memory] in overlap/ub/handle.py).
struct BulkRsLayout {
  std::size_t slot_bytes = 0;
  std::size_t bytes = 0;
};
BulkRsLayout bulk_rs_layout(int size, std::size_t partial_bytes);
// The slot of `sender`'s partial sums in `owner`'s region (sender != owner).
std::size_t bulk_rs_slot(int owner, int sender);

// Contiguous [rows, cols] bf16/fp16/fp32, rows a multiple of the group size.
struct ScatterInput {
  const void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// Contiguous [rows / size, cols] of the input's dtype, or FP8 with `scale` (required),
// `scale_inv` and `amax` (optional).
struct ScatterOutput {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* scale = nullptr;
  float* scale_inv = nullptr;
  float* amax = nullptr;
};

// This rank's rows of the sum over ranks of `in` (fp32, rank order) while `gemm` runs.
void reduce_scatter_beside_gemm(SymmetricBuffer& buf, const ScatterInput& in,
                                const ScatterOutput& out, const SideGemm& gemm,
                                const BulkRsConfig& config, cudaStream_t stream);

// ---- GEMM -> RS, ring exchange (gemm_rs_ring.cpp) ---------------------------------------------

// NOTE [gemm_rs_ring layout]: `size` 256-byte aligned [m, n] partial slots: slot 0 sends
// (our first partial), slot 1 + i receives hop i's running sum, to which we add ours in place.
// No slot is reused within an op: `size` slots against the pipelined layout's 2 size - 1.
GemmRsLayout gemm_rs_ring_layout(int size, std::size_t partial_bytes);

// Epochs a gemm_rs_ring takes (NOTE [ring sub-epochs] in gemm_rs_ring.cpp).
std::uint64_t gemm_rs_ring_epochs(int size);

// gemm_rs's result (same arguments) as a ring of running sums, added by the GEMM's beta = 1
// epilogue: no reduction kernel (NOTE [gemm_rs_ring numerics]).
void gemm_rs_ring(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
                  const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
                  const GemmRsRingConfig& config, cudaStream_t stream);

// ---- AG -> GEMM with several weights sharing one gather (ag_gemm.cpp) --------------------------

// One weight of a multi-weight ag_gemm (Q, K and V; gate and up), with the single one's rules.
struct AgGemmWeight {
  gemm::GemmOperand b;
  gemm::GemmOutput d;
  gemm::GemmOptions options;
};

// d_w = AllGather(a_shard) @ op(b_w) for every weight w, with one gather (NOTE [ag_gemm
// schedule]); `weights` must not be empty.
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
             const std::vector<AgGemmWeight>& weights, const AgGemmConfig& config,
             cudaStream_t stream);

}  // namespace overlap::comm

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
#include <vector>

#include "comm/symmetric_buffer.h"
#include "gemm/gemm.h"

namespace overlap::comm {

// ---- tuning: limits and defaults (defaults.cpp) --------------------------------------------
//
// NOTE [overlap defaults]: every limit and default of the overlap ops' tuning is defined here,
// once. Each op has a config struct of its own knobs (nothing in it that the op ignores); its
// member initialisers are the op's defaults at any group size, and `<op>_defaults(size)` gives
// a group size's own where a default depends on it (NOTE [ub tp 2], NOTE [bulk_rs defaults]
// in defaults.cpp). The binding (overlap._C.comm_ops) exposes the limits, the structs and these
// functions and takes its keyword defaults from them; overlap.ops and overlap.ub read the
// binding and write no number down (tests/unit/test_defaults.py fails where a Python layer
// restates one). The results of an op never depend on its tuning. Verdict: a default changes
// in one line.
constexpr int kMaxComputeLanes = 4;
constexpr int kMaxRingSubchunks = 4;
constexpr int kMaxPieces = 4;
// Byte alignment of every slot and region of an op's layout (and of a buffer's start): what
// cuBLASLt's fastest kernels assume. The buffer managers' layout (overlap/buffers/layout.py)
// aligns its regions to it as well, so that both lay a gathered tensor out alike.
constexpr std::size_t kSlotAlignment = 256;

// ag_gemm (AG -> GEMM).
struct AgGemmConfig {
  // Streams (lanes) the chunk GEMMs alternate over, 1..kMaxComputeLanes. Two let a chunk's
  // GEMM start as soon as its data is there while the previous one still runs.
  int compute_lanes = 2;
  // Push the shard to one peer after the other (r+1 first) instead of to all at once. Each push
  // then has the copy engines to itself, so the first peer chunk lands after about 1/(size-1)
  // of the all-gather time, not at its end (NOTE [ag_gemm schedule]; docs/performance-log.md
  // [ag_gemm op defaults]).
  bool staggered_puts = true;
  // Each rank copies its shard into its own slot and the peers PULL it, after two handshakes
  // (NOTE [handshakes] in transport.h) where every rank meets: no flag per chunk, the pulls on
  // one copy lane in torch async-TP's order, each chunk's GEMMs after its pull (NOTE [ag_gemm
  // pulls]). staggered_puts and put_split do not apply.
  bool pull_shards = false;
  // Pieces each peer's shard is pushed, announced and multiplied in, 1..kMaxPieces: the GEMM of
  // a piece starts once it has landed (NOTE [ag_gemm pieces]). 1 = whole chunks, best for
  // GEMM-bound shapes.
  int pieces = 1;
  // Pushes: also copy our own shard into our slot, so that the buffer holds the whole gathered
  // input after the op (NOTE [ag_gemm own slot]: it costs a local copy beside the pushes). The
  // pulls always copy it (the peers read it there).
  bool keep_gathered = false;
};

// gemm_rs (GEMM -> RS, pipelined).
struct GemmRsConfig {
  // Streams the chunk GEMMs alternate over, 1..kMaxComputeLanes (1 finishes each chunk, and
  // thus each transfer, earliest).
  int compute_lanes = 1;
  // Bound on the reduction kernel's grid (<= 0: fill the GPU).
  int reduce_max_blocks = 0;
  // Rounds the chunks are computed, pulled and reduced in, 1..kMaxPieces: each piece is pulled
  // and reduced while later rounds are computed (NOTE [gemm_rs pieces]).
  int pieces = 1;
};

// gemm_rs_ring (GEMM -> RS, ring exchange).
struct GemmRsRingConfig {
  // As GemmRsConfig::compute_lanes.
  int compute_lanes = 1;
  // Bound on the grid of the FP8 output's cast (<= 0: fill the GPU).
  int reduce_max_blocks = 0;
  // Sub-chunks each rank's chunk is split into, 1..kMaxRingSubchunks (NOTE [gemm_rs_ring
  // schedule]: with 1, every hop waits for the neighbour's whole GEMM).
  int ring_subchunks = 2;
  // Each rank leaves its running sums in its own slots and its successor pulls them, announced
  // by one flag per piece (NOTE [gemm_rs_ring pulls]); put_split does not apply.
  bool pull_shards = false;
};

// How a GEMM -> RS moves and sums the partial sums: gemm_rs or gemm_rs_ring.
enum class RsMethod : int { kPipelined = 0, kRing = 1 };

// The GEMM -> RS that runs where the caller chooses none: its method and, for the ring, whether
// it pulls (a choice of its own: a ring that is asked for keeps gemm_rs_ring_defaults()).
struct GemmRsDefault {
  RsMethod method = RsMethod::kPipelined;
  bool pull_shards = false;
};

// reduce_scatter_beside_gemm (bulk reduce-scatter). all_gather_beside_gemm has no tuning of
// its own (its buffer's put_split and serial_puts apply).
struct BulkRsConfig {
  // Bound on the reduction kernel's grid (<= 0: fill the GPU). The kernel's blocks are 256
  // threads, 4 resident per SM: 64 blocks fill 16 SMs.
  int reduce_max_blocks = 64;
  // cuda: when the side GEMM gives no sm_count of its own, it plans for (device SMs -
  // gemm_sm_margin) so that the reduction finds SMs free while the GEMM runs (0: the GEMM plans
  // for the whole GPU).
  int gemm_sm_margin = 8;
  // Pieces the partial sums travel and are reduced in, 1..kMaxPieces (NOTE [bulk_rs pieces] in
  // bulk.cpp).
  int pieces = 2;
};

// The defaults at `size` ranks (<= 0: any size, the structs' own). The op classes of
// overlap.ops take those of any size (reduce_scatter_beside_gemm: of its group's size);
// initialize_ub() takes its group's (NOTE [ub tp 2]).
AgGemmConfig ag_gemm_defaults(int size);
GemmRsConfig gemm_rs_defaults(int size);
GemmRsRingConfig gemm_rs_ring_defaults(int size);
GemmRsDefault gemm_rs_default(int size);
BulkRsConfig bulk_rs_defaults(int size);

// Epochs an ag_gemm or a pipelined gemm_rs takes on its buffer (piece p is announced by the
// value epoch + p, NOTE [ag_gemm pieces]): odd, >= kMaxPieces, and independent of the call's
// arguments.
constexpr std::uint64_t kPieceEpochs = 5;
static_assert(kPieceEpochs % 2 == 1 && kPieceEpochs >= kMaxPieces);

// ---- AG -> GEMM ------------------------------------------------------------------------------

// NOTE [ag_gemm layout]: each rank's region holds the gathered input as one row-major
// [size * m, k] matrix (rank j's shard in rows [j m, (j + 1) m), slot j), then, for FP8
// per-tensor inputs, one 16-byte slot per rank holding that shard's float32 scale_inv at
// `scale_offset` (docs/design.md §3, invariant 1: the scale travels with its data, and each chunk's
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
// After the op, the buffer holds the gathered input (NOTE [ag_gemm layout]) until the next op,
// unless config.keep_gathered is false with pushes (our own slot is then left as it was).
// config.pieces splits each peer's shard (NOTE [ag_gemm pieces]); every op takes
// kPieceEpochs epochs of the buffer whatever the pieces.
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, const gemm::GemmOptions& options,
             const AgGemmConfig& config, cudaStream_t stream);

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
// config.pieces splits each chunk into rounds (NOTE [gemm_rs pieces]); every op takes
// kPieceEpochs epochs of the buffer whatever the pieces.
void gemm_rs(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
             const GemmRsConfig& config, cudaStream_t stream);

// ---- bulk overlap: a collective beside an unrelated GEMM (comm/overlap/bulk.cpp) ----------
//
// A transformer's backward has GEMMs whose operands do not depend on a pending collective:
// the gathered input for wgrad can be all-gathered while dgrad runs, and dgrad's partial sums
// reduce-scattered while wgrad runs. The bulk ops run one collective of one tensor and one
// GEMM with its own operands at the same time, on the same stream contract as the ops above:
// COLLECTIVE, begin_op protocol, lanes forked from `stream` and joined back, every argument
// validated before anything is issued. The GEMM neither reads nor writes what the collective
// touches (checked: see NOTE [bulk independence] in bulk.cpp), so its result does not depend
// on the collective's timing and vice versa. Timelines: above each function in bulk.cpp.

// The GEMM that runs beside a bulk collective: any call gemm() accepts on the buffer's
// transport (gemm/gemm.h), e.g. dgrad dX = dY W (b not transposed) or wgrad dW = dY^T X.
struct SideGemm {
  gemm::GemmOperand a;
  gemm::GemmOperand b;
  gemm::GemmOutput d;
  gemm::GemmOptions options;
};

// The shard of a bulk all-gather: `bytes` contiguous bytes in the transport's memory, and
// for a per-tensor FP8 shard its float32[1] scale_inv (nullptr otherwise). The buffer holds
// the gathered shards in ag_gemm's layout (NOTE [ag_gemm layout]): rank j's shard at
// j * bytes, rank j's scale_inv in scale slot j (docs/design.md §3, invariant 1).
struct GatherShard {
  const void* data = nullptr;
  std::size_t bytes = 0;
  const float* scale_inv = nullptr;
};

// Gathers every rank's shard into the buffer (copy engines, no SM) while `gemm` runs.
// After the op, the buffer holds the gathered shards until the next op on it.
void all_gather_beside_gemm(SymmetricBuffer& buf, const GatherShard& shard, const SideGemm& gemm,
                            cudaStream_t stream);

// NOTE [bulk_rs layout]: `size` slots of one [M / size, n] partial of the input dtype, each
// rounded up to 256 bytes: slot j receives rank j's partial sums of this rank's rows (pushed
// by rank j's copy engines). Slot `rank` stays unused: the own partial is read from the input.
struct BulkRsLayout {
  std::size_t slot_bytes = 0;
  std::size_t bytes = 0;
};
BulkRsLayout bulk_rs_layout(int size, std::size_t partial_bytes);

// The input of a bulk reduce-scatter: a contiguous [rows, cols] bf16/fp16/fp32 matrix, rows
// (tokens) a multiple of the group size; rank j's rows are [j rows/size, (j+1) rows/size).
struct ScatterInput {
  const void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// The output: a contiguous [rows / size, cols] matrix of the input's dtype, or FP8 with
// `scale` (required: out = fp8(sum * scale)), `scale_inv` (optional, receives 1 / scale) and
// `amax` (optional, receives max |sum|); float32[1] each, in the transport's memory.
struct ScatterOutput {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* scale = nullptr;
  float* scale_inv = nullptr;
  float* amax = nullptr;
};

// This rank's rows of the sum over ranks of `in` (fp32 accumulation in rank order, the same
// result on every rank) while `gemm` runs. `out` must not overlap `in`.
void reduce_scatter_beside_gemm(SymmetricBuffer& buf, const ScatterInput& in,
                                const ScatterOutput& out, const SideGemm& gemm,
                                const BulkRsConfig& config, cudaStream_t stream);

// ---- GEMM -> RS, ring exchange (gemm_rs_ring.cpp) ---------------------------------------------

// NOTE [gemm_rs_ring layout]: each rank's region holds `size` slots of one [m, n] partial (of
// gemm_rs_partial_dtype), 256-byte aligned: slot 0 is the send slot (this rank's first
// partial, computed from scratch), slot 1 + i the receive slot of hop i (the running sum its
// ring predecessor pushes at step i, or this rank pulls from the predecessor's slot of that
// step with pull_shards; this rank adds its own partial into it in place and passes it on).
// One slot per hop, none reused within an op: half the pipelined layout.
GemmRsLayout gemm_rs_ring_layout(int size, std::size_t partial_bytes);

// Epochs a gemm_rs_ring op takes on its buffer (NOTE [ring sub-epochs] in gemm_rs_ring.cpp):
// odd, and a function of the group size alone.
std::uint64_t gemm_rs_ring_epochs(int size);

// The same result as gemm_rs (same arguments and rules), computed as a ring: the running sum of
// each chunk travels the ring and every rank adds its partial with the GEMM's own beta = 1
// epilogue, so there is no reduction kernel (FP8 outputs: one cast of the final chunk, with
// scale and amax). Partial sums are rounded to the partial dtype at each hop (NOTE
// [gemm_rs_ring numerics]). config.ring_subchunks pipelines each hop; config.pull_shards has
// each running sum pulled by the next rank instead of pushed to it (NOTE [gemm_rs_ring pulls]).
void gemm_rs_ring(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
                  const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
                  const GemmRsRingConfig& config, cudaStream_t stream);

// ---- AG -> GEMM with several weights sharing one gather (ag_gemm.cpp) --------------------------

// One weight of a multi-weight ag_gemm and its output (Q, K and V, or gate and up: GEMMs that
// read the same gathered input). Each follows the rules of the single-weight ag_gemm.
struct AgGemmWeight {
  gemm::GemmOperand b;
  gemm::GemmOutput d;
  gemm::GemmOptions options;
};

// d_w = AllGather(a_shard) @ op(b_w) for every weight w, with one gather: each chunk, once
// landed, is multiplied by every weight in turn (NOTE [ag_gemm schedule]). `weights` must not
// be empty; every weight and output is validated before begin_op. The single-weight ag_gemm
// above is this call with one weight.
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
             const std::vector<AgGemmWeight>& weights, const AgGemmConfig& config,
             cudaStream_t stream);

}  // namespace overlap::comm

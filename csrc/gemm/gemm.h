// GEMM with row-major semantics: D = epilogue(alpha * op(A) @ op(B) + beta * D_old + bias).
// The one GEMM of the library: cuBLASLt for CUDA memory, a C++ reference for host memory (the
// host transport's GEMM and the tests' oracle), with the same validation (see GemmTarget).
//
//   A stored [m, k] (transposed = false) or [k, m] (transposed = true);   op(A) is [m, k]
//   B stored [k, n] (transposed = false) or [n, k] (transposed = true);   op(B) is [k, n]
//   D is rows [row_offset, row_offset + m) x cols [0, n) of a row-major buffer with
//     leading dimension ld (elements between consecutive rows), ld >= n.
//
// A linear layer's forward Y = X W^T is A = X [tokens, in] and B = W [out, in] transposed.
//
// NOTE [fp8 layout]: cuBLASLt FP8 GEMMs on sm_90 only exist for both operands K-contiguous
// ("TN" in cuBLAS terms, docs/design.md §4): A not transposed and B transposed, in row-major terms.
// Other layouts of FP8 operands raise kUnsupported on sm_90 (pass the columnwise data, the
// transpose, instead); the host reference and newer GPUs accept them for per-tensor scaling.
//
// NOTE [gemm scaling]: an FP8 operand is dequantized as x = float(q) * scale_inv, where
//   kTensor      scale_inv has 1 element;
//   kBlock1x128  scale_inv is [rows, ceil(cols/128)] for data stored [rows, cols]: one scale
//                per 128 consecutive elements of a stored row (activations, gradients);
//   kBlock128x128 scale_inv is [ceil(rows/128), ceil(cols/128)]: one per 128x128 tile
//                (weights);
// all float32, contiguous, unpadded (kernels/block_scaling.h). Block-scaled operands must be
// K-contiguous (NOTE [cublaslt block scale layout] in gemm/cuda/cublaslt_gemm.cpp). MXFP8 is
// refused: cuBLASLt has no MXFP8 GEMM on Hopper (docs/design.md §4).
//
// NOTE [gemm output]: D (before rounding) is
//   v = alpha * sum_k op(A)[i, k] * op(B)[k, j] + beta * D_old[i, j] + bias[j]
//   v = gelu_tanh(v)                      (when gelu; the tanh approximation, see below)
// stored as out_dtype, rounded to nearest even; FP8 outputs store fp8(v * out_scale)
// (saturating, NOTE [fp8 encoding]) and amax receives max |v|. The tanh GELU,
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), is what cuBLASLt's epilogues compute.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/stream.h"
#include "common/tensor_ref.h"

namespace overlap::gemm {

enum class ScalingMode : int {
  kNone = 0,          // bf16/fp16/fp32 operands: no scale
  kTensor = 1,        // FP8, one float32 scale_inv
  kBlock1x128 = 2,    // FP8, float32 scale_inv per 1x128 block along K
  kBlock128x128 = 3,  // FP8, float32 scale_inv per 128x128 tile
  kMxfp8 = 4,         // FP8, E8M0 per 1x32 block: refused (see NOTE [gemm scaling])
};

const char* scaling_mode_name(ScalingMode mode);

// One input matrix, stored row-major [rows, cols] with leading dimension ld >= cols.
struct GemmOperand {
  const void* data = nullptr;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;      // elements between consecutive stored rows
  bool transposed = false;  // op(X) = X^T
  ScalingMode scaling = ScalingMode::kNone;
  const float* scale_inv = nullptr;  // same memory space as data; layout per NOTE [gemm scaling]
};

// The output region: rows [row_offset, row_offset + m) of a row-major buffer of `rows` rows.
struct GemmOutput {
  void* data = nullptr;  // the whole buffer (row 0)
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0;         // rows of the whole buffer
  std::int64_t cols = 0;         // columns written: must equal n
  std::int64_t ld = 0;           // elements between consecutive rows, >= cols
  std::int64_t row_offset = 0;   // first row written
  const float* scale = nullptr;  // FP8 outputs: quantization scale, 1 element (required)
  float* amax = nullptr;         // FP8 outputs: receives max |v| (optional)
};

struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;  // != 0: accumulate into D (D is also C); non-FP8 outputs only
  // FP8 per-tensor only: no periodic promotion to float32 (faster, less accurate).
  bool fast_accum = false;
  const void* bias = nullptr;  // [n], same memory space as the operands
  DType bias_dtype = DType::kBFloat16;
  bool gelu = false;  // tanh-approximated GELU after bias (NOTE [gemm output])
  int sm_count = 0;   // CUDA only: SMs the GEMM should plan for (0 = all of the device)
};

// The problem after validation, in row-major terms.
struct GemmShape {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
};

// Where a validated GEMM will run; GPU-only rules (NOTE [fp8 layout]) apply to GPU targets.
struct GemmTarget {
  bool host = true;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
};

// Throws kInvalidArgument for a wrong call and kUnsupported for a valid one that no kernel
// implements on `target`. Never touches memory. Returns m, n, k.
GemmShape validate_gemm(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
                        const GemmOptions& options, const GemmTarget& target);

// The target of GEMMs on `device` (-1: the host reference).
GemmTarget gemm_target(int device);

// The host reference: all pointers are host memory. Accumulates in float64 after
// dequantizing every operand element exactly (NOTE [gemm output]).
void gemm_host(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
               const GemmOptions& options);

// ---- the waiting grouped GEMM (NOTE [waiting gemm]) ---------------------------------------
//
// NOTE [waiting gemm]: ONE persistent kernel multiplies several groups (each its own A, B and
// D, one K) and, before it loads any tile of group g's A, waits until *flag_g >= value_g. An
// all-gather whose shards land by copy engine and announce themselves by flags then needs no
// GEMM launch, wait or join per shard: the GEMM consumes each shard as it lands, and the only
// tail left is the last shard's share of the GEMM (design §6.4.1). Groups run in the order
// given (tiles are handed out group by group), so give them in arrival order. Everything a
// group's flag stands for must be written by copy engines or memops, never by a kernel queued
// behind the GEMM: the GEMM holds every SM while it waits.
// The CUDA kernel is CUTLASS's Hopper pointer-array GEMM with a mainloop that waits
// (gemm/cuda/waiting_gemm.cu); it exists for sm_90 and a build with CUTLASS's headers. Its
// rules: bfloat16 A [m, k] (not transposed), B the [n, k] weight (transposed), D bfloat16;
// alpha any, beta 0, no bias or GELU; k and n multiples of 8, leading dimensions 16-byte
// multiples. On the host, a group is a wait and then gemm_host (the transport's default).
struct WaitingGemmGroup {
  GemmOperand a;
  GemmOperand b;
  GemmOutput d;
  const std::uint64_t* flag = nullptr;  // nullptr: the group waits for nothing
  std::uint64_t value = 0;
};

// Whether this build holds the CUDA waiting kernel (CUTLASS's headers were found).
bool waiting_gemm_built();

// The rules above on any target (so that the host transport refuses what the GPU could not
// run) and, for GPU targets, sm_90 and a build with the kernel. Throws kInvalidArgument for a
// wrong call and kUnsupported for a valid one no waiting kernel runs. Never touches memory.
void validate_waiting_gemm(const std::vector<WaitingGemmGroup>& groups, const GemmOptions& options,
                           const GemmTarget& target);

// NOTE [waiting gemm choice]: which instantiation (tile shape and cluster, NOTE [waiting gemm
// tiles]) runs a problem is measured, once per problem and process, like cuBLASLt's algorithms
// (NOTE [gemm autotune]: same switch and rounds, the context's tuning stream, scratch outputs,
// no waits): T_all, the whole problem, and T_last, the last group alone, per candidate. The
// pick minimises max(T_all, last_arrival_ms + T_last): when the last group lands after the
// others are done (a communication-bound op), what shows is its own time, and smaller tiles
// spread it over more SMs. last_arrival_ms is the caller's estimate of when the last group's
// flag is set, from the kernel's start (0: all are ready); T_last is not timed where that
// estimate makes the problem GEMM-bound. Untuned (autotuning off, or no scratch): shards of at
// most 256 rows take 64 x 128 tiles, larger ones 256 x 128; a problem met while autotuning was
// off is tuned by its first call after it is on. Verdict and figures: docs/performance-log.md
// [waiting gemm choice].
struct WaitingGemmChoice {
  std::string problem;  // groups, rows x n per group, k, SM target, last arrival
  std::string kernel;   // the chosen candidate's name
  bool tuned = false;
  double estimate_ms = 0.0;  // the objective above for the chosen candidate (0 untuned)
  std::vector<std::string> candidates;
  std::vector<double> all_ms;   // T_all per candidate (< 0: it could not run)
  std::vector<double> last_ms;  // T_last per candidate (0: not timed, GEMM-bound)
  std::string note;
};

// Every problem the process has chosen a waiting kernel for, in no particular order.
std::vector<WaitingGemmChoice> waiting_gemm_choices();

// The candidates' names, in the tuner's order (empty in a build without the kernel).
std::vector<std::string> waiting_gemm_candidates();
// Overrides the measured choice process-wide, for tests and A/B benchmarks: "" measures (the
// default), "untuned" takes the untuned rule, a candidate's name runs that candidate. kConfig
// for any other name. Returns the previous override.
std::string set_waiting_gemm_kernel(const std::string& name);
std::string waiting_gemm_kernel();  // the override ("" when the choice is measured)

#ifdef OVERLAP_WITH_CUDA
// The kernel on `device`, enqueued on `stream` (arguments staged through the GEMM context's
// stream-ordered pool; no host synchronisation, except when a new problem is tuned: NOTE
// [waiting gemm choice]). Validate first.
void waiting_gemm_cuda(const std::vector<WaitingGemmGroup>& groups, const GemmOptions& options,
                       int device, cudaStream_t stream, double last_arrival_ms);
#endif

// ---- algorithm autotuning (NOTE [gemm autotune] in gemm/cuda/autotune.h) ------------------

// How an untuned key picks its algorithm: the fastest of the heuristic's first
// `max_candidates`, each timed `rounds` times (disabled or 1 candidate: the first).
struct AutotuneConfig {
  bool enabled = true;
  int max_candidates = 8;
  int rounds = 5;
};
constexpr int kMaxAutotuneCandidates = 64;
constexpr int kMaxAutotuneRounds = 100;

// Throws kConfig naming the field when a value is out of range.
void validate_autotune_config(const AutotuneConfig& config);

// The process-wide configuration of lazy tuning; applies to keys tuned after the call.
void gemm_set_autotune(const AutotuneConfig& config);
AutotuneConfig gemm_autotune();

enum class TuneStatus : int {
  kCached = 0,   // the key was already tuned: its stored result, nothing timed now
  kTuned = 1,    // timed now
  kUntuned = 2,  // not tuned (see note): the heuristic's first result was used
};

// What tuning did for one GEMM key.
struct GemmTuneRecord {
  TuneStatus status = TuneStatus::kUntuned;
  int chosen = 0;                // index, in heuristic order, of the algorithm now cached
  std::vector<double> times_ms;  // median per candidate, heuristic order; < 0: it failed to run
  std::string note;              // why a key is untuned / which candidates failed
};

// A request to tune with an explicit configuration (pre-tuning); the outcome goes into *record.
struct TuneRequest {
  AutotuneConfig config;
  GemmTuneRecord* record = nullptr;
};

#ifdef OVERLAP_WITH_CUDA
// cuBLASLt on `device`, enqueued on `stream` with no host synchronisation (except the one-off
// tuning of a new key, NOTE [gemm autotune]). All pointers are device memory of `device`.
void gemm_cuda(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
               const GemmOptions& options, int device, cudaStream_t stream,
               const TuneRequest* tune = nullptr);
#endif

// ---- tensor front end (what the bindings call) ------------------------------------------

// The GEMM's tensors. a, b: 2-D; scale_inv tensors float32 (layout per NOTE [gemm scaling]);
// out: 2-D [rows, n] with unit column stride (a view of a larger buffer is fine); bias [n];
// out_scale, out_amax float32 with one element. nullptr = not given.
struct GemmTensors {
  const TensorRef* a = nullptr;
  const TensorRef* b = nullptr;
  const TensorRef* out = nullptr;
  const TensorRef* a_scale_inv = nullptr;
  const TensorRef* b_scale_inv = nullptr;
  const TensorRef* bias = nullptr;
  const TensorRef* out_scale = nullptr;
  const TensorRef* out_amax = nullptr;
};

struct GemmTensorOptions {
  bool transa = false;
  bool transb = false;
  ScalingMode a_scaling = ScalingMode::kNone;
  ScalingMode b_scaling = ScalingMode::kNone;
  std::int64_t row_offset = 0;
  GemmOptions options;
};

// Validates the tensors (devices, strides, scale shapes), then runs gemm_host for CPU tensors
// and gemm_cuda for CUDA tensors (with `tune`, see TuneRequest; CPU tensors record kUntuned).
void gemm(const GemmTensors& t, const GemmTensorOptions& o, cudaStream_t stream,
          const TuneRequest* tune = nullptr);

// ---- CUDA resources (per device) ----------------------------------------------------------

struct GemmCacheStats {
  std::int64_t hits = 0;     // GEMMs served from the cache (no heuristic query, no tuning)
  std::int64_t misses = 0;   // GEMMs that queried the heuristic (and tuned, when enabled)
  std::int64_t entries = 0;  // keys cached
  std::int64_t tuned = 0;    // keys whose algorithm was timed among candidates
};

// Algorithm-cache counters of `device` (all zero before its first GEMM, and without CUDA).
GemmCacheStats gemm_cache_stats(int device);

// Drops every cached algorithm (counters included) of every device.
void gemm_clear_cache();

// Synchronises and releases every device's GEMM resources; the next GEMM recreates them.
void gemm_release_resources();

}  // namespace overlap::gemm

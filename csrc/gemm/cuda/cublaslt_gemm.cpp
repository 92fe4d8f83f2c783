// gemm_cuda: the row-major GEMM of gemm/gemm.h on cuBLASLt.
//
// NOTE [row-major mapping]: cuBLASLt is column-major. A row-major matrix X [r, c] with
// leading dimension ld is, byte for byte, the column-major matrix X^T [c, r] with the same
// ld. So the row-major product D = op(A) op(B) ([m, n]) is computed as the column-major
//
//   D^T [n, m] = op(B)^T op(A)^T        i.e. cuBLAS (A, B, m, n, k) = (our B, our A, n, m, k)
//
// with no data movement: cuBLAS's A is our B (layout [b.cols, b.rows], ld b.ld, transa =
// b.transposed), cuBLAS's B is our A (layout [a.cols, a.rows], ld a.ld, transb =
// a.transposed), D is [n, m] with ld d.ld. Everything attached to an operand swaps with it:
// A_SCALE_POINTER/MODE carry our B's scales, B_SCALE_* our A's. The bias, one value per
// column of our D, is cuBLAS's per-row bias of D^T (length cuBLAS m = n), as it must be.
// cuBLAS's "TN" (transa = T, transb = N) is therefore our transb = true, transa = false:
// both operands K-contiguous, which is what FP8 needs on sm_90 (NOTE [fp8 layout]).
//
// NOTE [cublaslt block scale layout]: cuBLASLt (>= 12.9, sm_90) reads block scales as
//   VEC128_32F    for an operand with `outer` rows along which K runs: [ceil(K/128), outer]
//                 float32, outer contiguous (outer a multiple of 4);
//   BLK128x128_32F [ceil(outer/128), L4] float32 with L4 = ceil(ceil(K/128) / 4) * 4: the
//                 K-block index contiguous, each row padded to a multiple of 4.
// overlap's quantizers write [outer, ceil(K/128)] and [ceil(outer/128), ceil(K/128)]
// (NOTE [gemm scaling]), so 1x128 scales are transposed and 128x128 scales padded (when
// ceil(K/128) is not a multiple of 4) into the GEMM's stream-ordered scratch right before the
// matmul, on the same stream. (The same layouts TransformerEngine's Float8BlockQuantizer
// produces for cuBLASLt, and NVIDIA's LtBlk128x128Fp8Matmul sample consumes.)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda/cuda_check.h"
#include "common/cuda/device_guard.h"
#include "common/errors.h"
#include "gemm/cuda/autotune.h"
#include "gemm/cuda/gemm_context.h"
#include "gemm/cuda/scale_layout.h"
#include "gemm/gemm.h"

namespace overlap::gemm {

namespace {

// cuBLASLt's recommended workspace on Hopper.
constexpr std::size_t kWorkspaceBytes = 32u << 20;
constexpr std::size_t kScratchAlign = 256;
constexpr std::int64_t kBlock = 128;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      break;
  }
  OVERLAP_THROW(kInternal, "gemm: dtype " << dtype_name(t) << " passed validation");
}

cublasLtMatmulMatrixScale_t cuda_scale_mode(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kBlock1x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScalingMode::kBlock128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    default:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  }
}

// ---- RAII owners of the per-call cuBLASLt descriptors (host objects) -------------------------

// Owns one cuBLASLt descriptor. Descriptors live in host memory, so destroying one needs no
// device and is safe at any time, finalization included.
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
class LtObject {
 public:
  LtObject() = default;
  ~LtObject() {
    if (handle_ != nullptr) Destroy(handle_);
  }
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  Handle* out() { return &handle_; }  // for the Create call
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using MatmulDesc = LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using MatrixLayout = LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using MatmulPreference = LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

template <typename T>
void set(const MatmulDesc& desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  OVERLAP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc.get(), attr, &value, sizeof(value)));
}

template <typename T>
void set(const MatmulPreference& pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  OVERLAP_CHECK_CUBLAS(
      cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(value)));
}

// A column-major [rows, cols] layout with leading dimension ld.
void init_layout(MatrixLayout& layout, DType dtype, std::int64_t rows, std::int64_t cols,
                 std::int64_t ld) {
  OVERLAP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(layout.out(), cuda_type(dtype),
                                                  static_cast<std::uint64_t>(rows),
                                                  static_cast<std::uint64_t>(cols), ld));
}

// The largest power of two (<= 256) dividing the address: what cuBLASLt's kernels may assume.
std::uint32_t alignment_of(const void* p) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && addr % a != 0) a /= 2;
  return a;
}

std::size_t round_up(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

// Block-scaled operands come in pairs (validate_gemm), so one operand tells.
bool block_scaled(const GemmOperand& x) {
  return x.scaling == ScalingMode::kBlock1x128 || x.scaling == ScalingMode::kBlock128x128;
}

// Bytes of cuBLASLt-layout block scales for operand x (0 when its scales pass through).
std::size_t staged_scale_bytes(const GemmOperand& x) {
  const std::int64_t kblocks = (x.cols + kBlock - 1) / kBlock;
  if (x.scaling == ScalingMode::kBlock1x128) {
    return static_cast<std::size_t>(kblocks * x.rows) * sizeof(float);
  }
  if (x.scaling == ScalingMode::kBlock128x128 && kblocks % 4 != 0) {
    const std::int64_t rblocks = (x.rows + kBlock - 1) / kBlock;
    return static_cast<std::size_t>(rblocks * round_up(kblocks, 4)) * sizeof(float);
  }
  return 0;
}

// Writes x's block scales in cuBLASLt's layout into dst; returns the pointer cuBLASLt reads.
const float* stage_scales(const GemmOperand& x, float* dst, cudaStream_t stream) {
  const std::int64_t kblocks = (x.cols + kBlock - 1) / kBlock;
  if (x.scaling == ScalingMode::kBlock1x128) {
    transpose_block_scales(x.scale_inv, x.rows, kblocks, dst, stream);
    return dst;
  }
  if (x.scaling == ScalingMode::kBlock128x128 && kblocks % 4 != 0) {
    const std::int64_t rblocks = (x.rows + kBlock - 1) / kBlock;
    pad_block_scales(x.scale_inv, rblocks, kblocks, static_cast<std::int64_t>(round_up(kblocks, 4)),
                     dst, stream);
    return dst;
  }
  return x.scale_inv;
}

std::string describe(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
                     const GemmShape& s, const GemmOptions& o) {
  std::ostringstream oss;
  oss << "m=" << s.m << " n=" << s.n << " k=" << s.k << ", A " << dtype_name(a.dtype) << " ("
      << scaling_mode_name(a.scaling) << ", transa=" << (a.transposed ? "True" : "False") << ", ld "
      << a.ld << "), B " << dtype_name(b.dtype) << " (" << scaling_mode_name(b.scaling)
      << ", transb=" << (b.transposed ? "True" : "False") << ", ld " << b.ld << "), out "
      << dtype_name(d.dtype) << " (ld " << d.ld << "), bias "
      << (o.bias ? dtype_name(o.bias_dtype) : "none") << ", gelu " << (o.gelu ? "True" : "False")
      << ", beta " << o.beta << ", fast_accum " << (o.fast_accum ? "True" : "False")
      << ", sm_count " << o.sm_count;
  return oss.str();
}

// The four matrix layouts of a call, in cuBLAS terms (A = our B, B = our A).
struct Layouts {
  cublasLtMatrixLayout_t a, b, c, d;
};

// Minimum alignments (bytes) of A, B, C, D in cuBLAS terms.
struct Alignments {
  std::uint32_t a, b, c, d;
};

// The heuristic's first `count` algorithms for the call (at least one, or kUnsupported).
std::vector<cublasLtMatmulHeuristicResult_t> query_heuristics(
    const GemmContext& ctx, const MatmulDesc& desc, const Layouts& l, int count,
    const Alignments& align, const std::function<std::string()>& what) {
  MatmulPreference pref;
  OVERLAP_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(pref.out()));
  set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.a);
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.b);
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c);
  set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.d);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      ctx.handle(), desc.get(), l.a, l.b, l.c, l.d, pref.get(), count, results.data(), &found);
  OVERLAP_CHECK(st != CUBLAS_STATUS_NOT_SUPPORTED && found > 0, kUnsupported,
                "gemm: cuBLASLt " << cublasLtGetVersion() << " has no algorithm for " << what()
                                  << " on sm_" << ctx.target().cc_major << ctx.target().cc_minor
                                  << " (status " << detail::cublas_status_string(st) << ")");
  OVERLAP_CHECK_CUBLAS(st);
  results.resize(static_cast<std::size_t>(found));
  return results;
}

// What the candidates of a tuning compute: the real call's operands, into scratch.
struct TuneProblem {
  const GemmOperand& a;
  const GemmOperand& b;
  const GemmOutput& d;
  GemmShape s;
  float alpha;
  float beta;
};

// NOTE [gemm autotune]: times the candidates `h` on the context's tuning stream, writing
// scratch memory only, and returns the settled entry of the key. Leaves the descriptor's
// amax and block-scale pointers on the (freed) scratch: the real call sets them again.
AlgoEntry tune_key(GemmContext& ctx, const AutotuneConfig& config,
                   const std::vector<cublasLtMatmulHeuristicResult_t>& h, const TuneProblem& p,
                   const MatmulDesc& desc, const Layouts& l,
                   const std::function<std::string()>& what) {
  AlgoEntry entry;
  entry.algo = h[0].algo;
  entry.workspace = h[0].workspaceSize;
  entry.settled = true;
  GemmTuneRecord& rec = entry.record;
  const int count = static_cast<int>(h.size());
  if (count == 1) {
    rec.note = "the heuristic returned a single algorithm";
    return entry;
  }
  TuneResources& res = ctx.tune_resources();
  const cudaStream_t ts = res.stream.get();
  const bool fp8_out = dtype_is_fp8(p.d.dtype);
  // D is column-major [n, m] with leading dimension ld: m - 1 full columns and one of n.
  const std::size_t d_bytes =
      static_cast<std::size_t>((p.s.m - 1) * p.d.ld + p.s.n) * dtype_size(p.d.dtype);
  const std::size_t d_off = kWorkspaceBytes;
  const std::size_t amax_off = d_off + round_up(d_bytes, kScratchAlign);
  const std::size_t a_off = amax_off + kScratchAlign;
  const std::size_t b_off = a_off + round_up(staged_scale_bytes(p.a), kScratchAlign);
  const std::size_t total = b_off + round_up(staged_scale_bytes(p.b), kScratchAlign);
  {
    std::unique_ptr<ScratchBuffer> scratch = ScratchBuffer::try_create(res.pool.get(), total, ts);
    if (!scratch) {
      std::ostringstream note;
      note << "no device memory for the tuning scratch (" << total << " bytes)";
      rec.note = note.str();
      OVERLAP_WARN("gemm autotune: " << what() << ": " << rec.note
                                     << "; keeping the heuristic's first algorithm");
      return entry;
    }
    char* base = scratch->data();
    void* d_scratch = base + d_off;
    const void* c_scratch = fp8_out ? nullptr : d_scratch;  // beta != 0: in place, as for real
    if (p.d.amax != nullptr) {
      set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(base + amax_off));
    }
    if (block_scaled(p.a)) {
      const float* a_scales = stage_scales(p.a, reinterpret_cast<float*>(base + a_off), ts);
      const float* b_scales = stage_scales(p.b, reinterpret_cast<float*>(base + b_off), ts);
      set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(b_scales));
      set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scales));
    }
    const auto launch = [&](int i) {
      const cublasLtMatmulHeuristicResult_t& r = h[static_cast<std::size_t>(i)];
      if (r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > kWorkspaceBytes) return false;
      const cublasStatus_t st =
          cublasLtMatmul(ctx.handle(), desc.get(), &p.alpha, p.b.data, l.a, p.a.data, l.b, &p.beta,
                         c_scratch, l.c, d_scratch, l.d, &r.algo, base, kWorkspaceBytes, ts);
      if (st != CUBLAS_STATUS_SUCCESS) {
        (void)cudaGetLastError();  // a refused launch is not the caller's error
        return false;
      }
      return true;
    };
    rec.times_ms = time_candidates(count, config.rounds, ts, launch);
  }  // the scratch goes back to the tuning pool, stream-ordered
  OVERLAP_CHECK_CUDA(cudaStreamSynchronize(ts));
  OVERLAP_CHECK_CUDA(cudaMemPoolTrimTo(res.pool.get(), 0));  // and from there to the device

  const int failed = static_cast<int>(
      std::count_if(rec.times_ms.begin(), rec.times_ms.end(), [](double t) { return t < 0; }));
  const int best = pick_fastest(rec.times_ms);
  if (best < 0) {
    rec.note = "no candidate could run; keeping the heuristic's first algorithm";
    OVERLAP_WARN("gemm autotune: " << what() << ": " << rec.note);
    return entry;
  }
  rec.status = TuneStatus::kTuned;
  rec.chosen = best;
  entry.algo = h[static_cast<std::size_t>(best)].algo;
  entry.workspace = h[static_cast<std::size_t>(best)].workspaceSize;
  std::ostringstream msg;
  if (failed > 0) {
    msg << failed << " of " << count << " candidates could not run";
    rec.note = msg.str();
    msg.str("");
  }
  msg << "gemm autotune: " << what() << ": candidate " << best << " of " << count << " ("
      << rec.times_ms[static_cast<std::size_t>(best)] << " ms; the heuristic's first "
      << rec.times_ms[0] << " ms)";
  if (!rec.note.empty()) msg << "; " << rec.note;
  log_message(LogLevel::kInfo, msg.str());
  return entry;
}

}  // namespace

void gemm_cuda(const GemmOperand& a, const GemmOperand& b, const GemmOutput& d,
               const GemmOptions& o, int device, cudaStream_t stream, const TuneRequest* tune) {
  std::shared_ptr<GemmContext> ctx = gemm_context(device);
  const GemmShape s = validate_gemm(a, b, d, o, ctx->target());
  const bool fp8 = dtype_is_fp8(a.dtype);
  const bool fp8_out = dtype_is_fp8(d.dtype);
  const bool block = block_scaled(a);
  if (block) {
    OVERLAP_CHECK(cublasLtGetVersion() >= 120900, kUnsupported,
                  "gemm: block-scaled FP8 GEMMs need cuBLASLt >= 12.9, the process loaded "
                      << cublasLtGetVersion());
  }
  DeviceGuard guard(device);
  int stream_device = device;
  // cudaStreamGetDevice is not permitted on a capturing stream (NOTE [graph capture] in
  // comm/cuda/graph_log.h); the check is skipped for a captured GEMM. A captured GEMM is never
  // tuned either (NOTE [gemm autotune]).
  const bool capturing = stream_is_capturing(stream);
  if (!capturing) {
    OVERLAP_CHECK_CUDA(cudaStreamGetDevice(stream, &stream_device));
  }
  OVERLAP_CHECK_ARG(stream_device == device, "gemm: the stream belongs to cuda:"
                                                 << stream_device << " but the tensors are on cuda:"
                                                 << device << "; pass a stream of cuda:" << device);

  // NOTE [row-major mapping]: cuBLAS A = our B, cuBLAS B = our A, cuBLAS D = D^T.
  const cublasOperation_t op_a = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::size_t out_esize = dtype_size(d.dtype);
  void* d_ptr = static_cast<char*>(d.data) + d.row_offset * d.ld * out_esize;
  MatrixLayout a_layout, b_layout, c_layout, d_layout;
  init_layout(a_layout, b.dtype, b.cols, b.rows, b.ld);
  init_layout(b_layout, a.dtype, a.cols, a.rows, a.ld);
  init_layout(d_layout, d.dtype, s.n, s.m, d.ld);
  // FP8 outputs take a bf16/fp16 C that is never read (beta = 0 is enforced); its type
  // follows the bias, as cuBLASLt requires. Other outputs accumulate in place: C is D.
  const DType c_dtype = !fp8_out                                                 ? d.dtype
                        : (o.bias != nullptr && o.bias_dtype == DType::kFloat16) ? DType::kFloat16
                                                                                 : DType::kBFloat16;
  init_layout(c_layout, c_dtype, s.n, s.m, d.ld);
  const void* c_ptr = fp8_out ? nullptr : d_ptr;

  // bf16/fp16/FP8 run on tensor cores with float32 accumulation; float32 inputs get full
  // float32 math (no TF32), like torch.mm's default.
  MatmulDesc desc;
  OVERLAP_CHECK_CUBLAS(cublasLtMatmulDescCreate(desc.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set(desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set(desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (o.sm_count > 0) set(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, std::int32_t{o.sm_count});
  if (fp8) {
    set(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(o.fast_accum ? 1 : 0));
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
        static_cast<std::int32_t>(cuda_scale_mode(b.scaling)));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
        static_cast<std::int32_t>(cuda_scale_mode(a.scaling)));
    // Block scales are replaced by their staged copies below; the heuristic sees a pointer
    // either way.
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(b.scale_inv));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a.scale_inv));
  }
  if (fp8_out) {
    set(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, static_cast<const void*>(d.scale));
    if (d.amax != nullptr)
      set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(d.amax));
  }
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (o.bias != nullptr) {
    epilogue = o.gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, o.bias);
    // Non-FP8 GEMMs take the bias in D's type (the default); FP8 ones name it.
    if (fp8)
      set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
          static_cast<std::int32_t>(cuda_type(o.bias_dtype)));
  } else if (o.gelu) {
    epilogue = CUBLASLT_EPILOGUE_GELU;
  }
  set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);

  // NOTE [gemm cache key]: everything the heuristic sees. The descriptors' scale and bias
  // POINTERS are not in it (they do not change the choice); their presence and the pointers'
  // alignment classes are, since an algorithm picked for 256-byte-aligned operands may not
  // run on 16-byte-aligned ones. The same key is the unit of autotuning (NOTE [gemm
  // autotune]): the SM-count target is in it, so a GEMM that shares the GPU with
  // communication kernels is tuned for the SMs it plans for.
  const std::uint32_t align_a = alignment_of(b.data);
  const std::uint32_t align_b = alignment_of(a.data);
  const std::uint32_t align_d = alignment_of(d_ptr);
  AlgoKey key{};
  std::size_t f = 0;
  for (std::int64_t v : {s.m,
                         s.n,
                         s.k,
                         static_cast<std::int64_t>(a.dtype),
                         static_cast<std::int64_t>(b.dtype),
                         static_cast<std::int64_t>(d.dtype),
                         static_cast<std::int64_t>(c_dtype),
                         a.ld,
                         b.ld,
                         d.ld,
                         std::int64_t{a.transposed},
                         std::int64_t{b.transposed},
                         static_cast<std::int64_t>(a.scaling),
                         static_cast<std::int64_t>(b.scaling),
                         static_cast<std::int64_t>(epilogue),
                         o.bias != nullptr ? static_cast<std::int64_t>(o.bias_dtype) : -1,
                         std::int64_t{o.fast_accum},
                         std::int64_t{o.sm_count},
                         std::int64_t{o.beta != 0.0f},
                         std::int64_t{d.scale != nullptr},
                         std::int64_t{d.amax != nullptr},
                         std::int64_t{align_a},
                         std::int64_t{align_b},
                         std::int64_t{align_d}}) {
    key[f++] = v;
  }

  // NOTE [gemm autotune]: a settled key is a plain cache hit (the hot path: one lookup).
  cublasLtMatmulAlgo_t algo;
  std::size_t workspace = 0;
  bool settled = false;
  const bool cached = ctx->find_algo(key, &algo, &workspace, &settled);
  AutotuneConfig config;
  bool want_tune = false;
  const char* untuned_why = nullptr;
  if (!settled) {
    config = tune != nullptr ? tune->config : gemm_autotune();
    if (!config.enabled) {
      untuned_why = "autotuning is disabled";
    } else if (config.max_candidates == 1) {
      untuned_why = "max_candidates is 1";
    } else if (capturing) {
      untuned_why = "the stream is capturing a CUDA graph";
    } else {
      want_tune = true;
    }
  }
  if (!settled) ctx->count_lookup(cached && !want_tune);  // (find_algo counted settled hits)
  GemmTuneRecord record;
  if (!cached || want_tune) {
    const Layouts layouts{a_layout.get(), b_layout.get(), c_layout.get(), d_layout.get()};
    const std::vector<cublasLtMatmulHeuristicResult_t> h =
        query_heuristics(*ctx, desc, layouts, want_tune ? config.max_candidates : 1,
                         {align_a, align_b, fp8_out ? std::uint32_t{256} : align_d, align_d},
                         [&] { return describe(a, b, d, s, o); });
    if (!want_tune) {
      algo = h[0].algo;
      workspace = h[0].workspaceSize;
      ctx->insert_algo(key, AlgoEntry{algo, workspace, false, {}});
    } else {
      RelaxedCaptureMode relaxed;  // NOTE [gemm autotune]: another thread may be capturing
      std::lock_guard<std::mutex> tune_lock(ctx->tune_mutex());
      if (ctx->find_settled(key, &algo, &workspace, &record)) {  // tuned by another thread
        record.status = TuneStatus::kCached;
      } else {
        const TuneProblem p{a, b, d, s, o.alpha, fp8_out ? 0.0f : o.beta};
        AlgoEntry entry =
            tune_key(*ctx, config, h, p, desc, layouts, [&] { return describe(a, b, d, s, o); });
        algo = entry.algo;
        workspace = entry.workspace;
        record = entry.record;
        ctx->insert_algo(key, std::move(entry));
      }
    }
  } else if (settled && tune != nullptr) {  // (hits without a request copy nothing)
    cublasLtMatmulAlgo_t same;
    std::size_t same_workspace = 0;
    ctx->find_settled(key, &same, &same_workspace, &record);
    record.status = TuneStatus::kCached;
  }
  if (tune != nullptr && tune->record != nullptr) {
    if (untuned_why != nullptr) record = GemmTuneRecord{TuneStatus::kUntuned, 0, {}, untuned_why};
    *tune->record = record;
  }
  if (d.amax != nullptr) {  // tuning pointed it at scratch
    set(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, static_cast<void*>(d.amax));
  }

  // GPU work starts here: scratch (the algorithm's workspace + staged block scales) where the
  // call needs any (NOTE [gemm workspace]), then the matmul.
  const std::size_t a_stage = staged_scale_bytes(a);
  const std::size_t b_stage = staged_scale_bytes(b);
  const std::size_t a_off = round_up(workspace, kScratchAlign);
  const std::size_t b_off = a_off + round_up(a_stage, kScratchAlign);
  const std::size_t scratch_bytes = b_off + round_up(b_stage, kScratchAlign);
  // An eager GEMM allocates stream-ordered scratch even while another thread captures a graph
  // in global mode, which would forbid the allocation (and its free) on this thread: relaxed mode
  // until both are done, `relaxed` outliving `scratch` (a capturing stream keeps the thread's mode,
  // the allocation becoming a graph node).
  std::optional<RelaxedCaptureMode> relaxed;
  std::optional<ScratchBuffer> scratch;
  if (scratch_bytes > 0) {
    if (!capturing) relaxed.emplace();
    scratch.emplace(ctx->pool(), scratch_bytes, stream);
  }
  char* const base = scratch ? scratch->data() : nullptr;
  const auto staging = [&](std::size_t off) {  // (no scratch: nothing is staged)
    return base != nullptr ? reinterpret_cast<float*>(base + off) : nullptr;
  };
  if (block) {
    const float* a_scales = stage_scales(a, staging(a_off), stream);
    const float* b_scales = stage_scales(b, staging(b_off), stream);
    set(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(b_scales));
    set(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scales));
  }
  const float alpha = o.alpha;
  const float beta = fp8_out ? 0.0f : o.beta;
  OVERLAP_CHECK_CUBLAS(
      cublasLtMatmul(ctx->handle(), desc.get(), &alpha, b.data, a_layout.get(), a.data,
                     b_layout.get(), &beta, c_ptr, c_layout.get(), d_ptr, d_layout.get(), &algo,
                     workspace > 0 ? static_cast<void*>(base) : nullptr, workspace, stream));
}

}  // namespace overlap::gemm

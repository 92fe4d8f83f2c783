// The waiting grouped GEMM's rules (NOTE [waiting gemm] in gemm/gemm.h), on every build: the
// host transport refuses what the GPU kernel could not run, so CI sees the same errors.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "gemm/gemm.h"

namespace overlap::gemm {

namespace {

constexpr std::int64_t kAlignBytes = 16;  // TMA: base addresses and row pitches

bool aligned(const void* p, std::int64_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(bytes) == 0;
}

}  // namespace

bool waiting_gemm_built() {
#ifdef OVERLAP_WITH_CUTLASS
  return true;
#else
  return false;
#endif
}

#ifndef OVERLAP_WITH_CUDA
// No GPU kernel in this build (gemm/cuda/waiting_gemm.cu): nothing to choose from.
std::vector<WaitingGemmChoice> waiting_gemm_choices() {
  return {};
}

std::vector<std::string> waiting_gemm_candidates() {
  return {};
}

#endif

namespace {
std::mutex g_kernel_mutex;
std::string g_kernel;  // NOTE [waiting gemm choice]: the override, "" when measured
}  // namespace

std::string set_waiting_gemm_kernel(const std::string& name) {
  const std::vector<std::string> names = waiting_gemm_candidates();
  const bool known = name.empty() || name == "untuned" ||
                     std::find(names.begin(), names.end(), name) != names.end();
  if (!known) {
    std::ostringstream all;
    for (const std::string& n : names) all << ", '" << n << "'";
    OVERLAP_THROW(kConfig, "waiting gemm: no kernel named '"
                               << name << "'; one of '' (measured), 'untuned'" << all.str()
                               << (names.empty() ? " (this build has no waiting kernel)" : ""));
  }
  std::lock_guard<std::mutex> lock(g_kernel_mutex);
  std::string previous = g_kernel;
  g_kernel = name;
  return previous;
}

std::string waiting_gemm_kernel() {
  std::lock_guard<std::mutex> lock(g_kernel_mutex);
  return g_kernel;
}

void validate_waiting_gemm(const std::vector<WaitingGemmGroup>& groups, const GemmOptions& options,
                           const GemmTarget& target) {
  OVERLAP_CHECK_ARG(!groups.empty(), "waiting gemm: no group given");
  OVERLAP_CHECK(options.beta == 0.0f && options.bias == nullptr && !options.gelu, kUnsupported,
                "waiting gemm: no beta, bias or GELU epilogue (got beta "
                    << options.beta << (options.bias ? ", a bias" : "")
                    << (options.gelu ? ", gelu" : "")
                    << "); use the chunked GEMMs (fused_gemm=False) for those");
  const std::int64_t k = groups.front().a.cols;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const WaitingGemmGroup& g = groups[i];
    const GemmShape s = validate_gemm(g.a, g.b, g.d, options, target);
    OVERLAP_CHECK(g.a.dtype == DType::kBFloat16 && g.b.dtype == DType::kBFloat16 &&
                      g.d.dtype == DType::kBFloat16,
                  kUnsupported,
                  "waiting gemm: group " << i << " is " << dtype_name(g.a.dtype) << " x "
                                         << dtype_name(g.b.dtype) << " -> " << dtype_name(g.d.dtype)
                                         << "; the kernel multiplies bfloat16 into bfloat16 only "
                                            "(use fused_gemm=False for other dtypes)");
    OVERLAP_CHECK(!g.a.transposed && g.b.transposed, kUnsupported,
                  "waiting gemm: group " << i
                                         << " needs A [m, k] and the weight [n, k] (transa=False, "
                                            "transb=True; weight_layout='nk')");
    OVERLAP_CHECK_ARG(s.k == k, "waiting gemm: group " << i << " has k = " << s.k
                                                       << ", group 0 has k = " << k
                                                       << "; every group shares one k");
    OVERLAP_CHECK(
        s.k % 8 == 0 && s.n % 8 == 0 && g.a.ld % 8 == 0 && g.b.ld % 8 == 0 && g.d.ld % 8 == 0,
        kUnsupported,
        "waiting gemm: group " << i << " has k = " << s.k << ", n = " << s.n
                               << ", leading dimensions " << g.a.ld << "/" << g.b.ld << "/"
                               << g.d.ld << "; the kernel needs each a multiple of 8 elements");
    const char* d_first = static_cast<const char*>(g.d.data) + g.d.row_offset * g.d.ld * 2;
    OVERLAP_CHECK(aligned(g.a.data, kAlignBytes) && aligned(g.b.data, kAlignBytes) &&
                      aligned(d_first, kAlignBytes),
                  kUnsupported,
                  "waiting gemm: group " << i
                                         << "'s A, weight or first output row is not 16-byte "
                                            "aligned");
    OVERLAP_CHECK_ARG(g.flag == nullptr || aligned(g.flag, 8),
                      "waiting gemm: group " << i << "'s flag is not 8-byte aligned");
  }
  if (!target.host) {
    OVERLAP_CHECK(waiting_gemm_built(), kUnsupported,
                  "waiting gemm: this build has no waiting kernel (CUTLASS's headers were not "
                  "found at build time: pip install --no-deps nvidia-cutlass, or set "
                  "OVERLAP_CUTLASS_DIR, then rebuild)");
    OVERLAP_CHECK(target.cc_major == 9 && target.cc_minor == 0, kUnsupported,
                  "waiting gemm: the kernel exists for sm_90 (Hopper) only; the device is sm_"
                      << target.cc_major << target.cc_minor);
  }
}

}  // namespace overlap::gemm

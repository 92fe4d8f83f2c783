// The process-wide autotuning configuration (NOTE [gemm autotune] in gemm/cuda/autotune.h).
// Host code: a CUDA-less build keeps and validates it too, so Python sees one behaviour.
#include <mutex>

#include "common/errors.h"
#include "gemm/gemm.h"

namespace overlap::gemm {

namespace {

struct ConfigStore {
  std::mutex mutex;
  AutotuneConfig config;  // the defaults of the struct until Python sets the environment's
};

ConfigStore& store() {
  static ConfigStore s;
  return s;
}

}  // namespace

void validate_autotune_config(const AutotuneConfig& c) {
  OVERLAP_CHECK(c.max_candidates >= 1 && c.max_candidates <= kMaxAutotuneCandidates, kConfig,
                "gemm autotune: max_candidates must be in [1, "
                    << kMaxAutotuneCandidates << "] (1 = the heuristic's first), got "
                    << c.max_candidates);
  OVERLAP_CHECK(
      c.rounds >= 1 && c.rounds <= kMaxAutotuneRounds, kConfig,
      "gemm autotune: rounds must be in [1, " << kMaxAutotuneRounds << "], got " << c.rounds);
}

void gemm_set_autotune(const AutotuneConfig& config) {
  validate_autotune_config(config);
  ConfigStore& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.config = config;
}

AutotuneConfig gemm_autotune() {
  ConfigStore& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.config;
}

}  // namespace overlap::gemm

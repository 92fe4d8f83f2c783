// The waiting grouped GEMM (NOTE [waiting gemm] in gemm/gemm.h): which kernel runs a problem
// (NOTE [waiting gemm choice]) and its launches. The kernel itself: waiting_gemm_kernel.cuh
// (NOTE [waiting mainloop]), instantiated by the waiting_gemm_tiles_*.cu files.
//
// NOTE [waiting gemm tiles]: five instantiations, all handing tiles out in swaths of 8 (CUTLASS
// swizzle: L2 reuse of A and the weight): 64 x 128 ping-pong (small shards: the last shard's tiles
// spread over more SMs; probe 1.53 -> 1.23 x floor on small comm-bound rows), and the
// cooperative kernel with 128 x 128, 256 x 128 and 128 x 256 tiles, the last also as a 2-CTA
// cluster along M (the weight's tiles multicast to both CTAs). Tried and dropped (TP 2, 2xH200,
// docs/performance-log.md [waiting gemm choice]): swaths of 1, which the tuner's bursts rank
// with 8 (256 x 128: median 1.021 against 1.018 x the best candidate) but which, where the
// tuner took the untuned rule's tile with swath 1 (21 rows), ran slower inside the op on 15,
// by 1.4% in the median and up to 12% (the benchmark's sustained clocks: more L2 misses, more
// DRAM power); and 256 x 128 as a cluster, within 1% of the best on 22 of 112 problems against
// 50 for 128 x 256's. One fixed tile did not hold across shapes (the rule's 256 x 128: 1.018 x
// the best in the median, 64 x 128 up to 1.6 x on small rows).
// Verdict: measure the tile per problem (NOTE [waiting gemm choice]), swath 8 always.
#include <string>
#include <vector>

#include "gemm/gemm.h"

#ifndef OVERLAP_WITH_CUTLASS

#include "common/errors.h"

namespace overlap::gemm {

std::vector<WaitingGemmChoice> waiting_gemm_choices() {
  return {};
}

std::vector<std::string> waiting_gemm_candidates() {
  return {};
}

void waiting_gemm_cuda(const std::vector<WaitingGemmGroup>&, const GemmOptions&, int, cudaStream_t,
                       double) {
  OVERLAP_CHECK(false, kUnsupported,
                "waiting gemm: this build has no waiting kernel (CUTLASS's headers were not found "
                "at build time)");
}

}  // namespace overlap::gemm

#else

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "common/cuda/cuda_check.h"
#include "common/errors.h"
#include "gemm/cuda/autotune.h"
#include "gemm/cuda/gemm_context.h"
#include "gemm/cuda/waiting_gemm_kernel.cuh"
#include "gemm/cuda/waiting_gemm_tiles.h"

namespace overlap::gemm {

namespace waiting {

__global__ void store_block(Block block, unsigned bytes, unsigned char* dst) {
  for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = block.bytes[i];
}

void stage_block(const Block& block, unsigned bytes, unsigned char* dst, cudaStream_t stream) {
  // (clang-format would split the launch chevrons here)
  // clang-format off
  store_block<<<1, 256, 0, stream>>>(block, bytes, dst);
  // clang-format on
  OVERLAP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace waiting

namespace {

// NOTE [waiting gemm tiles]: the candidates, in the tuner's order (ties keep the earlier).
struct Tiles {
  const char* name;
  void (*launch)(const WaitingLaunch&);
};
constexpr Tiles kTiles[] = {
    {"64x128 ping-pong", launch_waiting_pp64x128},
    {"128x128", launch_waiting_co128x128},
    {"256x128", launch_waiting_co256x128},
    {"128x256", launch_waiting_co128x256},
    {"128x256 cluster 2x1", launch_waiting_co128x256_c2},
};
constexpr int kCandidates = static_cast<int>(sizeof(kTiles) / sizeof(kTiles[0]));
constexpr int kSwath = 8;
// Host time to enqueue one timed launch (staging, CUTLASS's initialize, the kernel, the
// scratch's stream-ordered allocation), generously (NOTE [gemm autotune]: the hold kernel).
constexpr std::uint64_t kWaitingHoldPerLaunchNs = 60'000;
// A last group doing `share` of the work is assumed to take at most this times share of the
// whole problem's time alone (NOTE [waiting gemm choice]).
constexpr double kTailSlack = 1.5;

// The untuned rule (NOTE [waiting gemm choice]): 64 x 128 up to 256 rows a shard, else 256 x
// 128 (the choice before tuning, docs/performance-log.md [fused ag_gemm]).
constexpr std::int64_t kSmallTileMaxRows = 256;
int untuned_pick(const std::vector<WaitingGemmGroup>& groups) {
  std::int64_t max_rows = 0;
  for (const WaitingGemmGroup& g : groups) max_rows = std::max(max_rows, g.a.rows);
  return max_rows <= kSmallTileMaxRows ? 0 : 2;
}

std::string candidate_name(int c) {
  return kTiles[c].name;
}

// Enqueues `groups` with candidate c, kWaitingMaxGroups per launch, in order.
void run(const std::vector<WaitingGemmGroup>& groups, int c, float alpha, int device, int sm_count,
         cudaMemPool_t pool, cudaStream_t stream) {
  const int total = static_cast<int>(groups.size());
  for (int first = 0; first < total; first += kWaitingMaxGroups) {
    WaitingLaunch l;
    l.groups = groups.data() + first;
    l.count = std::min(kWaitingMaxGroups, total - first);
    l.alpha = alpha;
    l.device = device;
    l.sm_count = sm_count;
    l.swizzle = kSwath;
    l.pool = pool;
    l.stream = stream;
    kTiles[c].launch(l);
  }
}

struct Choice {
  int pick = 0;
  // False for the untuned rule's pick while autotuning was off: the first call after it is on
  // again tunes (as for cuBLASLt's keys, NOTE [gemm autotune]).
  bool settled = true;
  WaitingGemmChoice record;
};

// The process's choices (NOTE [waiting gemm choice]), keyed by problem.
struct ChoiceCache {
  std::mutex mutex;
  std::map<std::vector<std::int64_t>, Choice> entries;
};
ChoiceCache& choice_cache() {
  static ChoiceCache* cache = new ChoiceCache();  // never destroyed: read at interpreter exit
  return *cache;
}

std::vector<std::int64_t> problem_key(const std::vector<WaitingGemmGroup>& groups, int device,
                                      int sm_count, double last_arrival_ms) {
  // The arrival in 10-us steps: the estimate follows the shape, so this only separates callers
  // that estimate differently.
  std::vector<std::int64_t> key{device, sm_count, static_cast<std::int64_t>(groups.size()),
                                groups.front().a.cols,
                                static_cast<std::int64_t>(std::llround(last_arrival_ms * 100.0))};
  for (const WaitingGemmGroup& g : groups) {
    key.push_back(g.a.rows);
    key.push_back(g.b.rows);
  }
  return key;
}

std::string describe_problem(const std::vector<WaitingGemmGroup>& groups, int sm_count,
                             double last_arrival_ms) {
  std::ostringstream s;
  s << groups.size() << " groups of ";
  const WaitingGemmGroup& f = groups.front();
  const bool uniform = std::all_of(groups.begin(), groups.end(), [&](const WaitingGemmGroup& g) {
    return g.a.rows == f.a.rows && g.b.rows == f.b.rows;
  });
  if (uniform) {
    s << f.a.rows << " x " << f.b.rows;
  } else {
    for (std::size_t i = 0; i < groups.size(); ++i) {
      s << (i ? "," : "") << groups[i].a.rows << "x" << groups[i].b.rows;
    }
  }
  s << " (m x n), k " << f.a.cols << ", " << sm_count << " SMs, last group expected at "
    << std::fixed << std::setprecision(3) << last_arrival_ms << " ms";
  return s.str();
}

// NOTE [waiting gemm choice]: times every candidate on the tuning stream (scratch outputs, no
// waits) and picks. The caller holds ctx.tune_mutex().
Choice tune(GemmContext& ctx, const std::vector<WaitingGemmGroup>& groups, float alpha,
            int sm_count, double last_arrival_ms, const AutotuneConfig& config,
            const std::string& problem) {
  Choice choice;
  choice.pick = untuned_pick(groups);
  WaitingGemmChoice& rec = choice.record;
  rec.problem = problem;
  for (int c = 0; c < kCandidates; ++c) rec.candidates.push_back(candidate_name(c));
  TuneResources& res = ctx.tune_resources();
  const cudaStream_t ts = res.stream.get();
  // Scratch outputs, packed ([rows, n] per group), in place of the caller's.
  std::vector<WaitingGemmGroup> timed = groups;
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (const WaitingGemmGroup& g : timed) {
    offsets.push_back(total);
    total += waiting::align_up(static_cast<std::size_t>(g.a.rows * g.b.rows) * 2, 256);
  }
  {
    std::unique_ptr<ScratchBuffer> scratch = ScratchBuffer::try_create(res.pool.get(), total, ts);
    if (!scratch) {
      std::ostringstream note;
      note << "no device memory for the tuning scratch (" << total << " bytes)";
      rec.note = note.str();
      OVERLAP_WARN("waiting gemm: " << problem << ": " << rec.note << "; keeping "
                                    << candidate_name(choice.pick));
      rec.kernel = candidate_name(choice.pick);
      return choice;
    }
    for (std::size_t i = 0; i < timed.size(); ++i) {
      WaitingGemmGroup& g = timed[i];
      g.d.data = scratch->data() + offsets[i];
      g.d.row_offset = 0;
      g.d.ld = g.b.rows;
      g.flag = nullptr;
    }
    const auto guarded = [](const auto& f) {
      try {
        f();
        return true;
      } catch (const Error&) {
        (void)cudaGetLastError();  // a candidate CUTLASS refuses is not the caller's error
        return false;
      }
    };
    rec.all_ms = time_candidates(
        kCandidates, config.rounds, ts,
        [&](int c) {
          return guarded([&] { run(timed, c, alpha, ctx.device(), sm_count, res.pool.get(), ts); });
        },
        kWaitingHoldPerLaunchNs);
    // The last group alone, per candidate, unless the problem is GEMM-bound by the estimate: a last
    // group doing `share` of the work takes at most kTailSlack x share of the whole (small groups
    // scale worse), so a last arrival before (1 - kTailSlack x share) x T_all cannot show.
    double work = 0.0;
    for (const WaitingGemmGroup& g : timed) work += static_cast<double>(g.a.rows * g.b.rows);
    const double share = static_cast<double>(timed.back().a.rows * timed.back().b.rows) / work;
    const int fastest = pick_fastest(rec.all_ms);
    rec.last_ms.assign(kCandidates, 0.0);
    if (fastest >= 0 && last_arrival_ms > (1.0 - kTailSlack * share) * rec.all_ms[fastest]) {
      const std::vector<WaitingGemmGroup> last{timed.back()};
      rec.last_ms = time_candidates(
          kCandidates, config.rounds, ts,
          [&](int c) {
            return guarded(
                [&] { run(last, c, alpha, ctx.device(), sm_count, res.pool.get(), ts); });
          },
          kWaitingHoldPerLaunchNs);
    } else {
      rec.note = "GEMM-bound by the estimate: the last group alone was not timed";
    }
  }  // the scratch goes back to the tuning pool, stream-ordered
  OVERLAP_CHECK_CUDA(cudaStreamSynchronize(ts));
  OVERLAP_CHECK_CUDA(cudaMemPoolTrimTo(res.pool.get(), 0));

  // The objective, ranked like cuBLASLt's candidates (pick_fastest: ties keep the earlier,
  // smaller tiles); < 0 for a candidate that could not run.
  std::vector<double> objective(kCandidates, -1.0);
  for (int c = 0; c < kCandidates; ++c) {
    const double all = rec.all_ms[c];
    const double tail = rec.last_ms[c];
    if (all < 0.0 || tail < 0.0) continue;
    objective[c] = tail > 0.0 ? std::max(all, last_arrival_ms + tail) : all;
  }
  const int best = pick_fastest(objective);
  if (best < 0) {
    rec.note = "no candidate could run; keeping the untuned choice";
    OVERLAP_WARN("waiting gemm: " << problem << ": " << rec.note);
    rec.kernel = candidate_name(choice.pick);
    return choice;
  }
  choice.pick = best;
  rec.tuned = true;
  rec.kernel = candidate_name(best);
  const double best_ms = objective[best];
  rec.estimate_ms = best_ms;
  std::ostringstream msg;
  msg << "waiting gemm: " << problem << ": " << rec.kernel << " (" << best_ms
      << " ms estimated; whole " << rec.all_ms[best] << " ms, last group " << rec.last_ms[best]
      << " ms)";
  log_message(LogLevel::kInfo, msg.str());
  return choice;
}

}  // namespace

std::vector<std::string> waiting_gemm_candidates() {
  std::vector<std::string> names;
  for (int c = 0; c < kCandidates; ++c) names.push_back(candidate_name(c));
  return names;
}

std::vector<WaitingGemmChoice> waiting_gemm_choices() {
  ChoiceCache& cache = choice_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  std::vector<WaitingGemmChoice> out;
  for (const auto& [key, choice] : cache.entries) out.push_back(choice.record);
  return out;
}

void waiting_gemm_cuda(const std::vector<WaitingGemmGroup>& groups, const GemmOptions& options,
                       int device, cudaStream_t stream, double last_arrival_ms) {
  const std::shared_ptr<GemmContext> ctx = gemm_context(device);
  const int sm_count = options.sm_count > 0 ? options.sm_count : ctx->target().sm_count;
  const std::string forced = waiting_gemm_kernel();
  if (!forced.empty()) {  // NOTE [waiting gemm choice]: the override (tests, A/B benchmarks)
    int c = untuned_pick(groups);
    for (int i = 0; i < kCandidates; ++i) {
      if (candidate_name(i) == forced) c = i;
    }
    run(groups, c, options.alpha, device, sm_count, ctx->pool(), stream);
    return;
  }
  const std::vector<std::int64_t> key = problem_key(groups, device, sm_count, last_arrival_ms);
  ChoiceCache& cache = choice_cache();
  const auto settled_pick = [&](bool tuning_on) {  // the cached pick to run, -1 for none
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto it = cache.entries.find(key);
    if (it == cache.entries.end()) return -1;
    return it->second.settled || !tuning_on ? it->second.pick : -1;
  };
  const AutotuneConfig config = gemm_autotune();
  const bool tuning_on = config.enabled && config.max_candidates != 1;
  int pick = settled_pick(tuning_on);
  if (pick < 0) {
    const std::string problem = describe_problem(groups, sm_count, last_arrival_ms);
    Choice choice;
    // Never under capture (the transport runs the chunked pulls there, NOTE [fused ag_gemm]);
    // checked all the same, since tuning synchronises.
    const bool capturing = stream_is_capturing(stream);
    if (!tuning_on || capturing) {
      choice.pick = untuned_pick(groups);
      choice.settled = false;
      choice.record.problem = problem;
      choice.record.kernel = candidate_name(choice.pick);
      choice.record.note =
          capturing ? "the stream is capturing a CUDA graph" : "autotuning is disabled";
    } else {
      RelaxedCaptureMode relaxed;  // NOTE [gemm autotune]: another thread may be capturing
      std::lock_guard<std::mutex> tune_lock(ctx->tune_mutex());
      pick = settled_pick(true);  // tuned by another thread meanwhile?
      if (pick < 0) {
        choice = tune(*ctx, groups, options.alpha, sm_count, last_arrival_ms, config, problem);
      }
    }
    if (pick < 0) {
      pick = choice.pick;
      if (!capturing) {  // a capturing stream's pick is not kept: the next eager call tunes
        std::lock_guard<std::mutex> lock(cache.mutex);
        cache.entries.insert_or_assign(key, std::move(choice));
      }
    }
  }
  run(groups, pick, options.alpha, device, sm_count, ctx->pool(), stream);
}

}  // namespace overlap::gemm

#endif  // OVERLAP_WITH_CUTLASS

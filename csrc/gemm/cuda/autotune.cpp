// Candidate timing for GEMM autotuning (NOTE [gemm autotune] in gemm/cuda/autotune.h).
#include "gemm/cuda/autotune.h"

#include <algorithm>
#include <cstddef>

#include "common/cuda/cuda_check.h"
#include "common/errors.h"
#include "common/lifecycle.h"

namespace overlap::gemm {

namespace {

// Host time to enqueue one timed run (cublasLtMatmul + an event record), generously: the hold
// covers the enqueue of every timed run, up to kMaxHoldNs.
constexpr std::uint64_t kHoldPerLaunchNs = 20'000;
constexpr std::uint64_t kMaxHoldNs = 20'000'000;

// RAII owner of timing events (destroyed after the synchronisation that reads them).
class TimingEvents {
 public:
  explicit TimingEvents(std::size_t count) {
    events_.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      OVERLAP_CHECK_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
  }
  ~TimingEvents() {
    if (process_finalizing()) return;
    for (cudaEvent_t e : events_) OVERLAP_WARN_CUDA(cudaEventDestroy(e));
  }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
  cudaEvent_t operator[](std::size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &status);
  if (err != cudaSuccess) {
    // e.g. cudaErrorStreamCaptureImplicit: the legacy stream while a blocking stream
    // captures. Not an error of the GEMM: clear it so that no later check reports it.
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

RelaxedCaptureMode::RelaxedCaptureMode() : previous_(cudaStreamCaptureModeRelaxed) {
  OVERLAP_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&previous_));
  exchanged_ = true;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (!exchanged_) return;
  cudaStreamCaptureMode mode = previous_;
  OVERLAP_WARN_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
}

std::vector<double> time_candidates(int count, int rounds, cudaStream_t stream,
                                    const std::function<bool(int)>& launch) {
  OVERLAP_CHECK(count >= 1 && rounds >= 1, kInternal,
                "gemm autotune: " << count << " candidates, " << rounds << " rounds");
  std::vector<double> result(static_cast<std::size_t>(count), -1.0);
  // Warm-up: loads each candidate's kernels (lazy module loading) and drops the ones that
  // cannot launch.
  std::vector<int> alive;
  for (int i = 0; i < count; ++i) {
    if (launch(i)) alive.push_back(i);
  }
  if (alive.empty()) {
    OVERLAP_CHECK_CUDA(cudaStreamSynchronize(stream));
    return result;
  }
  const std::size_t launches = alive.size() * static_cast<std::size_t>(rounds);
  hold_stream(stream, std::min<std::uint64_t>(kHoldPerLaunchNs * launches, kMaxHoldNs));
  TimingEvents events(launches + 1);
  std::vector<int> who;  // candidate of each timed run, -1 when its launch failed
  who.reserve(launches);
  OVERLAP_CHECK_CUDA(cudaEventRecord(events[0], stream));
  for (int r = 0; r < rounds; ++r) {
    for (int i : alive) {
      who.push_back(launch(i) ? i : -1);
      OVERLAP_CHECK_CUDA(cudaEventRecord(events[who.size()], stream));
    }
  }
  OVERLAP_CHECK_CUDA(cudaEventSynchronize(events[launches]));

  std::vector<std::vector<double>> samples(static_cast<std::size_t>(count));
  std::vector<bool> failed(static_cast<std::size_t>(count), false);
  for (std::size_t s = 0; s < launches; ++s) {
    if (who[s] < 0) {
      // Which candidate failed: the s-th run in round-robin order.
      failed[static_cast<std::size_t>(alive[s % alive.size()])] = true;
      continue;
    }
    float ms = 0.0f;
    OVERLAP_CHECK_CUDA(cudaEventElapsedTime(&ms, events[s], events[s + 1]));
    samples[static_cast<std::size_t>(who[s])].push_back(ms);
  }
  for (int i : alive) {
    const auto u = static_cast<std::size_t>(i);
    // A candidate that failed once is not trusted: it is dropped like one that never ran.
    if (!failed[u] && !samples[u].empty()) result[u] = median(samples[u]);
  }
  return result;
}

int pick_fastest(const std::vector<double>& times_ms) {
  int best = -1;
  for (std::size_t i = 0; i < times_ms.size(); ++i) {
    const double t = times_ms[i];
    if (t < 0) continue;
    if (best < 0 || t < times_ms[static_cast<std::size_t>(best)] * (1.0 - kTieTolerance)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace overlap::gemm

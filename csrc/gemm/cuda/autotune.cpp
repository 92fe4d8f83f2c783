// Candidate timing for GEMM autotuning (NOTE [gemm autotune] in gemm/cuda/autotune.h).
#include "gemm/cuda/autotune.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "common/cuda/cuda_check.h"
#include "common/errors.h"
#include "common/lifecycle.h"

namespace overlap::gemm {

namespace {

// The hold covers the enqueue of every timed run, up to kMaxHoldNs.
constexpr std::uint64_t kMaxHoldNs = 20'000'000;
// A timed sample is a burst of back-to-back launches of one candidate lasting about this long
// (at most kMaxBurst launches).
constexpr double kBurstTargetMs = 0.2;
constexpr int kMaxBurst = 8;

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
                                    const std::function<bool(int)>& launch,
                                    std::uint64_t hold_per_launch_ns) {
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
  std::vector<bool> failed(static_cast<std::size_t>(count), false);
  // One timed pass of `passes` round-robin rounds, each candidate's sample `burst` launches
  // back to back between two events; returns the per-launch ms of every sample.
  const auto timed = [&](int passes, int burst) {
    const std::size_t samples = alive.size() * static_cast<std::size_t>(passes);
    const std::size_t launches = samples * static_cast<std::size_t>(burst);
    hold_stream(stream, std::min<std::uint64_t>(hold_per_launch_ns * launches, kMaxHoldNs));
    TimingEvents events(samples + 1);
    OVERLAP_CHECK_CUDA(cudaEventRecord(events[0], stream));
    for (std::size_t s = 0; s < samples; ++s) {
      const int i = alive[s % alive.size()];
      for (int b = 0; b < burst; ++b) {
        if (!launch(i)) failed[static_cast<std::size_t>(i)] = true;
      }
      OVERLAP_CHECK_CUDA(cudaEventRecord(events[s + 1], stream));
    }
    OVERLAP_CHECK_CUDA(cudaEventSynchronize(events[samples]));
    std::vector<std::vector<double>> ms(static_cast<std::size_t>(count));
    for (std::size_t s = 0; s < samples; ++s) {
      float t = 0.0f;
      OVERLAP_CHECK_CUDA(cudaEventElapsedTime(&t, events[s], events[s + 1]));
      ms[static_cast<std::size_t>(alive[s % alive.size()])].push_back(static_cast<double>(t) /
                                                                      burst);
    }
    return ms;
  };
  // Calibration: one launch each sets the burst (NOTE [gemm autotune]: bursts of about
  // kBurstTargetMs, so that a short kernel is timed back to back, as the chunk GEMMs of an op
  // run).
  const std::vector<std::vector<double>> once = timed(1, 1);
  double shortest = 0.0;
  for (int i : alive) {
    const auto& t = once[static_cast<std::size_t>(i)];
    if (!t.empty() && t[0] > 0.0 && (shortest == 0.0 || t[0] < shortest)) shortest = t[0];
  }
  const int burst = shortest <= 0.0
                        ? kMaxBurst
                        : static_cast<int>(std::clamp(std::ceil(kBurstTargetMs / shortest), 1.0,
                                                      static_cast<double>(kMaxBurst)));
  const std::vector<std::vector<double>> samples = timed(rounds, burst);
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

// Timing of cuBLASLt algorithm candidates: the machinery of GEMM autotuning. CUDA builds only.
//
// NOTE [gemm autotune]: cuBLASLt's heuristic first pick is a few percent off the fastest on some
// shapes (the overlap ops' FP8 chunk shapes most of all), so the first GEMM of a key (NOTE [gemm
// cache key] in cublaslt_gemm.cpp) may time the top N and cache the fastest. Invariants:
//   - Once per key, process and device (overlap.gemm.autotune() pre-tunes at start-up, so no op
//     tunes mid-schedule).
//   - On the context's private stream, which never waits for the caller's: waiting could
//     deadlock a pipelined schedule whose queued work waits for a peer that waits for us.
//   - Candidates write scratch outputs only (freed afterwards); the caller's output is written
//     once, by the real call with the chosen algorithm. Over-budget workspaces and failed
//     launches are skipped; without scratch the heuristic's first is kept.
//   - Medians of round-robin passes of back-to-back bursts (~0.2 ms, the way chunk GEMMs run),
//     behind a hold kernel so the GPU, not the host, is timed; near-ties (kTieTolerance) go to
//     the heuristic's order.
//   - Never while the caller's stream captures a graph (the first pick is cached unsettled);
//     tuning runs in relaxed capture mode so other threads' captures survive it.
//   - The cache's mutex is never held while tuning; a per-device tune mutex, with a re-check,
//     tunes a key once. Near-ties may differ between processes: OVERLAP_GEMM_AUTOTUNE=0 for
//     bit-identical reruns.
// Verdict: tune in bursts; long steady-state windows gave no ranking that held. Measured:
// docs/performance-log.md [gemm autotune].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace overlap::gemm {

// A candidate must be faster than the best so far by this fraction to replace it.
constexpr double kTieTolerance = 0.01;

// True when `stream` is capturing (or its capture state cannot be told: tuning is skipped).
bool stream_is_capturing(cudaStream_t stream);

// RAII: the calling thread in cudaStreamCaptureModeRelaxed for a scope.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_;
  bool exchanged_ = false;
};

// Keeps `stream` busy for about `ns` nanoseconds (one thread sleeping on the global timer).
void hold_stream(cudaStream_t stream, std::uint64_t ns);

// Host time to enqueue one timed run of a cuBLASLt candidate (cublasLtMatmul + an event
// record), generously: the hold kernel covers the enqueue of every timed run (up to 20 ms).
constexpr std::uint64_t kHoldPerLaunchNs = 20'000;

// Times candidates 0..count-1 on `stream` (NOTE [gemm autotune]); launch(i) returns false if
// candidate i could not be launched. Synchronises `stream`. Returns the median ms per launch,
// -1 for dropped candidates. hold_per_launch_ns: the host's time to enqueue one launch.
std::vector<double> time_candidates(int count, int rounds, cudaStream_t stream,
                                    const std::function<bool(int)>& launch,
                                    std::uint64_t hold_per_launch_ns = kHoldPerLaunchNs);

// The fastest candidate (ties to the lower index), -1 when none ran.
int pick_fastest(const std::vector<double>& times_ms);

}  // namespace overlap::gemm

// Timing of cuBLASLt algorithm candidates: the machinery of GEMM autotuning. CUDA builds only.
//
// NOTE [gemm autotune]: cuBLASLt's heuristic ranks algorithms by a model; its first pick is
// a few percent off the fastest on some shapes (the per-chunk FP8 shapes of the overlap ops
// most of all). So the first GEMM of a key (NOTE [gemm cache key] in cublaslt_gemm.cpp) may
// time the heuristic's top N and cache the fastest; every later GEMM of the key reuses it.
//
//   - Once per key, per process and device: the first call is slower (N warm-up runs plus
//     N x rounds timed runs and one host synchronisation on the tuning stream; tens to a few
//     hundred ms for the large shapes). overlap.gemm.autotune() pre-tunes a list of problems
//     at start-up so that no overlap op tunes in the middle of a pipelined schedule.
//   - Private stream: candidates run on the context's own non-blocking stream, which never
//     waits for the caller's stream. Waiting for it could deadlock a pipelined schedule (the
//     caller's queued work may wait on a flag that a peer rank sets only after its own host
//     returns from the GEMM being tuned) and would make the host wait for the whole queue.
//     The inputs are read while the caller's stream may still be writing them: timing does
//     not depend on the values, and nothing the candidates compute is ever used.
//   - Scratch outputs: candidates write a scratch D (and C, when beta != 0: in place, like the
//     real call), a scratch amax and their own staged block scales, from a pool that returns
//     its memory to the device afterwards (release threshold 0, trimmed). The caller's output
//     is written once, by the real call, enqueued on the caller's stream with the chosen
//     algorithm after tuning: results differ from untuned ones only by the choice of
//     algorithm. If the scratch cannot be allocated the key keeps the heuristic's first.
//   - Workspace: candidates are asked for with the real call's workspace limit (32 MiB) and
//     any that reports needing more is skipped; a candidate whose launch fails is skipped.
//   - Selection: medians over `rounds` round-robin passes (every candidate sees the same
//     clocks and neighbours); a candidate replaces the best so far only when faster by more
//     than kTieTolerance, so near-ties go to the heuristic's order (fewer run-to-run changes).
//     A hold kernel keeps the stream busy while the host enqueues the timed passes, so that
//     small GEMMs are timed by the GPU, not by the host's launch rate. Each sample is a burst
//     of back-to-back launches of one candidate (a calibration pass of single launches sets
//     the burst so that a sample lasts ~0.2 ms, at most 8 launches): short kernels rank
//     differently alone between other candidates' kernels than back to back, which is how the
//     chunk GEMMs of an op and a training step's repeated GEMMs run (docs/performance-log.md
//     [gemm autotune]).
//   - CUDA graphs: never tune while the caller's stream is capturing (the synchronisation
//     would fail and invalidate the capture): the heuristic's first is used and cached
//     unsettled, to be tuned by the next eager call. Tuning itself switches the thread to the
//     relaxed capture mode, so that another thread's capture (global mode) is not broken by
//     the tuning stream's synchronisation, which never touches a capturing stream.
//   - Threads: the cache has its own mutex (never held while tuning); tunings on one device
//     are serialised by the context's tune mutex, and a thread that acquires it re-checks the
//     cache, so a key is tuned once even when several threads miss it together.
//   - Reproducibility: different processes may pick different algorithms for a key when two
//     candidates are within noise of each other; turn tuning off (OVERLAP_GEMM_AUTOTUNE=0)
//     for bit-identical reruns.
//   - Steady state, tried and not kept: a GPU running one large GEMM back to back is
//     power-limited within milliseconds, its GEMMs up to 20% slower than in the bursts timed
//     here, but timing the candidates in such windows gave no ranking that held from one run
//     to the next, so long windows would buy nothing reproducible for their tuning time
//     (docs/performance-log.md [gemm autotune]).
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

// Times candidates 0..count-1 on `stream`: one warm-up launch each, one calibration pass of
// single launches, then `rounds` round-robin passes of bursts (NOTE [gemm autotune]), each
// burst between two events. launch(i) enqueues candidate i and returns false if it could not
// be launched (the candidate is dropped). Synchronises `stream`. Returns the median
// milliseconds per launch of each candidate, -1 for the dropped ones.
std::vector<double> time_candidates(int count, int rounds, cudaStream_t stream,
                                    const std::function<bool(int)>& launch);

// The index of the fastest candidate (times < 0 are skipped), ties (kTieTolerance) to the
// lower index; -1 when none ran.
int pick_fastest(const std::vector<double>& times_ms);

}  // namespace overlap::gemm

// Side streams that let one op run several copies at once (NOTE [lanes] in transport.h).
//
// Every caller stream gets its own set of lanes, so two ops issued on two streams (say, a
// bulk all-gather beside a reduce-scatter) never serialise on shared side streams. fork()
// records an event on the caller's stream that every lane waits for; join() records an event
// on each lane that the caller's stream waits for. Both are plain event edges, which is what
// CUDA-graph capture needs to turn them into graph dependencies.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "comm/cuda/cuda_memory.h"

namespace overlap::comm::cuda {

class Lanes {
 public:
  explicit Lanes(int device) : device_(device) {}

  void fork(cudaStream_t caller, int lanes);
  void join(cudaStream_t caller);
  // `lane` waits for the work issued so far on `other` (both of the fork open on `caller`).
  void wait(cudaStream_t caller, int lane, int other);
  // The stream of `lane` (0: the caller itself) of the fork open on `caller`.
  cudaStream_t stream(cudaStream_t caller, int lane);
  // A side stream of `caller`, outside every fork, that waits for the work issued so far on
  // `caller` (an event edge) and that nothing waits for: for work whose latency must not
  // delay the caller, such as the watchdog's marker writes (NOTE [one marker per op]).
  cudaStream_t beside(cudaStream_t caller);

 private:
  struct Set {
    OwnedEvent forked;
    std::vector<std::unique_ptr<OwnedStream>> streams;  // lanes 1..n-1
    std::vector<std::unique_ptr<OwnedEvent>> done;      // per lane 1..n-1, for join()
    std::vector<std::unique_ptr<OwnedEvent>> marks;     // per lane 0..n-1, for wait()
    std::unique_ptr<OwnedStream> side;                  // beside()
    OwnedEvent side_mark;                               // beside()'s edge from the caller
    int open = 0;                                       // lanes of the open fork (0: none)
  };
  Set& set_of(cudaStream_t caller);

  int device_;
  std::mutex mu_;
  std::unordered_map<cudaStream_t, std::unique_ptr<Set>> sets_;
};

}  // namespace overlap::comm::cuda

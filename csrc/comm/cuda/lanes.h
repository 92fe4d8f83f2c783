// Side streams that let one op run several copies at once (NOTE [lanes] in transport.h). Every
// caller stream has its own lanes, so ops on two streams never serialise on shared side streams.
// fork() and join() are plain event edges, which graph capture turns into dependencies.
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
  // A side stream after `caller`'s work so far that nothing waits for (NOTE [one marker per op]).
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

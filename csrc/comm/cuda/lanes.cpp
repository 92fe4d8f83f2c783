#include "comm/cuda/lanes.h"

#include "common/cuda/cuda_check.h"
#include "common/errors.h"

namespace overlap::comm::cuda {

Lanes::Set& Lanes::set_of(cudaStream_t caller) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& set = sets_[caller];
  if (!set) set = std::make_unique<Set>();
  return *set;
}

void Lanes::fork(cudaStream_t caller, int lanes) {
  Set& s = set_of(caller);
  // A fork left open by an op that threw half-way is simply replaced: its lanes are ordered
  // before the new fork's by the event edge below.
  OVERLAP_CHECK(lanes >= 1, kInternal, "fork() needs at least one lane, got " << lanes);
  while (static_cast<int>(s.streams.size()) < lanes - 1) {
    s.streams.push_back(std::make_unique<OwnedStream>(device_));
    s.done.push_back(std::make_unique<OwnedEvent>());
  }
  while (static_cast<int>(s.marks.size()) < lanes)
    s.marks.push_back(std::make_unique<OwnedEvent>());
  OVERLAP_CHECK_CUDA(cudaEventRecord(s.forked.get(), caller));
  for (int i = 0; i < lanes - 1; ++i) {
    OVERLAP_CHECK_CUDA(cudaStreamWaitEvent(s.streams[i]->get(), s.forked.get(), 0));
  }
  s.open = lanes;
}

void Lanes::join(cudaStream_t caller) {
  Set& s = set_of(caller);
  OVERLAP_CHECK(s.open > 0, kInternal, "join() without fork()");
  for (int i = 0; i < s.open - 1; ++i) {
    OVERLAP_CHECK_CUDA(cudaEventRecord(s.done[i]->get(), s.streams[i]->get()));
    OVERLAP_CHECK_CUDA(cudaStreamWaitEvent(caller, s.done[i]->get(), 0));
  }
  s.open = 0;
}

void Lanes::wait(cudaStream_t caller, int lane, int other) {
  if (lane == other) return;
  cudaStream_t waiter = stream(caller, lane);
  cudaStream_t source = stream(caller, other);
  Set& s = set_of(caller);
  OVERLAP_CHECK_CUDA(cudaEventRecord(s.marks[other]->get(), source));
  OVERLAP_CHECK_CUDA(cudaStreamWaitEvent(waiter, s.marks[other]->get(), 0));
}

cudaStream_t Lanes::stream(cudaStream_t caller, int lane) {
  if (lane == 0) return caller;
  Set& s = set_of(caller);
  OVERLAP_CHECK(lane > 0 && lane < s.open, kInternal,
                "lane " << lane << " is not open (fork opened " << s.open << ")");
  return s.streams[lane - 1]->get();
}

cudaStream_t Lanes::beside(cudaStream_t caller) {
  Set& s = set_of(caller);
  if (!s.side) s.side = std::make_unique<OwnedStream>(device_);
  OVERLAP_CHECK_CUDA(cudaEventRecord(s.side_mark.get(), caller));
  OVERLAP_CHECK_CUDA(cudaStreamWaitEvent(s.side->get(), s.side_mark.get(), 0));
  return s.side->get();
}

}  // namespace overlap::comm::cuda

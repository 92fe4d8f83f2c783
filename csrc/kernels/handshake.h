// handshake: a one-block kernel that signals flags and waits for flags with SM loads and
// stores, for the points of an op where the SMs are idle (NOTE [handshakes] in
// comm/transport.h).
#pragma once

#include <cstdint>

#include "common/stream.h"

namespace overlap::kernels {

// Bounds of one handshake (64 ranks: one signal and one wait per peer, one word per rank).
constexpr int kMaxHandshakeFlags = 64;
constexpr int kMaxHandshakeWords = 64;

// One 4-byte word to copy (an FP8 scale_inv into a buffer slot); either side may be a peer
// GPU's memory mapped by CUDA IPC.
struct HandshakeWord {
  std::uint32_t* dst = nullptr;
  const std::uint32_t* src = nullptr;
};

// In this order: copy `before` words; make every earlier write of the stream and those words
// visible to the whole system, then store `value` into every flag of `signals` (release);
// wait until every `waits[i]` holds at least `wait_values[i]` (acquire); copy `after` words.
// Flags may be in pinned host memory or a peer GPU's memory.
struct HandshakeParams {
  int num_before = 0;
  int num_signals = 0;
  int num_waits = 0;
  int num_after = 0;
  std::uint64_t value = 0;
  HandshakeWord before[kMaxHandshakeWords];
  std::uint64_t* signals[kMaxHandshakeFlags];
  const std::uint64_t* waits[kMaxHandshakeFlags];
  std::uint64_t wait_values[kMaxHandshakeFlags];
  HandshakeWord after[kMaxHandshakeWords];
};

#ifdef OVERLAP_WITH_CUDA
// Launches the handshake on `stream` (one block). Throws kInvalidArgument for counts beyond
// the bounds.
void handshake_cuda(const HandshakeParams& p, cudaStream_t stream);
#endif

}  // namespace overlap::kernels

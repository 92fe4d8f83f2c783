// The opening of every op on a symmetric buffer: epochs, acknowledgements and op records
// (NOTE [buffer reuse] in collectives.h, NOTE [op records] in op_protocol.cpp). Shared by the
// collectives and the comm-GEMM overlap ops, which follow the same protocol.
#pragma once

#include <cstdint>

#include "comm/symmetric_buffer.h"

namespace overlap::comm {

// Opens op `code` on `buf`: checks the buffer and the stream, takes the next epoch, publishes
// this rank's op record (code + a hash of `arg`, which should cover every size the peers must
// agree on), acknowledges the previous op to every peer and waits (stream-ordered on cuda)
// until every peer has acknowledged it too. Returns the op's epoch. Call it only after every
// argument has been validated: from here on the peers count on this rank.
std::uint64_t begin_op(SymmetricBuffer& buf, OpCode code, std::uint64_t arg, const char* op,
                       cudaStream_t stream);

// Mixes one more value into an op-record argument (order matters).
inline std::uint64_t mix_arg(std::uint64_t arg, std::uint64_t value) {
  return arg * 1000003u + value * 31u + 1u;
}

}  // namespace overlap::comm

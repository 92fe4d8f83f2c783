// The opening of every op on a symmetric buffer: epochs, acknowledgements and op records
// (NOTE [buffer reuse] in collectives.h, NOTE [op records] in op_protocol.cpp).
#pragma once

#include <cstdint>
#include <exception>
#include <utility>

#include "comm/symmetric_buffer.h"
#include "common/errors.h"

namespace overlap::comm {

// NOTE [deferred acknowledgements]: peer p's acknowledgement of op e says p has finished op e-1,
// so op e may write into p's region (and, if p pulled from us, into ours). An op that only
// PUSHES therefore needs p's acknowledgement only on the lane that writes into p (wait_ack()),
// and local work such as AG+GEMM's first chunk GEMM starts at once. begin_op still waits for
// all of them up front after an op in which peers read our region, on the host transport
// (exact op-record check), under graph capture (a replay may follow another op) and for
// OpAccess::handshake. Verdict: defer only where it is safe.
struct OpAccess {
  bool pushes_only = false;  // no peer reads this rank's region in this op
  // Every acknowledgement up front in one handshake kernel (no GEMM beside the op here).
  bool handshake = false;
};

// Opens op `code` on `buf`: takes the next epoch, publishes the op record (code + a hash of
// `arg`, covering every size the peers must agree on), acknowledges the previous op and waits
// for the peers' (NOTE [deferred acknowledgements]). Returns the epoch. Call it only after
// every argument is validated: from here on the peers count on this rank.
std::uint64_t begin_op(SymmetricBuffer& buf, OpCode code, std::uint64_t arg, const char* op,
                       cudaStream_t stream, OpAccess access = {});

// Push-only ops, before the first write into `peer` on `lane`: wait for its acknowledgement.
void wait_ack(SymmetricBuffer& buf, std::uint64_t epoch, int peer, const char* op,
              cudaStream_t stream, int lane);

// Runs one op on `buf` holding a Use (NOTE [destroy while in use]); an exception escaping it
// after begin_op fails the transport (NOTE [failed transport]). Every binding entry runs in it.
template <typename Op>
void run_op(SymmetricBuffer& buf, Op&& op) {
  const SymmetricBuffer::Use use(buf, "op");
  const std::uint64_t before = buf.epoch();
  try {
    std::forward<Op>(op)();
  } catch (const Error& e) {
    if (buf.epoch() != before) buf.transport().fail(e.kind(), e.what());
    throw;
  } catch (const std::exception& e) {
    if (buf.epoch() != before) buf.transport().fail(ErrorKind::kInternal, e.what());
    throw;
  } catch (...) {
    if (buf.epoch() != before) buf.transport().fail(ErrorKind::kInternal, "unknown exception");
    throw;
  }
}

// Mixes one more value into an op-record argument (order matters).
inline std::uint64_t mix_arg(std::uint64_t arg, std::uint64_t value) {
  return arg * 1000003u + value * 31u + 1u;
}

}  // namespace overlap::comm

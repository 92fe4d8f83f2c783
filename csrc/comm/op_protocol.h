// The opening of every op on a symmetric buffer: epochs, acknowledgements and op records
// (NOTE [buffer reuse] in collectives.h, NOTE [op records] in op_protocol.cpp). Shared by the
// collectives and the comm-GEMM overlap ops, which follow the same protocol.
#pragma once

#include <cstdint>
#include <exception>
#include <utility>

#include "comm/symmetric_buffer.h"
#include "common/errors.h"

namespace overlap::comm {

// NOTE [deferred acknowledgements]: an acknowledgement of op e from peer p (kAck = e, NOTE
// [buffer reuse] in collectives.h) says that p has finished op e-1, so op e may write into p's
// region; and, where p read our region in op e-1 (pulls), that we may write our own. An op
// that only PUSHES (writes peers' regions, never reads them) therefore needs peer p's
// acknowledgement only on the lane that writes into p, right before that write, and none at
// all for work that stays local, such as the first chunk GEMM of AG+GEMM, which can start
// while the acknowledgements are still on their way. Such an op opens with
// OpAccess{.pushes_only = true} and calls wait_ack() before its first write into each peer;
// begin_op still waits for every acknowledgement up front (a barrier, as for other ops) where
// that is needed for safety or for the op-record check:
//   - after an op in which peers read our region (SymmetricBuffer::peers_read_last_op());
//   - on the host transport, which runs in program order (no latency to hide, and the
//     op-record check stays exact);
//   - while a CUDA graph is captured (a replay may follow an op other than the one that
//     preceded the capture);
//   - where the op asks for its acknowledgements in one handshake (OpAccess::handshake).
struct OpAccess {
  bool pushes_only = false;  // no peer reads this rank's region in this op
  // Wait for every acknowledgement up front (even where pushes_only would let the op wait
  // per peer) and exchange them in one handshake (NOTE [handshakes] in transport.h: an SM
  // kernel on cuda): for ops whose caller's stream has no GEMM running beside it at this
  // point.
  bool handshake = false;
};

// Opens op `code` on `buf`: checks the buffer and the stream, takes the next epoch, publishes
// this rank's op record (code + a hash of `arg`, which should cover every size the peers must
// agree on), acknowledges the previous op to every peer and, unless NOTE [deferred
// acknowledgements] lets the op wait per peer, waits (stream-ordered on cuda) until every peer
// has acknowledged it too. Returns the op's epoch. Call it only after every argument has been
// validated: from here on the peers count on this rank.
std::uint64_t begin_op(SymmetricBuffer& buf, OpCode code, std::uint64_t arg, const char* op,
                       cudaStream_t stream, OpAccess access = {});

// For ops opened with OpAccess{.pushes_only = true}: work issued later on `lane` waits until
// `peer` has acknowledged op `epoch` (a no-op where begin_op has already waited for every
// acknowledgement). Call it before the op's first write into `peer`'s region on that lane.
void wait_ack(SymmetricBuffer& buf, std::uint64_t epoch, int peer, const char* op,
              cudaStream_t stream, int lane);

// NOTE [failed transport] in transport.h: runs `op` (one call of an op on `buf`); an exception
// that escapes it after the op took an epoch (in begin_op, from where the peers count on this
// rank) fails the buffer's transport before it propagates: the record check's mismatch, a
// timeout, any error in the middle of the op. Errors raised before begin_op (bad arguments)
// fail nothing, so a rejected call leaves the buffer usable. The op holds a Use of the buffer
// throughout (NOTE [destroy while in use] in symmetric_buffer.h). Every op's entry point in
// the binding layer runs in it.
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

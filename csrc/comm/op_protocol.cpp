#include "comm/op_protocol.h"

#include <string>

#include "common/errors.h"

namespace overlap::comm {

namespace {

// NOTE [op records]: before acknowledging op e, every rank writes "op #e: <op, argument hash>"
// into its record slot in every peer's flags, and afterwards compares the records of peers at
// the same epoch with its own. A peer is at most one op ahead, so two slots alternating by
// epoch parity suffice. Ranks calling different ops (or sizes) get a typed error naming both
// instead of exchanging the wrong bytes. Checked on the host at issue time; best effort on cuda.
//
// NOTE [op sequence]: on the host transport every peer has acknowledged e before we compare,
// and the next op lies an odd number of epochs later (the other slot), so e's slot must hold e:
// any other epoch means the op sequences are out of step (an op failed or was skipped on one
// rank) and a leftover flag could satisfy this op's waits. Verdict: raise on the host; on cuda,
// where a peer's host may be behind, skip such records.
constexpr int kEpochShift = 24;

FlagSlot record_slot(std::uint64_t epoch) {
  return epoch % 2 ? FlagSlot::kOpOdd : FlagSlot::kOpEven;
}

std::uint64_t op_record(std::uint64_t epoch, OpCode code, std::uint64_t arg) {
  const std::uint64_t arg_hash = (arg * 0x9E3779B97F4A7C15ull) >> 48;  // 16 bits
  return (epoch << kEpochShift) | (static_cast<std::uint64_t>(code) << 16) | arg_hash;
}

const char* op_name(std::uint64_t record) {
  switch (static_cast<OpCode>((record >> 16) & 0xff)) {
    case OpCode::kAllGather:
      return "all_gather";
    case OpCode::kReduceScatter:
      return "reduce_scatter";
    case OpCode::kBarrier:
      return "barrier";
    case OpCode::kAllGatherGemm:
      return "ag_gemm";
    case OpCode::kGemmReduceScatter:
      return "gemm_rs";
    case OpCode::kBulkAllGather:
      return "bulk_all_gather";
    case OpCode::kBulkReduceScatter:
      return "bulk_reduce_scatter";
  }
  return "an unknown op";
}

// `exact`: NOTE [op sequence] (every peer's record of `epoch` must be there).
void check_op_records(const SymmetricBuffer& buf, std::uint64_t mine, std::uint64_t epoch,
                      bool exact) {
  const int r = buf.rank();
  for (int peer = 0; peer < buf.size(); ++peer) {
    if (peer == r) continue;
    const std::uint64_t theirs =
        __atomic_load_n(buf.flag(r, peer, record_slot(epoch)), __ATOMIC_ACQUIRE);
    if (theirs == mine) continue;
    if ((theirs >> kEpochShift) != epoch) {
      if (!exact) continue;
      OVERLAP_THROW(kState, "op sequence out of step on a symmetric buffer: rank "
                                << r << " issued " << op_name(mine) << " as op #" << epoch
                                << " but rank " << peer << " has no op #" << epoch
                                << " (its op in that record slot: "
                                << (theirs == 0 ? std::string("none")
                                                : op_name(theirs) + std::string(" as op #") +
                                                      std::to_string(theirs >> kEpochShift))
                                << "); an earlier op failed or was skipped on some rank");
    }
    const bool same_op = ((theirs ^ mine) & 0xff0000) == 0;
    OVERLAP_THROW(kState, "collective mismatch on a symmetric buffer: rank "
                              << r << " issued " << op_name(mine) << " as op #" << epoch
                              << " but rank " << peer << " issued " << op_name(theirs)
                              << (same_op ? " with different sizes, dtypes or settings" : "")
                              << "; every rank must call the same ops, with the same sizes, "
                                 "dtypes and settings, in the same order");
  }
}

}  // namespace

std::uint64_t begin_op(SymmetricBuffer& buf, OpCode code, std::uint64_t arg, const char* op,
                       cudaStream_t stream, OpAccess access) {
  buf.check_ready(op);
  Transport& t = buf.transport();
  t.raise_if_failed();
  t.check_stream(stream);
  // Keyed by the root: a window's ops are its root's (NOTE [buffer windows]).
  t.order_ops(&buf.root(), stream);  // NOTE [ops on several streams]
  const std::uint64_t epoch = buf.next_epoch();
  t.note_op(buf.root(), epoch, stream);
  const int r = buf.rank();
  const int n = buf.size();
  const std::uint64_t record = op_record(epoch, code, arg);
  for (int i = 1; i < n; ++i) {
    __atomic_store_n(buf.flag((r + i) % n, r, record_slot(epoch)), record, __ATOMIC_RELEASE);
  }
  // kAck = e: waiting for e (not e-1) makes even the first op a barrier.
  // NOTE [acknowledgement order]: the signals go out one after another, so the last peer hears
  // several us after the first. Reverse ring order (r-1 first): ring-order pushes write into
  // r+1 first, so r-1 needs ours first. Verdict: guards against a slow phase. Measured:
  // docs/performance-log.md [acknowledgement order].
  const bool wait_all = access.handshake || !access.pushes_only || buf.peers_read_last_op() ||
                        t.kind() == TransportKind::kHost || t.capturing(stream);
  buf.set_peers_read_last_op(!access.pushes_only);
  const auto ack_wait = [&](int peer) {
    return FlagWait{buf.flag(r, peer, FlagSlot::kAck), epoch,
                    WaitContext{op, r, peer, 0, epoch, buf.timeout_s()}};
  };
  if (wait_all && access.handshake) {
    // The marker first, so that it covers the handshake kernel's waits.
    t.op_begun(stream);
    Handshake h;
    h.value = epoch;
    for (int i = 1; i < n; ++i) {
      const int peer = (r + n - i) % n;
      h.signals.push_back(buf.flag(peer, r, FlagSlot::kAck));
      h.waits.push_back(ack_wait(peer));
    }
    t.handshake(h, stream, 0);
  } else {
    for (int i = 1; i < n; ++i) {
      const int peer = (r + n - i) % n;
      t.signal(buf.flag(peer, r, FlagSlot::kAck), epoch, stream, 0);
    }
    t.op_begun(stream);  // NOTE [one marker per op]: after the acknowledgements
    for (int i = 1; wait_all && i < n; ++i) {
      const FlagWait w = ack_wait((r + n - i) % n);
      t.wait(w.flag, w.value, w.ctx, stream, 0);
    }
  }
  if (wait_all) buf.set_acked_epoch(epoch);
  check_op_records(buf, record, epoch, /*exact=*/t.kind() == TransportKind::kHost);
  return epoch;
}

void wait_ack(SymmetricBuffer& buf, std::uint64_t epoch, int peer, const char* op,
              cudaStream_t stream, int lane) {
  if (buf.acked_epoch() == epoch) return;  // begin_op waited for every acknowledgement
  WaitContext ctx{op, buf.rank(), peer, 0, epoch, buf.timeout_s()};
  buf.transport().wait(buf.flag(buf.rank(), peer, FlagSlot::kAck), epoch, ctx, stream, lane);
}

}  // namespace overlap::comm

#include "comm/transport.h"

#include <sstream>

namespace overlap::comm {

const char* transport_name(TransportKind kind) {
  return kind == TransportKind::kHost ? "host" : "cuda";
}

std::string describe_timeout(const WaitContext& ctx, std::uint64_t seen, std::uint64_t wanted) {
  std::ostringstream oss;
  oss << ctx.op << ": rank " << ctx.rank << " timed out after " << ctx.timeout_s
      << " s waiting for peer " << ctx.peer << " at step " << ctx.step << " (epoch " << ctx.epoch
      << ", flag " << seen << " < " << wanted
      << "). Did the peer crash, hang, or call a different op?";
  return oss.str();
}

void Transport::record_fault(ErrorKind kind, const std::string& message) const noexcept {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (failed_) return;  // the first fault wins
  try {
    fault_ = message;
  } catch (...) {  // out of memory: failed all the same, without the message
  }
  fault_kind_ = kind;
  failed_ = true;
}

void Transport::fail(ErrorKind kind, const std::string& message) noexcept {
  try {
    poll_faults();  // an asynchronous fault found earlier comes first
  } catch (...) {
  }
  record_fault(kind, message);
}

bool Transport::failed() const {
  poll_faults();
  std::lock_guard<std::mutex> lock(fault_mu_);
  return failed_;
}

std::string Transport::failure() const {
  poll_faults();
  std::lock_guard<std::mutex> lock(fault_mu_);
  return fault_;
}

void Transport::raise_if_failed() const {
  poll_faults();
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (!failed_) return;
  std::ostringstream oss;
  oss << "the communicator failed earlier and refuses every op on its buffers; the first fault: "
      << fault_ << " [destroy the communicator and its buffers and create new ones]";
  throw Error(fault_kind_, oss.str());
}

void Transport::handshake(const Handshake& h, cudaStream_t stream, int lane) {
  constexpr std::size_t kWord = 4;
  for (const WordCopy& c : h.before) put(c.dst, c.src, kWord, stream, lane);
  for (std::uint64_t* flag : h.signals) signal(flag, h.value, stream, lane);
  for (const FlagWait& w : h.waits) wait(w.flag, w.value, w.ctx, stream, lane);
  for (const WordCopy& c : h.after) put(c.dst, c.src, kWord, stream, lane);
}

}  // namespace overlap::comm

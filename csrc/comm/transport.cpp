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

std::string describe_peer_failure(const WaitContext& ctx, std::uint64_t seen,
                                  std::uint64_t wanted) {
  std::ostringstream oss;
  oss << ctx.op << ": rank " << ctx.rank << " stopped waiting for peer " << ctx.peer << " at step "
      << ctx.step << " (epoch " << ctx.epoch << "): peer " << ctx.peer
      << "'s communicator failed before it got there (its flag holds " << (seen & ~kPoisonBit)
      << " < " << wanted
      << " and the poison mark: it timed out, was aborted or hit an error in the middle of an "
         "op)";
  return oss.str();
}

Transport::Transport() : flags_(std::make_shared<FlagRegistry>()) {}

void Transport::record_fault(ErrorKind kind, const std::string& message) const noexcept {
  {
    std::lock_guard<std::mutex> lock(fault_mu_);
    if (failed_) return;  // the first fault wins
    try {
      fault_ = message;
    } catch (...) {  // out of memory: failed all the same, without the message
    }
    fault_kind_ = kind;
    failed_ = true;
    failed_fast_.store(true, std::memory_order_release);
  }
  // NOTE [poisoned flags]: the peers learn of it; then every wait of ours stops (NOTE [abort]).
  try {
    flags_->poison_outgoing();
  } catch (...) {
  }
  on_failed();
}

void Transport::poll_faults(bool peers) const noexcept {
  try {
    poll_async_faults();  // an asynchronous fault found earlier comes first
    if (abort_requested_.load(std::memory_order_acquire)) {
      record_fault(ErrorKind::kAborted, "aborted: Communicator.abort was called");
    }
    if (peers && !failed_fast_.load(std::memory_order_acquire)) {
      const int peer = flags_->find_poisoned_peer();
      if (peer >= 0) {
        std::ostringstream oss;
        oss << "peer " << peer
            << "'s communicator failed (its flags carry the poison mark: it timed out, was "
               "aborted or hit an error in the middle of an op), so this communicator cannot "
               "complete another op with it";
        record_fault(ErrorKind::kTimeout, oss.str());
      }
    }
  } catch (...) {
  }
}

void Transport::fail(ErrorKind kind, const std::string& message) noexcept {
  poll_faults(/*peers=*/false);
  record_fault(kind, message);
}

void Transport::request_abort() noexcept {
  abort_requested_.store(true, std::memory_order_release);
  on_abort();
}

bool Transport::failed() const {
  poll_faults(/*peers=*/true);
  std::lock_guard<std::mutex> lock(fault_mu_);
  return failed_;
}

std::string Transport::failure() const {
  poll_faults(/*peers=*/true);
  std::lock_guard<std::mutex> lock(fault_mu_);
  return fault_;
}

void Transport::raise_if_failed() const {
  poll_faults(/*peers=*/true);
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (!failed_) return;
  std::ostringstream oss;
  oss << "the communicator failed earlier and refuses every op on its buffers; the first fault: "
      << fault_ << " [destroy the communicator and its buffers and create new ones]";
  throw Error(fault_kind_, oss.str());
}

void Transport::raise_stopped(const WaitContext& ctx) const {
  poll_faults(/*peers=*/true);
  std::lock_guard<std::mutex> lock(fault_mu_);
  std::ostringstream oss;
  oss << ctx.op << ": rank " << ctx.rank << " stopped waiting for peer " << ctx.peer << " at step "
      << ctx.step << " (epoch " << ctx.epoch
      << "): the communicator failed: " << (failed_ ? fault_ : std::string("aborted"))
      << " [destroy the communicator and its buffers and create new ones]";
  throw Error(failed_ ? fault_kind_ : ErrorKind::kAborted, oss.str());
}

void Transport::raise_peer_failed(const WaitContext& ctx, std::uint64_t seen, std::uint64_t value) {
  const std::string what = describe_peer_failure(ctx, seen, value);
  fail(ErrorKind::kTimeout, what);
  throw Error(ErrorKind::kTimeout, what);
}

void Transport::raise_interrupted(const WaitContext& ctx) {
  std::ostringstream oss;
  oss << ctx.op << ": rank " << ctx.rank << " waiting for peer " << ctx.peer << " at step "
      << ctx.step << " (epoch " << ctx.epoch << ") was " << interrupted_message();
  const std::string what = oss.str();
  fail(ErrorKind::kAborted, what);
  request_abort();
  throw Error(ErrorKind::kAborted, what);
}

void Transport::handshake(const Handshake& h, cudaStream_t stream, int lane) {
  constexpr std::size_t kWord = 4;
  for (const WordCopy& c : h.before) put(c.dst, c.src, kWord, stream, lane);
  for (std::uint64_t* flag : h.signals) signal(flag, h.value, stream, lane);
  for (const FlagWait& w : h.waits) wait(w.flag, w.value, w.ctx, stream, lane);
  for (const WordCopy& c : h.after) put(c.dst, c.src, kWord, stream, lane);
}

void Transport::waiting_gemm(const std::vector<gemm::WaitingGemmGroup>& groups,
                             const std::vector<WaitContext>& ctxs, const gemm::GemmOptions& options,
                             double /*last_arrival_ms*/, cudaStream_t stream, int lane) {
  OVERLAP_CHECK(
      ctxs.size() == groups.size(), kInternal,
      "waiting_gemm: " << groups.size() << " groups but " << ctxs.size() << " wait contexts");
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const gemm::WaitingGemmGroup& g = groups[i];
    if (g.flag != nullptr) wait(g.flag, g.value, ctxs[i], stream, lane);
    gemm(g.a, g.b, g.d, options, stream, lane);
  }
}

}  // namespace overlap::comm

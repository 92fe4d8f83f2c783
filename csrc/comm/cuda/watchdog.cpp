#include "comm/cuda/watchdog.h"

#include <algorithm>

#include "common/errors.h"

namespace overlap::comm::cuda {

namespace {
// How often the watchdog looks at pending waits: a timeout is reported within this much of
// its deadline. Small against any sensible timeout, large enough to cost no CPU to speak of.
constexpr std::chrono::milliseconds kPollInterval(5);
}  // namespace

Watchdog::Watchdog(std::shared_ptr<FlagRegistry> flags)
    : flags_(std::move(flags)), markers_(kMarkers * sizeof(std::uint64_t)) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Watchdog::Ticket Watchdog::arm(const std::uint64_t* flag, std::uint64_t value,
                               const WaitContext& ctx, const Ticket* reached_with) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  const std::uint64_t seq = reached_with != nullptr ? reached_with->seq : next_seq_++;
  auto* f = const_cast<std::uint64_t*>(flag);
  if (stopped()) {  // NOTE [monotone release]: released from the start
    __atomic_fetch_or(f, kPoisonBit, __ATOMIC_RELEASE);
    if (std::find(released_.begin(), released_.end(), f) == released_.end()) {
      released_.push_back(f);
    }
  } else {
    pending_.push_back(Pending{f, value, ctx, ctx.op, seq});
  }
  auto* markers = static_cast<std::uint64_t*>(markers_.data());
  return {markers + seq % kMarkers, seq};
}

Watchdog::Ticket Watchdog::reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t seq = next_seq_++;
  auto* markers = static_cast<std::uint64_t*>(markers_.data());
  return {markers + seq % kMarkers, seq};
}

bool Watchdog::is_marker(const void* p) const {
  const auto* lo = static_cast<const char*>(markers_.data());
  const auto* c = static_cast<const char*>(p);
  return c >= lo && c < lo + kMarkers * sizeof(std::uint64_t);
}

void Watchdog::forget(const void* begin, std::size_t bytes) {
  const auto* lo = static_cast<const char*>(begin);
  const auto* hi = lo + bytes;
  const auto inside = [&](const std::uint64_t* flag) {
    const auto* f = reinterpret_cast<const char*>(flag);
    return f >= lo && f < hi;
  };
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const Pending& p) { return inside(p.flag); }),
                 pending_.end());
  released_.erase(std::remove_if(released_.begin(), released_.end(), inside), released_.end());
}

Watchdog::Fault Watchdog::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Fault{ErrorKind::kTimeout, failure_};
}

void Watchdog::stop() noexcept {
  request_stop();
  cv_.notify_all();
}

void Watchdog::fail(const std::string& message) {
  if (failure_.empty()) failure_ = message;  // the first one wins
  stopped_ = true;
  OVERLAP_WARN(message << " -- releasing the GPU's " << pending_.size()
                       << " pending wait(s); the next op or synchronize() raises");
}

void Watchdog::release_all() {
  for (Pending& q : pending_) {
    __atomic_fetch_or(q.flag, kPoisonBit, __ATOMIC_RELEASE);
    if (std::find(released_.begin(), released_.end(), q.flag) == released_.end()) {
      released_.push_back(q.flag);
    }
  }
  pending_.clear();
  // Again every poll: a late peer's genuine signal may have lowered a released flag before
  // the GPU passed its wait, and this rank's drained signals overwrite its poison in the
  // peers' regions (NOTE [monotone release]).
  for (std::uint64_t* f : released_) __atomic_fetch_or(f, kPoisonBit, __ATOMIC_RELEASE);
  flags_->poison_outgoing();
}

void Watchdog::run() {
  const auto* markers = static_cast<const std::uint64_t*>(markers_.data());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPollInterval, [this] { return stop_; });
    if (stop_) break;
    if (stopped()) {  // a fault of the transport, an abort, or one found below earlier
      stopped_ = true;
      release_all();
      continue;
    }
    const auto now = Clock::now();
    for (std::size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      const std::uint64_t seen = __atomic_load_n(p.flag, __ATOMIC_ACQUIRE);
      if (seen >= p.value) {
        if (poisoned_short(seen, p.value)) {  // NOTE [poisoned flags]: the GPU passed it
          WaitContext ctx = p.ctx;
          ctx.op = p.op.c_str();
          fail(describe_peer_failure(ctx, seen, p.value));
          break;
        }
        pending_[i] = std::move(pending_.back());  // satisfied: drop it (order does not matter)
        pending_.pop_back();
        continue;
      }
      // A marker >= seq means the GPU reached this wait (or, after kMarkers later waits reused
      // the marker, a later one: then this wait is at most as old as that one).
      if (!p.reached && __atomic_load_n(markers + p.seq % kMarkers, __ATOMIC_ACQUIRE) >= p.seq) {
        p.reached = true;
        p.reached_at = now;
      }
      if (p.reached && now - p.reached_at > std::chrono::duration<double>(p.ctx.timeout_s)) {
        WaitContext ctx = p.ctx;
        ctx.op = p.op.c_str();
        fail(describe_timeout(ctx, seen, p.value));
        break;
      }
      ++i;
    }
    if (stopped_) release_all();
  }
}

}  // namespace overlap::comm::cuda

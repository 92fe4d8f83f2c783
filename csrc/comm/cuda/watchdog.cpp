#include "comm/cuda/watchdog.h"

#include <algorithm>

#include "common/errors.h"

namespace overlap::comm::cuda {

namespace {
// How often the watchdog looks at pending waits: a timeout is reported within this much of
// its deadline. Small against any sensible timeout, large enough to cost no CPU to speak of.
constexpr std::chrono::milliseconds kPollInterval(5);
}  // namespace

Watchdog::Watchdog() : markers_(kMarkers * sizeof(std::uint64_t)) {}

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
  pending_.push_back(Pending{const_cast<std::uint64_t*>(flag), value, ctx, ctx.op, seq});
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
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const Pending& p) {
                                  const auto* f = reinterpret_cast<const char*>(p.flag);
                                  return f >= lo && f < hi;
                                }),
                 pending_.end());
}

std::string Watchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void Watchdog::fail(const Pending& p, std::uint64_t seen) {
  WaitContext ctx = p.ctx;
  ctx.op = p.op.c_str();
  if (failure_.empty()) failure_ = describe_timeout(ctx, seen, p.value);  // the first one wins
  OVERLAP_WARN(failure_ << " -- releasing the GPU's " << pending_.size()
                        << " pending wait(s); the next op or synchronize() raises");
  for (Pending& q : pending_) __atomic_store_n(q.flag, q.value, __ATOMIC_RELEASE);
  pending_.clear();
}

void Watchdog::run() {
  const auto* markers = static_cast<const std::uint64_t*>(markers_.data());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPollInterval, [this] { return stop_; });
    if (stop_) break;
    const auto now = Clock::now();
    for (std::size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      const std::uint64_t seen = __atomic_load_n(p.flag, __ATOMIC_ACQUIRE);
      if (seen >= p.value) {  // satisfied: drop it (order does not matter)
        pending_[i] = std::move(pending_.back());
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
        fail(p, seen);
        break;
      }
      ++i;
    }
  }
}

}  // namespace overlap::comm::cuda

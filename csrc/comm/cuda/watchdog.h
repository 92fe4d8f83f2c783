// NOTE [watchdog]: a cuda wait (cuStreamWaitValue64, or a handshake kernel's poll) has no
// timeout of its own. Ahead of it the GPU writes a sequence number into a "reached" marker in
// pinned host memory (NOTE [one marker per op]), so the deadline counts from when the GPU got
// there, not from the enqueue (a long GEMM ahead is not a hang). A wait unsatisfied `timeout_s`
// later is logged at once, recorded (fault()) and fails the transport (NOTE [failed transport]),
// and EVERY pending wait is released so the GPU drains instead of spinning; any other fault
// (an abort, an error mid-op, a peer's poison) releases them too. The watchdog makes no CUDA
// calls: it is safe at any point of the process's life.
//
// NOTE [monotone release]: a wait is released by setting kPoisonBit in its flag, which passes
// every later wait too and only raises the flag (storing each awaited value once lowered a
// shared flag and left the GPU stuck). A late peer's signal may lower it again, so released
// flags and our outgoing ones are re-poisoned at every poll (NOTE [poisoned flags]). Verdict:
// release by a monotone bit, again at every poll.
//
// NOTE [one marker per op]: a marker write is a memop with a memory barrier (the v2 API rejects
// NO_MEMORY_BARRIER) that delays a wait behind it. So ONE marker per op is written after the
// acknowledgements on a side stream (Lanes::beside), and every wait of the op counts as reached
// with it: a deadline includes the op's own work, never work queued before the op (captured
// ops: a placeholder per wait). Measured: docs/performance-log.md [one marker per op].
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/cuda/cuda_memory.h"
#include "comm/fault.h"
#include "comm/transport.h"

namespace overlap::comm::cuda {

class Watchdog {
 public:
  // Markers form a ring: a wait's marker is reused `kMarkers` waits later.
  static constexpr std::size_t kMarkers = 4096;

  // `flags`: the outgoing flags kept poisoned once released (NOTE [monotone release]).
  explicit Watchdog(std::shared_ptr<FlagRegistry> flags);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  struct Ticket {
    std::uint64_t* marker;  // the stream writes `seq` here right before waiting
    std::uint64_t seq;
  };
  // Registers a wait for *flag >= value about to be enqueued. With `reached_with` it counts as
  // reached with that ticket's marker (NOTE [one marker per op]).
  Ticket arm(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
             const Ticket* reached_with = nullptr);
  // A ticket without a wait: an op's shared marker, or a captured wait's placeholder that
  // GraphLog::prepare_replay() re-arms (NOTE [graph capture]); its seq is unique.
  Ticket reserve();
  // Whether `p` is the marker of some ticket (of this watchdog).
  bool is_marker(const void* p) const;
  // Drops the waits whose flag lies in [begin, begin + bytes) (unmapped).
  void forget(const void* begin, std::size_t bytes);
  // The first fault found (a timeout or a peer's poison); empty message if none.
  struct Fault {
    ErrorKind kind = ErrorKind::kTimeout;
    std::string message;
  };
  Fault fault() const;
  // NOTE [monotone release]: release every pending and later wait. request_stop() only stores
  // an atomic (NOTE [abort]), found within one poll.
  void stop() noexcept;
  void request_stop() noexcept { stop_requested_.store(true, std::memory_order_release); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::uint64_t* flag;
    std::uint64_t value;
    WaitContext ctx;  // ctx.op is not used: it may not outlive the call to arm()
    std::string op;
    std::uint64_t seq;
    bool reached = false;
    Clock::time_point reached_at{};
  };

  void run();
  // Called with mu_ held: records `message` as the fault (the first one wins) and logs it.
  void fail(const std::string& message);
  // Called with mu_ held, once stopped (NOTE [monotone release]).
  void release_all();
  bool stopped() const { return stopped_ || stop_requested_.load(std::memory_order_acquire); }

  std::shared_ptr<FlagRegistry> flags_;
  PinnedHostMemory markers_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  std::vector<std::uint64_t*> released_;  // kept released until forgotten
  std::uint64_t next_seq_ = 1;
  std::string failure_;
  bool stopped_ = false;                     // under mu_
  std::atomic<bool> stop_requested_{false};  // NOTE [abort]
  bool stop_ = false;                        // the thread ends
  std::thread thread_;                       // started by the first arm()
};

}  // namespace overlap::comm::cuda

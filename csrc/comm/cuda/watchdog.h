// The deadline of every stream-ordered wait of the cuda transport.
//
// NOTE [watchdog]: a cuda wait is a stream memory operation (cuStreamWaitValue64) that the GPU's
// front end polls, or a handshake kernel's poll (NOTE [handshakes] in transport.h); neither
// has a timeout of its own. Ahead of the wait the GPU writes a sequence number into a
// "reached" marker in pinned host memory (once per op, NOTE [one marker per op]), so the
// watchdog thread knows when the GPU actually got there (the deadline counts from then, not
// from when the host enqueued the wait: a long GEMM ahead in the stream is not a hang).
// A wait still unsatisfied `timeout_s` later is a timeout: the watchdog logs it at once (never
// a silent hang), records it (fault()), and releases EVERY pending wait of the transport, so
// that the GPU drains instead of spinning forever after the host has given up. The transport
// is failed from then on (NOTE [failed transport] in transport.h): the communicator and its
// buffers must be recreated. The same release follows any other fault of the transport (an
// abort, an error mid-op: stop(), request_stop()), and a pending wait that the watchdog finds
// satisfied only by a failed peer's poison (NOTE [poisoned flags] in fault.h) is such a fault.
//
// NOTE [monotone release]: a wait is released by setting kPoisonBit in its flag (flags live in
// host memory, NOTE [flags in host memory]): a value above every epoch, which passes this wait
// and every later one on the flag, and which only ever raises the flag. Storing each pending
// wait's awaited value instead, as the watchdog once did, lowered a flag that several waits
// shared (the pieces of one op, or consecutive ops on one buffer, each awaiting a larger
// value) whenever a smaller value was stored after a larger one (the pending list is not kept
// in order), and left the GPU stuck for ever on a wait that nobody watched any more: the hang
// of the layers' timeout scenario on cuda (a backward of several ops, its bulk reduce-scatter
// awaiting four pieces on one flag, timed out, and the next host sync never returned). And
// since a late peer's genuine signal may still lower a released flag before the GPU has
// passed the wait, a released flag is released again at every poll, and this rank's flags in
// its peers' regions are poisoned again (its drained ops' signals overwrite them), for as
// long as the buffer lives. The drained ops still run their puts and signals, so a late peer
// may consume a released op's data within one poll interval; its communicator then fails
// through the poison (NOTE [poisoned flags]). Verdict: release by a monotone bit, again at
// every poll.
//
// NOTE [one marker per op]: each marker write is a stream memory operation with a memory
// barrier (about 2.5 us of its stream's time; the v2 memop API rejects
// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER), and a marker right before a wait delays the wait
// by that much. So the cuda transport writes ONE marker per op, in begin_op once the op's
// acknowledgements are signalled, on a side stream of the caller's (Lanes::beside: an event
// edge from the caller's stream, and nothing waits for the side stream), so the marker
// delays neither the acknowledgements nor the op's own work. Every wait of the op, on any of
// its lanes, counts as reached when that marker is written. The deadline of a wait thus
// includes the op's own work before it (a chunk GEMM: ms against a deadline of seconds) and
// never the work queued before the op (tested: ops behind 1.5-2 s of GPU work with a 1 s
// deadline). Ops captured into a CUDA graph keep one placeholder marker per wait (NOTE [graph
// capture] in graph_log.h). Measured on 4xH200 (benchmarks/baseline_collectives, push1s, ms;
// before: one marker per lane and op, before the lane's first wait): all-gather 8 MB 0.067 ->
// 0.058, 32 MB 0.119 -> 0.111 (0.913 -> 0.986 of NCCL), 128 MB 0.329 -> 0.316, 256 MB 0.589
// -> 0.578; reduce-scatter 8 MB 0.048 -> 0.046 (with the all-gather's kData waits moved
// ahead of its join). The marker on the caller's stream right after the acknowledgements
// gained nothing at 32 MB (0.118): it delayed the fork of the op's lanes.
//
// The watchdog makes no CUDA calls: it only reads and writes host memory, so it is safe at
// any point of the process's life.
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

  // `flags`: the transport's registry, whose outgoing flags the watchdog keeps poisoned once
  // it releases (NOTE [monotone release]).
  explicit Watchdog(std::shared_ptr<FlagRegistry> flags);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  struct Ticket {
    std::uint64_t* marker;  // the stream writes `seq` here right before waiting
    std::uint64_t seq;
  };
  // Registers a wait for *flag >= value about to be enqueued; `flag` is in host memory. With
  // `reached_with`, the wait gets no marker of its own: it counts as reached when that earlier
  // ticket's marker is written (NOTE [one marker per op]).
  Ticket arm(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
             const Ticket* reached_with = nullptr);
  // A ticket with no wait of its own (yet): the marker of an op, which its waits then share
  // (arm(..., &ticket), NOTE [one marker per op]), or the placeholder marker write of a wait
  // captured into a CUDA graph, which GraphLog::prepare_replay() replaces by an armed ticket
  // before every launch (NOTE [graph capture] in graph_log.h). Its seq is unique, so the
  // node can be recognised.
  Ticket reserve();
  // Whether `p` is the marker of some ticket (of this watchdog).
  bool is_marker(const void* p) const;
  // Drops pending and released waits whose flag lies in [begin, begin + bytes) (the flags are
  // unmapped).
  void forget(const void* begin, std::size_t bytes);
  // The first fault the watchdog found: a timeout, or a wait satisfied only by a failed
  // peer's poison (both kTimeout); an empty message if there was none.
  struct Fault {
    ErrorKind kind = ErrorKind::kTimeout;
    std::string message;
  };
  Fault fault() const;
  // NOTE [monotone release]: from now on, release every pending wait (and every wait armed
  // later) at once, and keep them and the outgoing flags poisoned. stop() also wakes the
  // watchdog; request_stop() only stores an atomic (NOTE [abort]: callable from a signal
  // handler), which the watchdog finds within one poll.
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
  // Called with mu_ held, once stopped: releases every pending wait (NOTE [monotone
  // release]), again every released one, and poisons the outgoing flags again.
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

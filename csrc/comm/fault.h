// How a communicator stops, and how its peers learn of it: aborts, interrupted waits and
// poisoned flags. Shared by every transport (transport.h) and the symmetric buffers.
//
// NOTE [abort]: Transport::abort() (Communicator.abort()) ends every wait of the communicator on
// this rank, on any thread, on the host or on the GPU, like ncclCommAbort. It only stores
// atomics, so any thread may call it, a signal handler included; the threads that look do the
// rest: a host wait checks it on every spin and throws kAborted at once; the cuda watchdog
// releases every pending GPU wait at its next poll (NOTE [watchdog]: within 5 ms) and
// synchronize() stops waiting for the stream; the first thread that looks records the fault
// (NOTE [failed transport]), so the communicator stays failed, and poisons this rank's flags in
// its peers' regions (NOTE [poisoned flags]), so that they fail too. Verdict: atomics in
// abort(), the work in whoever waits; measured by tests/unit/test_comm_abort.py (100 ms bound).
//
// NOTE [poisoned flags]: once a transport fails (a timeout, an abort, an error in the middle of
// an op), its rank will never signal its peers again, and on cuda its GPU still runs the
// released ops' puts and signals (NOTE [watchdog]), so a late peer could complete an op with
// data that was never there. So the failed rank sets kPoisonBit in every flag it signals in
// its peers' regions (kAck and kData of every buffer of the transport: FlagRegistry), keeping
// the epoch below it. A poisoned flag satisfies every wait (on cuda the GPU's waits are plain
// ">=" comparisons, so the peer's GPU drains instead of hanging), and every reader tells a wait
// satisfied by the poison alone (the epoch below the bit is smaller than the awaited value)
// from one satisfied before the writer failed: the host wait throws, the cuda transport refuses
// to enqueue such a wait and its watchdog fails the transport; and a transport whose peer's
// flags carry the bit fails at its next look (Transport::failed, raise_if_failed), since it can
// never complete another op with that peer. On cuda the failed rank's released signals may
// overwrite the bit with a plain epoch; its watchdog sets the bit again at every poll while the
// buffer lives, so a peer's GPU may at worst consume a released op's data during one poll
// interval, and its communicator fails within the next. The bit lies below 2^63 and far above
// any epoch, so cuStreamWaitValue64's GEQ, which compares (int64_t)(*flag - value) >= 0, passes
// it too. Verdict: poison with the epoch kept; exact on the host transport, within one watchdog
// poll on cuda.
//
// NOTE [interrupting waits]: the core knows no Python, yet Ctrl-C must end a wait within 100 ms.
// The binding layer installs one process-wide check (set_interrupt_check): a function that a
// waiting thread calls every kInterruptPeriod; the binding's reacquires the GIL on Python's
// main thread and runs Python's pending signal handlers (PyErr_CheckSignals), and returns true
// where one raised (KeyboardInterrupt). The wait then aborts the transport (the op is cut
// short mid-way: NOTE [failed transport]) and throws kAborted, which the binding's exception
// translator turns back into the handler's exception. Host waits and the cuda transport's
// synchronize() call it. Verdict: a polled hook, not a C signal handler of our own (which would
// have to chain to Python's).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace overlap::comm {

// NOTE [poisoned flags]: the bit a failed rank sets in the flags it signals.
constexpr std::uint64_t kPoisonBit = std::uint64_t{1} << 62;

// Whether a flag value `seen` that satisfies a wait for `value` carries the poison mark of a
// writer that failed before it reached `value` (NOTE [poisoned flags]).
inline bool poisoned_short(std::uint64_t seen, std::uint64_t value) {
  return (seen & kPoisonBit) != 0 && (seen & ~kPoisonBit) < value;
}

// NOTE [poisoned flags]: the flags of every live buffer of one transport. A buffer adds its
// flags once it is connected and removes them before its memory goes.
class FlagRegistry {
 public:
  // `outgoing`: the flags this rank signals in its peers' regions; `incoming`: the flags the
  // peers signal in this rank's region, with the peer that writes each.
  void add(const void* key, std::vector<std::uint64_t*> outgoing,
           std::vector<std::pair<int, const std::uint64_t*>> incoming);
  void remove(const void* key);
  // Sets kPoisonBit in every outgoing flag (of one buffer, or of all).
  void poison_outgoing(const void* key = nullptr);
  // The first peer whose incoming flag carries kPoisonBit, or -1.
  int find_poisoned_peer() const;

 private:
  struct Entry {
    const void* key;
    std::vector<std::uint64_t*> outgoing;
    std::vector<std::pair<int, const std::uint64_t*>> incoming;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

// NOTE [interrupting waits]: how often a waiting thread calls the check.
constexpr std::chrono::milliseconds kInterruptPeriod(20);
// Returns true where the wait must stop (a signal handler raised); must not throw.
using InterruptCheck = bool (*)();
// Installs the process-wide check (nullptr: none); the binding layer does it once.
void set_interrupt_check(InterruptCheck check);
// Runs the installed check (false where there is none).
bool interrupt_requested();

// "the communicator was interrupted by a signal ..." (the fault an interrupted wait records).
std::string interrupted_message();

}  // namespace overlap::comm

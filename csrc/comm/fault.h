// NOTE [abort]: Transport::request_abort() (Python: Communicator.abort) ends every wait of the
// communicator on this rank, host or GPU, like ncclCommAbort. It only stores atomics (a signal
// handler may call it); whoever looks does the rest: a host wait throws kAborted on its next spin,
// the watchdog releases the GPU waits at its next poll, and the first looker records the fault
// (NOTE [failed transport]) and poisons our flags in the peers' regions (NOTE [poisoned flags]).
// Verdict: atomics in request_abort(), the work in whoever waits (tests/unit/test_comm_abort.py:
// 100 ms bound).
//
// NOTE [poisoned flags]: a failed rank never signals again, yet on cuda its released ops still
// run, so a late peer could complete an op with missing data. So it sets kPoisonBit (below 2^63,
// so cuStreamWaitValue64's signed GEQ passes it) in every flag it signals in its peers' regions,
// epoch kept below. A poisoned flag passes every wait (GPUs drain); a wait passed by the poison
// alone (epoch < awaited value) fails the reader, and a peer's poisoned flag fails a transport at
// its next look. The watchdog re-poisons at every poll. Verdict: exact on host, within one
// watchdog poll on cuda.
//
// NOTE [interrupting waits]: Ctrl-C must end a wait within 100 ms, but the core knows no Python.
// A waiting thread calls the binding's check (set_interrupt_check) every kInterruptPeriod; it
// runs Python's signal handlers and returns true where one raised, and the wait aborts the
// transport and throws kAborted (turned back into the handler's exception). Verdict: a polled
// hook, not a C signal handler of our own (which would have to chain to Python's).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace overlap::comm {

// NOTE [poisoned flags]: the bit a failed rank sets in the flags it signals.
constexpr std::uint64_t kPoisonBit = std::uint64_t{1} << 62;

// Whether `seen` satisfies a wait for `value` only by the poison (NOTE [poisoned flags]).
inline bool poisoned_short(std::uint64_t seen, std::uint64_t value) {
  return (seen & kPoisonBit) != 0 && (seen & ~kPoisonBit) < value;
}

// NOTE [poisoned flags]: the flags of every live (connected) buffer of one transport.
class FlagRegistry {
 public:
  // `outgoing`: ours in the peers' regions; `incoming`: the peers' in ours, with the writer.
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

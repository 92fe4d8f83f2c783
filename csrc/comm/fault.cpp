#include "comm/fault.h"

#include <algorithm>
#include <atomic>

namespace overlap::comm {

void FlagRegistry::add(const void* key, std::vector<std::uint64_t*> outgoing,
                       std::vector<std::pair<int, const std::uint64_t*>> incoming) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(Entry{key, std::move(outgoing), std::move(incoming)});
}

void FlagRegistry::remove(const void* key) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [key](const Entry& e) { return e.key == key; }),
                 entries_.end());
}

void FlagRegistry::poison_outgoing(const void* key) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    if (key != nullptr && e.key != key) continue;
    for (std::uint64_t* flag : e.outgoing) __atomic_fetch_or(flag, kPoisonBit, __ATOMIC_RELEASE);
  }
}

int FlagRegistry::find_poisoned_peer() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    for (const auto& [peer, flag] : e.incoming) {
      if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) & kPoisonBit) return peer;
    }
  }
  return -1;
}

namespace {
std::atomic<InterruptCheck> g_interrupt_check{nullptr};
}  // namespace

void set_interrupt_check(InterruptCheck check) {
  g_interrupt_check.store(check, std::memory_order_release);
}

bool interrupt_requested() {
  const InterruptCheck check = g_interrupt_check.load(std::memory_order_acquire);
  return check != nullptr && check();
}

std::string interrupted_message() {
  return "interrupted by a signal while waiting (its handler raised, e.g. KeyboardInterrupt on "
         "Ctrl-C): the op was cut short mid-way";
}

}  // namespace overlap::comm

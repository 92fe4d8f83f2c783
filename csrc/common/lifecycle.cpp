#include "common/lifecycle.h"

#include <atomic>

namespace overlap {

namespace {
std::atomic<bool> g_finalizing{false};
}

void mark_process_finalizing() {
  g_finalizing.store(true);
}
bool process_finalizing() {
  return g_finalizing.load();
}

}  // namespace overlap

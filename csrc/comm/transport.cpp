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

void Transport::handshake(const Handshake& h, cudaStream_t stream, int lane) {
  constexpr std::size_t kWord = 4;
  for (const WordCopy& c : h.before) put(c.dst, c.src, kWord, stream, lane);
  for (std::uint64_t* flag : h.signals) signal(flag, h.value, stream, lane);
  for (const FlagWait& w : h.waits) wait(w.flag, w.value, w.ctx, stream, lane);
  for (const WordCopy& c : h.after) put(c.dst, c.src, kWord, stream, lane);
}

}  // namespace overlap::comm

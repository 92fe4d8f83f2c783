#include "comm/collectives.h"

#include <vector>

#include "common/errors.h"

namespace overlap::comm {

namespace {

// Opens op `op` on `buf`: returns its epoch once every peer has acknowledged the previous one
// (NOTE [buffer reuse] in collectives.h).
std::uint64_t begin_op(SymmetricBuffer& buf, const char* op, cudaStream_t stream) {
  buf.check_ready(op);
  const std::uint64_t epoch = buf.next_epoch();
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  for (int i = 1; i < n; ++i) {
    const int peer = (r + i) % n;
    t.signal(buf.flag(peer, r, FlagSlot::kAck), epoch - 1, stream);
  }
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    WaitContext ctx{op, r, peer, 0, epoch, buf.timeout_s()};
    t.wait(buf.flag(r, peer, FlagSlot::kAck), epoch - 1, ctx, stream);
  }
  return epoch;
}

}  // namespace

// Timeline of rank r (n ranks), one stream:
//
//   begin_op | put own chunk -> slot r of r+1, r+2, ..., r-1 (each followed by its kData
//            |   signal, so peers can start consuming before all puts are done)
//            | wait kData from r-1, r-2, ..., r+1  (the order peers reach us in)
//
// On NVLink's all-to-all topology every put uses its own link; on cuda the puts are
// copy-engine copies and use no SMs.
void all_gather(SymmetricBuffer& buf, const void* input, std::size_t chunk_bytes,
                cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  OVERLAP_CHECK_ARG(chunk_bytes * n <= buf.bytes(),
                    "all_gather: " << n << " chunks of " << chunk_bytes
                                   << " bytes exceed the buffer's " << buf.bytes()
                                   << " bytes; create a larger buffer or gather less");
  const std::uint64_t epoch = begin_op(buf, "all_gather", stream);
  Transport& t = buf.transport();
  t.put(buf.data(r) + r * chunk_bytes, input, chunk_bytes, stream);
  for (int i = 1; i < n; ++i) {
    const int peer = (r + i) % n;
    t.put(buf.data(peer) + r * chunk_bytes, input, chunk_bytes, stream);
    t.signal(buf.flag(peer, r, FlagSlot::kData), epoch, stream);
  }
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    WaitContext ctx{"all_gather", r, peer, i, epoch, buf.timeout_s()};
    t.wait(buf.flag(r, peer, FlagSlot::kData), epoch, ctx, stream);
  }
}

// Timeline of rank r: begin_op | publish own partials (all chunks) in own region, signal
// kData to every peer | wait kData from every peer | reduce chunk r of all regions (pulls over
// the mapped peer pointers) into `output`. Peers are released by the next op's begin_op.
void reduce_scatter(SymmetricBuffer& buf, const void* input, void* output, std::size_t count,
                    DType dtype, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  const std::size_t chunk_bytes = count * dtype_size(dtype);
  OVERLAP_CHECK_ARG(chunk_bytes * n <= buf.bytes(),
                    "reduce_scatter: " << n << " chunks of " << chunk_bytes
                                       << " bytes exceed the buffer's " << buf.bytes()
                                       << " bytes; create a larger buffer");
  const std::uint64_t epoch = begin_op(buf, "reduce_scatter", stream);
  Transport& t = buf.transport();
  t.put(buf.data(r), input, chunk_bytes * n, stream);
  for (int i = 1; i < n; ++i) {
    t.signal(buf.flag((r + i) % n, r, FlagSlot::kData), epoch, stream);
  }
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    WaitContext ctx{"reduce_scatter", r, peer, i, epoch, buf.timeout_s()};
    t.wait(buf.flag(r, peer, FlagSlot::kData), epoch, ctx, stream);
  }
  // Summed in rank order on every rank, so results do not depend on which rank computed them.
  std::vector<const void*> partials(n);
  for (int k = 0; k < n; ++k) partials[k] = buf.data(k) + r * chunk_bytes;
  t.reduce(output, partials.data(), n, count, dtype, stream);
}

void barrier(SymmetricBuffer& buf, cudaStream_t stream) {
  begin_op(buf, "barrier", stream);
}

}  // namespace overlap::comm

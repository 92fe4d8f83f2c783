// Collectives on a symmetric buffer, written once against the Transport interface.
//
// NOTE [buffer reuse] (docs/design.md §3, invariant 8): every op on a buffer has an epoch e. At its
// start a rank tells every peer "I have entered op e: I read nothing of epoch e-1 any more"
// (kAck = e) and waits until every peer has said the same, before it writes into any buffer. A fast
// rank can thus never overwrite data a slow peer still reads, and a view handed out of a buffer
// stays valid until the next op on that buffer. The start of an op is therefore also a barrier,
// except that an op which only pushes may wait for each peer's acknowledgement just before it
// writes into that peer (NOTE [deferred acknowledgements] in op_protocol.h).
//
// All functions are COLLECTIVE over the buffer's group and stream-ordered on `stream`
// (the host transport runs them synchronously).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/symmetric_buffer.h"
#include "common/dtype.h"

namespace overlap::comm {

// Gathers `chunk_bytes` from `input` of every rank into the data region of every rank:
// rank r's chunk lands at data + r * chunk_bytes. `input` may be the rank's own slot. `type`:
// as GatherPart::type.
void all_gather(SymmetricBuffer& buf, const void* input, std::size_t chunk_bytes,
                cudaStream_t stream, std::uint64_t type = 0);

// One part of a multi-part all-gather: rank r's `chunk_bytes` from `input` land at
// data + offset + r * chunk_bytes of every rank (parts must not overlap).
struct GatherPart {
  const void* input;
  std::size_t offset;
  std::size_t chunk_bytes;
  // An identity of the element type of `input` (any value the ranks agree on for one type:
  // the bindings hash the framework dtype's name, NOTE [gather dtypes] in
  // bindings/tensor_arg.h): part of the op record (NOTE [op records] in op_protocol.cpp), so
  // ranks that gather different types of one size get a mismatch instead of each other's
  // bits reinterpreted. The gather itself moves bytes, whatever the type.
  std::uint64_t type = 0;
};

// Gathers several parts in one op (one barrier, one signal per peer): e.g. a quantized
// shard's data and its scale_inv, which must travel together (docs/design.md §3, invariant 1).
void all_gather_parts(SymmetricBuffer& buf, const std::vector<GatherPart>& parts,
                      cudaStream_t stream);

// input: `size * count` elements of `dtype` (chunk k is destined to rank k), either outside
// every region of the buffer or this rank's own region from its start (partials in place);
// output: `count` elements, the sum over ranks of their chunk `rank`, fp32 accumulation, outside
// every region of the buffer (peers read ours until they enter the next op).
void reduce_scatter(SymmetricBuffer& buf, const void* input, void* output, std::size_t count,
                    DType dtype, cudaStream_t stream);

// Returns once every rank of the group has entered the barrier.
void barrier(SymmetricBuffer& buf, cudaStream_t stream);

}  // namespace overlap::comm

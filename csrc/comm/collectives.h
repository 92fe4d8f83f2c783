// NOTE [buffer reuse] (docs/design.md §3, invariant 8): every op on a buffer has an epoch e. At
// its start a rank tells every peer "I read nothing of epoch e-1 any more" (kAck = e) and waits
// for every peer's before it writes into any region, so a fast rank never overwrites data a slow
// peer still reads, and a view of a buffer stays valid until its next op. Verdict: every op
// start is a barrier (push-only ops may defer it per peer: NOTE [deferred acknowledgements]).
// All functions are COLLECTIVE over the buffer's group and stream-ordered on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/symmetric_buffer.h"
#include "common/dtype.h"

namespace overlap::comm {

// Rank r's `chunk_bytes` from `input` land at data + r * chunk_bytes of every rank.
void all_gather(SymmetricBuffer& buf, const void* input, std::size_t chunk_bytes,
                cudaStream_t stream, std::uint64_t type = 0);

// One part of a multi-part all-gather, landing at data + offset + r * chunk_bytes.
struct GatherPart {
  const void* input;
  std::size_t offset;
  std::size_t chunk_bytes;
  // The element type's identity (NOTE [gather dtypes] in bindings/tensor_arg.h), part of the
  // op record, so ranks gathering different types of one size get a mismatch.
  std::uint64_t type = 0;
};

// Several parts in one op, e.g. a shard and its scale_inv (docs/design.md §3, invariant 1).
void all_gather_parts(SymmetricBuffer& buf, const std::vector<GatherPart>& parts,
                      cudaStream_t stream);

// input: `size * count` elements (chunk k for rank k), outside the buffer or our own region from
// its start (NOTE [partials in place]); output: `count` elements, the fp32-accumulated sum of
// every rank's chunk `rank`, outside the buffer.
void reduce_scatter(SymmetricBuffer& buf, const void* input, void* output, std::size_t count,
                    DType dtype, cudaStream_t stream);

// Returns once every rank of the group has entered the barrier.
void barrier(SymmetricBuffer& buf, cudaStream_t stream);

}  // namespace overlap::comm

#include "comm/collectives.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/op_protocol.h"
#include "common/errors.h"

namespace overlap::comm {

namespace {

// Lanes per peer of an all-gather: `put_split`, plus one for the SM copy (NOTE [sm puts]).
int lanes_per_peer(const SymmetricBuffer& buf) {
  return buf.put_split() + (buf.sm_percent() > 0 ? 1 : 0);
}

// The first lane of the i-th peer in ring order (NOTE [serial puts]: all peers share theirs).
int first_lane(const SymmetricBuffer& buf, int i) {
  return 1 + (buf.serial_puts() ? 0 : (i - 1) * lanes_per_peer(buf));
}

// The rank whose data region [data(k), data(k) + bytes()) overlaps [p, p + bytes), or -1.
int region_of(const SymmetricBuffer& buf, const void* p, std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(p);
  for (int k = 0; k < buf.size(); ++k) {
    const auto begin = reinterpret_cast<std::uintptr_t>(buf.data(k));
    if (bytes > 0 && lo < begin + buf.bytes() && begin < lo + bytes) return k;
  }
  return -1;
}

std::string region_name(const SymmetricBuffer& buf, int k) {
  return k == buf.rank() ? "own region" : "region of rank " + std::to_string(k);
}

int gather_lanes(const SymmetricBuffer& buf) {
  return 1 + (buf.serial_puts() ? 1 : buf.size() - 1) * lanes_per_peer(buf);
}

// Copies slot `src_rank` of every part to `to`'s region on lanes first..: sm_percent % by the
// SM kernel on the last lane, the rest in put_split slices; lane `first` then waits for them.
void put_slot(SymmetricBuffer& buf, const std::vector<GatherPart>& parts, int src_rank, int from,
              int to, int first, bool from_input, cudaStream_t stream) {
  Transport& t = buf.transport();
  const int split = buf.put_split();
  const int lanes = lanes_per_peer(buf);
  for (const GatherPart& a : parts) {
    const std::size_t slot = a.offset + src_rank * a.chunk_bytes;
    const char* src = from_input ? static_cast<const char*>(a.input) : buf.data(from) + slot;
    char* dst = buf.data(to) + slot;
    const std::size_t sm_bytes = a.chunk_bytes * buf.sm_percent() / 100 / 16 * 16;
    if (sm_bytes > 0) t.put_sm(dst, src, sm_bytes, buf.sm_blocks(), stream, first + split);
    const std::size_t ce_bytes = a.chunk_bytes - sm_bytes;
    const std::size_t slice = (ce_bytes + split - 1) / split;
    for (int j = 0; j < split; ++j) {
      const std::size_t begin = std::min(ce_bytes, j * slice);
      const std::size_t bytes = std::min(ce_bytes - begin, slice);
      t.put(dst + sm_bytes + begin, src + sm_bytes + begin, bytes, stream, first + j);
    }
  }
  for (int j = 1; j < lanes; ++j) t.lane_wait(stream, first, first + j);
}

// The handshake after which every rank's data is in place (NOTE [handshakes]).
void data_handshake(SymmetricBuffer& buf, std::uint64_t epoch, const char* op,
                    cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Handshake h;
  h.value = epoch;
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    h.signals.push_back(buf.flag(peer, r, FlagSlot::kData));
    h.waits.push_back(FlagWait{buf.flag(r, peer, FlagSlot::kData), epoch,
                               WaitContext{op, r, peer, i, epoch, buf.timeout_s()}});
  }
  buf.transport().handshake(h, stream, 0);
}

// Push: our shard into our slot (lane 0) and every peer's slot r, then one data handshake.
void gather_by_pushes(SymmetricBuffer& buf, const std::vector<GatherPart>& parts,
                      std::uint64_t epoch, cudaStream_t stream) {
  Transport& t = buf.transport();
  const int r = buf.rank();
  const int n = buf.size();
  t.fork(stream, gather_lanes(buf));
  for (const GatherPart& a : parts) {
    t.put(buf.data(r) + a.offset + r * a.chunk_bytes, a.input, a.chunk_bytes, stream, 0);
  }
  for (int i = 1; i < n; ++i) {
    put_slot(buf, parts, r, r, (r + i) % n, first_lane(buf, i), /*from_input=*/true, stream);
  }
  t.join(stream);
  data_handshake(buf, epoch, "all_gather", stream);
}

// Pull: our shard into our slot, one data handshake, then every peer's slot into ours.
void gather_by_pulls(SymmetricBuffer& buf, const std::vector<GatherPart>& parts,
                     std::uint64_t epoch, cudaStream_t stream) {
  Transport& t = buf.transport();
  const int r = buf.rank();
  const int n = buf.size();
  for (const GatherPart& a : parts) {
    t.put(buf.data(r) + a.offset + r * a.chunk_bytes, a.input, a.chunk_bytes, stream, 0);
  }
  data_handshake(buf, epoch, "all_gather", stream);
  t.fork(stream, gather_lanes(buf));
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    put_slot(buf, parts, peer, peer, r, first_lane(buf, i), /*from_input=*/false, stream);
  }
  t.join(stream);
}

}  // namespace

// Timeline of rank r, pushes with serial puts (the default):
// clang-format off
//   stream | begin_op: handshake kAck(e) | fork | put own chunk -> own slot r          | join | handshake kData(e)
//   lane 1 |                             |      | put own chunk -> slot r of r+1; then r+2, ..., r-1 | |
// clang-format on
// NOTE [gather handshakes]: the ranks meet twice (acknowledgements, every shard in place), each
// time in ONE handshake kernel; waiting for every peer up front costs nothing (each rank waits
// for every shard anyway). Verdict: two handshakes, faster than deferred acknowledgements and
// per-peer memops at every size. Measured: docs/performance-log.md [gather handshakes].
void all_gather_parts(SymmetricBuffer& buf, const std::vector<GatherPart>& parts,
                      cudaStream_t stream) {
  const int n = buf.size();
  OVERLAP_CHECK_ARG(!parts.empty(), "all_gather: nothing to gather (no parts)");
  // Validate every part (and the absence of overlaps) before any communication.
  std::uint64_t arg = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const GatherPart& a = parts[p];
    const std::size_t span = a.chunk_bytes * n;
    OVERLAP_CHECK_ARG(a.offset <= buf.bytes() && span <= buf.bytes() - a.offset,
                      "all_gather: part " << p << " (" << n << " chunks of " << a.chunk_bytes
                                          << " bytes at offset " << a.offset
                                          << ") would exceed the buffer's " << buf.bytes()
                                          << " bytes; create a larger buffer or gather less");
    for (std::size_t q = 0; q < p; ++q) {
      const GatherPart& b = parts[q];
      const bool disjoint = a.offset + span <= b.offset || b.offset + b.chunk_bytes * n <= a.offset;
      OVERLAP_CHECK_ARG(disjoint || span == 0 || b.chunk_bytes == 0,
                        "all_gather: parts " << q << " and " << p << " overlap in the buffer");
    }
    arg = mix_arg(mix_arg(mix_arg(arg, a.offset), a.chunk_bytes), a.type);
  }
  // NOTE [gather handshakes]; the mode is part of the op record (pulls and pushes don't mix).
  const bool pull = buf.pull_gather();
  arg = mix_arg(arg, pull);
  const std::uint64_t epoch = begin_op(buf, OpCode::kAllGather, arg, "all_gather", stream,
                                       OpAccess{/*pushes_only=*/!pull, /*handshake=*/true});
  if (pull) {
    gather_by_pulls(buf, parts, epoch, stream);
  } else {
    gather_by_pushes(buf, parts, epoch, stream);
  }
}

void all_gather(SymmetricBuffer& buf, const void* input, std::size_t chunk_bytes,
                cudaStream_t stream, std::uint64_t type) {
  all_gather_parts(buf, {GatherPart{input, 0, chunk_bytes, type}}, stream);
}

// Rank r: begin_op | own partials into own region | data handshake | reduce chunk r of every
// region (peer loads) into `output`. With the partials in place: begin_op | reduce.
void reduce_scatter(SymmetricBuffer& buf, const void* input, void* output, std::size_t count,
                    DType dtype, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  OVERLAP_CHECK_ARG(
      dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16,
      "reduce_scatter: dtype " << dtype_name(dtype)
                               << " is not supported; use float32, bfloat16 or float16");
  OVERLAP_CHECK_ARG(count <= buf.bytes() / n / dtype_size(dtype),
                    "reduce_scatter: " << n << " chunks of " << count << " " << dtype_name(dtype)
                                       << " elements exceed the buffer's " << buf.bytes()
                                       << " bytes; create a larger buffer");
  const std::size_t chunk_bytes = count * dtype_size(dtype);
  buf.check_ready("reduce_scatter");  // data(k) below needs every peer mapped
  // An output in a region would overwrite partials the peers are still summing.
  const int output_in = region_of(buf, output, chunk_bytes);
  OVERLAP_CHECK_ARG(output_in < 0, "reduce_scatter: the output overlaps the "
                                       << region_name(buf, output_in)
                                       << " of the symmetric buffer, which peers read during "
                                          "the op; pass an output outside the buffer");
  const int input_in = input == buf.data(r) ? -1 : region_of(buf, input, chunk_bytes * n);
  OVERLAP_CHECK_ARG(input_in < 0, "reduce_scatter: the input overlaps the "
                                      << region_name(buf, input_in)
                                      << " of the symmetric buffer but is not this rank's "
                                         "partials in place (a view at offset 0); pass such a "
                                         "view or a tensor outside the buffer");
  // NOTE [partials in place]: when every rank's partials are already in its region, begin_op's
  // acknowledgements (signalled after the rank's earlier work, with a memory barrier) also say
  // "my partials are there": no kData round. Part of the op record, so the ranks agree.
  const bool in_place = input == buf.data(r);
  // Handshakes as in NOTE [gather handshakes]: the reduction takes the SMs next anyway.
  const std::uint64_t arg =
      mix_arg(mix_arg(chunk_bytes, in_place), static_cast<std::uint64_t>(dtype));
  const std::uint64_t epoch = begin_op(buf, OpCode::kReduceScatter, arg, "reduce_scatter", stream,
                                       OpAccess{/*pushes_only=*/false, /*handshake=*/true});
  Transport& t = buf.transport();
  if (!in_place) {
    t.put(buf.data(r), input, chunk_bytes * n, stream, 0);
    data_handshake(buf, epoch, "reduce_scatter", stream);
  }
  // Rank order: the same sum on every rank.
  std::vector<const void*> partials(n);
  for (int k = 0; k < n; ++k) partials[k] = buf.data(k) + r * chunk_bytes;
  ReduceOutput o;
  o.format = dtype;
  t.reduce(output, partials.data(), n, count, dtype, o, stream, 0);
}

void barrier(SymmetricBuffer& buf, cudaStream_t stream) {
  begin_op(buf, OpCode::kBarrier, 0, "barrier", stream);
}

}  // namespace overlap::comm

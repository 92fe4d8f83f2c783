#include "comm/collectives.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/op_protocol.h"
#include "common/errors.h"

namespace overlap::comm {

namespace {

// Lanes per peer of an all-gather: `put_split` copy-engine lanes, plus one SM lane when part
// of the bytes goes through the SM copy kernel (NOTE [sm puts]).
int lanes_per_peer(const SymmetricBuffer& buf) {
  return buf.put_split() + (buf.sm_percent() > 0 ? 1 : 0);
}

// The first lane of the copies to or from the i-th peer in ring order (i = 1..n-1); lane 0 is
// the caller's stream. NOTE [serial puts]: all peers share lanes 1..lanes_per_peer.
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

// Copies slot `src_rank` of every part from `from`'s region (or from the parts' inputs) to
// `to`'s region on lanes first..first+lanes_per_peer-1: the first sm_percent % of each part
// (rounded to 16 bytes) by the SM kernel on the last lane, the rest in put_split slices by the
// copy engines. Lane `first` then waits for the others.
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

// The handshake after which every rank's data is in place (all_gather: our shard in every
// peer's region, or in our own slot for the pulls; reduce_scatter: our partials in our
// region): signal kData to every peer and wait for every peer's (NOTE [handshakes] in
// transport.h: one kernel on cuda).
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

// Push: begin_op has waited for every acknowledgement (a handshake); lane 0 copies our shard
// into our own slot while the put lanes copy it into slot r of every peer; once all are done,
// one handshake announces our shard to every peer and waits for theirs.
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

// Pull: we copy our shard into our own slot, announce it to every peer and wait for theirs
// (one handshake); the lanes of peer i then copy its slot i from its region into ours. A peer
// reads our slot until it enters the next op, whose acknowledgements we wait for before we
// write our slot again (NOTE [buffer reuse]).
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

// Timeline of rank r (n ranks), push mode with serial puts, the default (pull mode:
// gather_by_pulls):
//
// clang-format off
//   stream | begin_op: handshake kAck(e) | fork | put own chunk -> own slot r          | join | handshake kData(e)
//   lane 1 |                             |      | put own chunk -> slot r of r+1; then |      |
//          |                             |      |   r+2, ..., r-1                      |      |
// clang-format on
//
// Without serial puts, lane i carries the put to peer r+i, all at once. The puts are
// copy-engine copies; the two handshakes are one-block kernels on cuda (NOTE [handshakes] in
// transport.h), so the all-gather takes one SM for a few us at its start and end, and no SM
// while the data moves unless sm_share is set. NOTE [serial puts] in symmetric_buffer.h says
// why one lane: a GPU's copy engines send as fast to one peer as to all.
//
// NOTE [gather handshakes]: the ranks meet twice, at the start (every peer has finished the
// previous op: its acknowledgement) and at the end (every peer's shard is in place), each
// time in ONE handshake kernel that signals every peer and polls every peer's flag. An
// earlier design let each put lane wait for its own peer's acknowledgement right before
// writing into it (NOTE [deferred acknowledgements] in op_protocol.h) and announced each
// peer's chunk on a lane of its own as soon as it was written, all with stream memory
// operations (13-15 us a hop, NOTE [cuda transport design]); ~8.6 us passed between
// consecutive pushes and ~32 us from the last push to the next op's first. Measured on 4xH200
// (benchmarks.baseline_collectives, bf16, push1s, GPU time in us, two interleaved runs each;
// NCCL: 47.5, 109, 347, 661):
//
//   MB                                  8            32           128          256
//   memory operations (before)    58.1-58.6   108.5-109.3   313.2-316.2   576.8-621.1
//   deferred acks + end handshake 54.5-55.3   104.7-105.4   307.5-308.1   562.7-563.3
//   both handshakes (kept)        45.2-45.5    97.1-97.4    299.1-299.4   554.7-555.7
//
// i.e. NCCL time / ours 0.81 -> 1.04 at 8 MB, 1.00 -> 1.12 at 32 MB, 1.10 -> 1.16 at 128 MB,
// 1.08-1.15 -> 1.19 at 256 MB; the pulls gained as much (8 MB 68.6 -> 53.7 us). Waiting for
// every peer up front costs nothing here: each rank waits for every peer's shard anyway.
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
  // Pushes only write peers' regions (no peer reads ours); all acknowledgements are awaited
  // up front in one handshake all the same (NOTE [gather handshakes]). Pulls and pushes do
  // not mix (a pulling rank writes no peer's slot): the mode is part of the op record.
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

// Timeline of rank r: begin_op | publish own partials (all chunks) in own region, signal
// kData to every peer | wait kData from every peer | reduce chunk r of all regions (pulls over
// the mapped peer pointers) into `output`. Peers are released by the next op's begin_op. With
// the partials already in place, begin_op | reduce (NOTE [partials in place]).
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
  // The output must not alias any region: our reduction would overwrite partials that the
  // peers are still summing (they read our region until they enter the next op). The input
  // is our own region from its start (NOTE [partials in place]) or lies outside all of them.
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
  // NOTE [partials in place]: when every rank's partials are already in its region (a GEMM
  // wrote them there before the op), the acknowledgements of begin_op also say "my partials
  // are there": each is signalled after the rank's earlier work on the stream, with a memory
  // barrier. Then no kData round is needed. Whether the input is in place is part of the op
  // record, so the ranks agree on it.
  const bool in_place = input == buf.data(r);
  // Both rounds as handshakes (NOTE [handshakes] in transport.h): the reduction takes the SMs
  // right after them anyway. Measured on 4xH200 (benchmarks/baseline_collectives, bf16, NCCL
  // time / ours; before: stream memory operations): 8 MB 0.911-0.934 -> 1.157, 32 MB
  // 0.987-1.014 -> 1.075, 128 MB 1.014-1.020 -> 1.062, 256 MB 1.011-1.020 -> 1.046.
  // The dtype too: ranks summing bf16 against fp16 partials of one size would add each
  // other's bits reinterpreted.
  const std::uint64_t arg =
      mix_arg(mix_arg(chunk_bytes, in_place), static_cast<std::uint64_t>(dtype));
  const std::uint64_t epoch = begin_op(buf, OpCode::kReduceScatter, arg, "reduce_scatter", stream,
                                       OpAccess{/*pushes_only=*/false, /*handshake=*/true});
  Transport& t = buf.transport();
  if (!in_place) {
    t.put(buf.data(r), input, chunk_bytes * n, stream, 0);
    data_handshake(buf, epoch, "reduce_scatter", stream);
  }
  // Summed in rank order on every rank, so results do not depend on which rank computed them.
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

// Bulk overlap: one all-gather or reduce-scatter of one tensor beside one unrelated GEMM
// (the backward pass: gather wgrad's input while dgrad runs; reduce-scatter dgrad's partial
// sums while wgrad runs).
#include <algorithm>
#include <vector>

#include "comm/op_protocol.h"
#include "comm/overlap/op_common.h"
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

using detail::kSlotAlign;
using detail::round_up;

BulkRsLayout bulk_rs_layout(int size, std::size_t partial_bytes) {
  BulkRsLayout l;
  l.slot_bytes = round_up(partial_bytes, kSlotAlign);
  l.bytes = l.slot_bytes * static_cast<std::size_t>(size);
  return l;
}

namespace {

constexpr const char* kAgOp = "bulk_all_gather";
constexpr const char* kRsOp = "bulk_reduce_scatter";

// Lanes of a bulk op: 0 = the caller's stream (protocol, waits, reduction), 1 = the GEMM,
// 2 = the signal lane (NOTE [bulk signal lane]), then the put lanes: one set of put_split copy
// lanes that carries the peers' puts one after another in ring order (serial puts, NOTE
// [serial puts] in symmetric_buffer.h), or one set per peer.
constexpr int kGemmLane = 1;
constexpr int kSignalLane = 2;
constexpr int kFirstPutLane = 3;

int put_lanes(const SymmetricBuffer& buf) {
  return std::max(1, (buf.serial_puts() ? 1 : buf.size() - 1) * buf.put_split());
}

// NOTE [bulk signal lane]: a signal is a stream memory operation with a memory barrier that waits
// for the copy before it; on the put lane it would also hold up the next copy, (n - 1) P of them in
// a row with serial puts and pieces. So the put lanes only copy, back to back, and one signal lane
// announces each put once its copy has completed (an event edge from the put lane, as for the
// joined put_split lanes), in the order the puts complete. Faster at TP 2; on 4xH200 it did not
// make four pieces piece-major any faster (NOTE [bulk_rs pieces]: the cost there was the receivers,
// not the gaps). Measured: docs/performance-log.md [bulk signal lane].
void announce(SymmetricBuffer& buf, int peer, std::uint64_t value, int put_lane,
              cudaStream_t stream) {
  Transport& t = buf.transport();
  t.lane_wait(stream, kSignalLane, put_lane);
  t.signal(buf.flag(peer, buf.rank(), FlagSlot::kData), value, stream, kSignalLane);
}

// The first put lane of the i-th peer in ring order (i = 1..n-1).
int first_put_lane(const SymmetricBuffer& buf, int i) {
  return kFirstPutLane + (buf.serial_puts() ? 0 : (i - 1) * buf.put_split());
}

// NOTE [bulk independence]: the side GEMM runs while peers write into this rank's buffer and
// while the collective reads its input and writes its output, in no particular order. Its
// result (and the collective's) is only well defined when the two share no memory that
// either one writes, so every such overlap is refused before the op begins:
//   - GEMM inputs and output vs. the buffer (written by peers, read by the reduction);
//   - GEMM output vs. the collective's input (read by the puts and the reduction);
//   - GEMM inputs and output vs. the collective's output (written by the reduction).
// GEMM inputs may share memory with the collective's input (both only read it).
struct Extent {
  const char* begin = nullptr;
  const char* end = nullptr;
  const char* what = "";
};

Extent extent(const void* p, std::size_t bytes, const char* what) {
  const char* b = static_cast<const char*>(p);
  return Extent{b, b + bytes, what};
}

// The bytes a stored [rows, cols] matrix with leading dimension ld spans (after validation).
std::size_t matrix_bytes(std::int64_t rows, std::int64_t cols, std::int64_t ld, DType dtype) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<std::size_t>((rows - 1) * ld + cols) * dtype_size(dtype);
}

std::vector<Extent> gemm_reads(const SideGemm& g) {
  return {extent(g.a.data, matrix_bytes(g.a.rows, g.a.cols, g.a.ld, g.a.dtype), "input a"),
          extent(g.b.data, matrix_bytes(g.b.rows, g.b.cols, g.b.ld, g.b.dtype), "input b")};
}

std::vector<Extent> gemm_writes(const SideGemm& g) {
  std::vector<Extent> w = {
      extent(g.d.data, matrix_bytes(g.d.rows, g.d.cols, g.d.ld, g.d.dtype), "output")};
  if (g.d.amax != nullptr) w.push_back(extent(g.d.amax, sizeof(float), "amax"));
  return w;
}

void check_disjoint(const std::vector<Extent>& gemm, const Extent& comm, const char* op) {
  for (const Extent& x : gemm) {
    const bool overlap = x.begin < comm.end && comm.begin < x.end;
    OVERLAP_CHECK_ARG(!overlap, op << ": the side GEMM's " << x.what << " overlaps " << comm.what
                                   << "; the GEMM beside a bulk collective must not share memory "
                                      "with it (NOTE [bulk independence])");
  }
}

// Everything the side GEMM needs checked before the op begins; returns its options with the
// SM margin applied (cuda, when the caller gave no sm_count).
gemm::GemmOptions check_side_gemm(const SymmetricBuffer& buf, const SideGemm& g, int sm_margin,
                                  const char* op) {
  const gemm::GemmTarget target = gemm::gemm_target(buf.transport().device());
  gemm::GemmOptions options = g.options;
  if (options.sm_count == 0 && sm_margin > 0 && !target.host) {
    options.sm_count = std::max(1, target.sm_count - sm_margin);
  }
  gemm::validate_gemm(g.a, g.b, g.d, options, target);
  check_disjoint(gemm_reads(g), extent(buf.data(buf.rank()), buf.bytes(), "the symmetric buffer"),
                 op);
  check_disjoint(gemm_writes(g), extent(buf.data(buf.rank()), buf.bytes(), "the symmetric buffer"),
                 op);
  return options;
}

// What begin_op checks too, done before the fork: the GEMM is issued ahead of begin_op.
void check_can_begin(const SymmetricBuffer& buf, cudaStream_t stream, const char* op) {
  buf.check_ready(op);
  buf.transport().raise_if_failed();
  buf.transport().check_stream(stream);
}

// NOTE [bulk schedule]: the GEMM is issued first, on its own lane forked from the caller's
// stream, and so waits for nothing of the collective (a late peer delays the collective,
// never the GEMM). begin_op then runs on the caller's stream. Both bulk ops only push (nobody
// reads a peer's region), so begin_op does not wait for the acknowledgements there: the put
// lanes wait for each peer's before they write into its buffer (NOTE [deferred
// acknowledgements], NOTE [buffer reuse]), or, when begin_op did wait for all of them (host
// transport, capture, after a pull op), for the caller's stream, since the lanes were forked
// before it. If begin_op throws (an op-record mismatch), the lanes are joined first, so that
// the caller's stream still covers the GEMM it was promised.
std::uint64_t begin_beside_gemm(SymmetricBuffer& buf, OpCode code, std::uint64_t arg,
                                const SideGemm& g, const gemm::GemmOptions& options, int lanes,
                                const char* op, cudaStream_t stream) {
  Transport& t = buf.transport();
  t.fork(stream, lanes);
  t.gemm(g.a, g.b, g.d, options, stream, kGemmLane);
  try {
    return begin_op(buf, code, arg, op, stream, OpAccess{/*pushes_only=*/true});
  } catch (...) {
    t.join(stream);
    throw;
  }
}

// Copies `bytes` from src to dst, in `peer`'s buffer, on the put lanes first..first+split-1,
// the op's first write into `peer` (`first_write`) once `peer` may be written (NOTE [bulk
// schedule]); lane `first` then waits for the others.
void put_to_peer(SymmetricBuffer& buf, std::uint64_t epoch, int peer, char* dst, const char* src,
                 std::size_t bytes, int first, bool first_write, const char* op,
                 cudaStream_t stream) {
  Transport& t = buf.transport();
  const int split = buf.put_split();
  if (first_write && buf.acked_epoch() == epoch) {
    t.lane_wait(stream, first, 0);  // begin_op waited for every acknowledgement on lane 0
  } else if (first_write) {
    wait_ack(buf, epoch, peer, op, stream, first);
  }  // later writes follow the first in order on lane `first`
  for (int s = 1; s < split; ++s) t.lane_wait(stream, first + s, first);
  const std::size_t slice = (bytes + split - 1) / split;
  for (int s = 0; s < split; ++s) {
    const std::size_t begin = std::min(bytes, s * slice);
    t.put(dst + begin, src + begin, std::min(bytes - begin, slice), stream, first + s);
  }
  for (int s = 1; s < split; ++s) t.lane_wait(stream, first, first + s);
}

}  // namespace

// NOTE [bulk_all_gather schedule]: timeline of rank r (n ranks, S = put_split, c0 = the
// caller's stream):
//
// clang-format off
//   c0      | fork | begin_op | put own shard -> own slot r | wait kData(r-1) ... kData(r+1) | join
//   gemm    |      | GEMM (independent operands, its own sm_count) .......................... |
//   put     |      |          | wait kAck(r+1), put shard + scale_inv -> slot r of rank r+1;  |
//           |      |          |   then r+2, ..., r-1 (S lanes, joined per peer)               |
//   signal  |      |          | after each peer's put (event edge): signal its kData          |
// clang-format on
//
// Without serial puts, the put lanes of peer r+i (a set of S per peer) carry its put, all
// peers at once. The puts are copy-engine copies and the flags stream memory operations, so
// the all-gather takes no SM from the GEMM. The layout is ag_gemm's (NOTE [ag_gemm layout]):
// a buffer filled here reads like one filled by ag_gemm.
void all_gather_beside_gemm(SymmetricBuffer& buf, const GatherShard& shard, const SideGemm& g,
                            cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  // ---- validation: nothing below the fork may throw for a bad argument -----------------------
  check_can_begin(buf, stream, kAgOp);
  OVERLAP_CHECK_ARG(shard.data != nullptr && shard.bytes > 0,
                    kAgOp << ": the shard is empty (" << shard.bytes << " bytes)");
  const bool scaled = shard.scale_inv != nullptr;
  const AgGemmLayout l = ag_gemm_layout(n, shard.bytes, scaled);
  detail::check_fits(buf, l.bytes, kAgOp);
  const gemm::GemmOptions options = check_side_gemm(buf, g, /*sm_margin=*/0, kAgOp);
  check_disjoint(gemm_writes(g), extent(shard.data, shard.bytes, "the shard"), kAgOp);
  if (scaled) {
    check_disjoint(gemm_writes(g), extent(shard.scale_inv, sizeof(float), "the shard's scale_inv"),
                   kAgOp);
  }
  const std::uint64_t arg = mix_arg(mix_arg(0, shard.bytes), scaled ? 1 : 0);

  // ---- the op --------------------------------------------------------------------------------
  const int lanes = kFirstPutLane + put_lanes(buf);
  const std::uint64_t epoch =
      begin_beside_gemm(buf, OpCode::kBulkAllGather, arg, g, options, lanes, kAgOp, stream);
  const char* src = static_cast<const char*>(shard.data);
  // Pushes before waits: the host transport runs in program order.
  for (int i = 1; i < n; ++i) {
    const int peer = (r + i) % n;
    const int first = first_put_lane(buf, i);
    put_to_peer(buf, epoch, peer, buf.data(peer) + r * l.shard_bytes, src, l.shard_bytes, first,
                /*first_write=*/true, kAgOp, stream);
    if (scaled) {
      t.put(buf.data(peer) + l.scale_offset + r * kScaleSlotBytes, shard.scale_inv, sizeof(float),
            stream, first);
    }
    announce(buf, peer, epoch, first, stream);
  }
  char* const own = buf.data(r);
  t.put(own + r * l.shard_bytes, src, l.shard_bytes, stream, 0);
  if (scaled) {
    t.put(own + l.scale_offset + r * kScaleSlotBytes, shard.scale_inv, sizeof(float), stream, 0);
  }
  for (int i = 1; i < n; ++i) {
    const int peer = (r + n - i) % n;
    WaitContext ctx{kAgOp, r, peer, i, epoch, buf.timeout_s()};
    t.wait(buf.flag(r, peer, FlagSlot::kData), epoch, ctx, stream, 0);
  }
  t.join(stream);
}

// NOTE [bulk_reduce_scatter schedule]: push, then reduce locally. Timeline of rank r (n
// ranks, S = put_split, m = rows / n, c0 = the caller's stream, one piece):
//
// clang-format off
//   c0      | fork | begin_op | wait kData(r-1) ... kData(r+1) | reduce (<= reduce_max_blocks) | join
//   gemm    |      | GEMM (sm_count = SMs - gemm_sm_margin) ................................... |
//   put     |      |          | wait kAck(r+1), put input rows of rank r+1 -> its slot r;       |
//           |      |          |   then r+2, ..., r-1 (S lanes, joined per peer)                 |
//   signal  |      |          | after each peer's put (event edge): signal its kData            |
// clang-format on
//
// (Serial puts, the default; without them a set of S put lanes per peer, all peers at once.)
//
// The copy engines carry every byte over NVLink (no SM), straight from the caller's input
// into the peers' buffers (no staging copy); the reduction then reads local memory only: the
// own rows of the input and the n-1 slots, summed in rank order with fp32 accumulation (the
// same sum on every rank, and the same as the reference's). Its grid is bounded and the GEMM
// plans for the SMs left, so both make progress while they overlap. A peer writes our slots
// only after we acknowledged this op, i.e. after our previous op's reduction (stream-ordered
// before that acknowledgement) finished reading them (NOTE [buffer reuse]); nobody reads our
// region remotely, so the op only pushes (NOTE [bulk schedule]).
//
// NOTE [bulk_rs pieces]: the reduction can only start once the last byte has landed, and it then
// needs (n + 1) m N elements of HBM traffic on the SMs the GEMM left, so with one piece the GEMM
// must leave many SMs free for nearly its whole run. With P = config.pieces > 1, each peer's rows
// travel in P pieces (rows [lo(p), lo(p + 1)) of every chunk, slot and output, like NOTE [gemm_rs
// pieces]), piece p announced by the value e + p on the one kData flag (the pieces of one sender
// are announced in order on its signal lane: "flag >= e + p" means pieces 0..p have landed), and c0
// reduces piece p as soon as every peer's piece p is there (the amax max-reduced over the pieces).
// The reduction then runs beside the later pushes: the same work spread over a longer window, so a
// smaller SM margin suffices. Every op takes kPieceEpochs epochs whatever P, so that ranks stay in
// step if one passes a different P (the op record, which includes P, reports it).
//
// With more than one peer and serial puts the pieces go peer-major (all of peer r+1's pieces, then
// r+2's, ...), so that each rank still sends to one peer at a time in n - 1 long steps and a
// receiver is written by one sender at a time. Piece p of the last sender lands in the last step,
// so pieces 0..P-2 are reduced beside the last step's copies and only the last piece's reduction
// follows it. Piece-major (piece p to every peer first) made the steps P times as many and as
// short, and was slower on 4xH200: whenever ranks are out of step a receiver is written by two
// senders at once, and a copy beside a second sender is much slower than alone; more and shorter
// steps leave more of the op exposed to that. Measured: docs/performance-log.md [bulk_rs pieces].
void reduce_scatter_beside_gemm(SymmetricBuffer& buf, const ScatterInput& in,
                                const ScatterOutput& out, const SideGemm& g,
                                const BulkRsConfig& config, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  // ---- validation: nothing below the fork may throw for a bad argument -----------------------
  check_can_begin(buf, stream, kRsOp);
  OVERLAP_CHECK(config.gemm_sm_margin >= 0, kConfig,
                kRsOp << ": gemm_sm_margin must be >= 0, got " << config.gemm_sm_margin);
  detail::check_pieces(config.pieces, kRsOp);
  OVERLAP_CHECK_ARG(
      in.dtype == DType::kBFloat16 || in.dtype == DType::kFloat16 || in.dtype == DType::kFloat32,
      kRsOp << ": the input must be bfloat16, float16 or float32, got " << dtype_name(in.dtype));
  OVERLAP_CHECK_ARG(in.data != nullptr && in.cols >= 1 && in.rows >= n && in.rows % n == 0,
                    kRsOp << ": the input's " << in.rows << " rows (tokens) must be a positive "
                          << "multiple of the group size " << n << " and its columns (" << in.cols
                          << ") >= 1; pad the tokens");
  const bool fp8_out = dtype_is_fp8(out.dtype);
  OVERLAP_CHECK_ARG(fp8_out || out.dtype == in.dtype,
                    kRsOp << ": the output must be " << dtype_name(in.dtype)
                          << " (the input's dtype) or FP8, got " << dtype_name(out.dtype));
  OVERLAP_CHECK_ARG(fp8_out
                        ? out.scale != nullptr
                        : (out.scale == nullptr && out.scale_inv == nullptr && out.amax == nullptr),
                    kRsOp << ": an FP8 output needs a scale (amax and scale_inv optional); other "
                             "outputs take none");
  const std::int64_t m = in.rows / n;
  OVERLAP_CHECK_ARG(out.rows == m && out.cols == in.cols,
                    kRsOp << ": the output must be [" << m << ", " << in.cols
                          << "] (rows / size, cols), got [" << out.rows << ", " << out.cols << "]");
  const std::size_t in_es = dtype_size(in.dtype);
  const std::size_t chunk_bytes = static_cast<std::size_t>(m * in.cols) * in_es;
  const std::size_t out_bytes = static_cast<std::size_t>(m * in.cols) * dtype_size(out.dtype);
  const BulkRsLayout l = bulk_rs_layout(n, chunk_bytes);
  detail::check_fits(buf, l.bytes, kRsOp);
  const gemm::GemmOptions options = check_side_gemm(buf, g, config.gemm_sm_margin, kRsOp);
  const Extent input = extent(in.data, chunk_bytes * n, "the reduce-scatter's input");
  const Extent output = extent(out.data, out_bytes, "the reduce-scatter's output");
  check_disjoint(gemm_writes(g), input, kRsOp);
  check_disjoint(gemm_writes(g), output, kRsOp);
  check_disjoint(gemm_reads(g), output, kRsOp);
  for (const float* p :
       {out.scale, static_cast<const float*>(out.scale_inv), static_cast<const float*>(out.amax)}) {
    if (p != nullptr)
      check_disjoint(gemm_writes(g), extent(p, sizeof(float), "an FP8 scalar"), kRsOp);
  }
  // Our own put lanes may still read the input while the reduction writes the output.
  check_disjoint({output}, input, kRsOp);
  check_disjoint({output}, extent(buf.data(r), buf.bytes(), "the symmetric buffer"), kRsOp);
  const detail::Pieces pc(m, config.pieces);
  std::uint64_t arg = 0;
  for (std::uint64_t v : {std::uint64_t(in.rows), std::uint64_t(in.cols), std::uint64_t(in.dtype),
                          std::uint64_t(out.dtype), std::uint64_t(pc.count())}) {
    arg = mix_arg(arg, v);
  }

  // ---- the op --------------------------------------------------------------------------------
  const int lanes = kFirstPutLane + put_lanes(buf);
  const std::uint64_t epoch =
      begin_beside_gemm(buf, OpCode::kBulkReduceScatter, arg, g, options, lanes, kRsOp, stream);
  detail::take_piece_epochs(buf, stream);  // NOTE [bulk_rs pieces]
  const char* src = static_cast<const char*>(in.data);
  const std::size_t in_row_bytes = static_cast<std::size_t>(in.cols) * in_es;
  const std::size_t out_row_bytes = static_cast<std::size_t>(in.cols) * dtype_size(out.dtype);
  // In the order the pieces land (NOTE [bulk_rs pieces]), which is the signal lane's: with
  // serial puts peer-major (every piece of peer r+1's rows, then r+2's, ...), with a put lane
  // set per peer piece-major (piece p to every peer, then piece p + 1).
  const bool serial = buf.serial_puts();
  const int steps = (n - 1) * pc.count();
  for (int k = 0; k < steps; ++k) {
    const int i = 1 + (serial ? k / pc.count() : k % (n - 1));
    const int p = serial ? k % pc.count() : k / (n - 1);
    const int peer = (r + i) % n;
    const int first = first_put_lane(buf, i);
    const std::size_t offset = static_cast<std::size_t>(pc.lo(p)) * in_row_bytes;
    const std::size_t bytes = static_cast<std::size_t>(pc.rows(p)) * in_row_bytes;
    put_to_peer(buf, epoch, peer, buf.data(peer) + r * l.slot_bytes + offset,
                src + peer * chunk_bytes + offset, bytes, first, /*first_write=*/p == 0, kRsOp,
                stream);
    announce(buf, peer, epoch + static_cast<std::uint64_t>(p), first, stream);
  }
  ReduceOutput o;
  o.format = out.dtype;
  o.scale = out.scale;
  o.scale_inv = out.scale_inv;
  o.amax = out.amax;
  o.max_blocks = config.reduce_max_blocks;
  for (int p = 0; p < pc.count(); ++p) {
    const std::uint64_t value = epoch + static_cast<std::uint64_t>(p);
    for (int i = 1; i < n; ++i) {
      const int peer = (r + n - i) % n;
      WaitContext ctx{kRsOp, r, peer, i, value, buf.timeout_s()};
      t.wait(buf.flag(r, peer, FlagSlot::kData), value, ctx, stream, 0);
    }
    // Rank order: the same sum on every rank whichever rank computed which partial.
    const std::size_t offset = static_cast<std::size_t>(pc.lo(p)) * in_row_bytes;
    std::vector<const void*> inputs(n);
    for (int j = 0; j < n; ++j) {
      inputs[j] = j == r ? static_cast<const void*>(src + r * chunk_bytes + offset)
                         : static_cast<const void*>(buf.data(r) + j * l.slot_bytes + offset);
    }
    o.accumulate_amax = p > 0;
    t.reduce(static_cast<char*>(out.data) + pc.lo(p) * out_row_bytes, inputs.data(), n,
             static_cast<std::size_t>(pc.rows(p) * in.cols), in.dtype, o, stream, 0);
  }
  t.join(stream);
}

}  // namespace overlap::comm

// Bulk overlap: one all-gather or reduce-scatter of one tensor beside one unrelated GEMM.
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
  // One slot per peer; one at size 1, where nothing is received, since a buffer is never empty.
  l.bytes = l.slot_bytes * static_cast<std::size_t>(std::max(size - 1, 1));
  return l;
}

std::size_t bulk_rs_slot(int owner, int sender) {
  return static_cast<std::size_t>(sender < owner ? sender : sender - 1);
}

namespace {

constexpr const char* kAgOp = "bulk_all_gather";
constexpr const char* kRsOp = "bulk_reduce_scatter";

// Lanes: 0 = the caller's stream, 1 = the GEMM, 2 = signals, then one set of put_split put
// lanes (NOTE [serial puts]) or one set per peer.
constexpr int kGemmLane = 1;
constexpr int kSignalLane = 2;
constexpr int kFirstPutLane = 3;

int put_lanes(const SymmetricBuffer& buf) {
  return std::max(1, (buf.serial_puts() ? 1 : buf.size() - 1) * buf.put_split());
}

// NOTE [bulk signal lane]: a signal's memory barrier waits for the copy before it, and on the put
// lane it would hold up the next copy too. So the put lanes only copy, back to back, and a
// signal lane announces each put after an event edge from its lane. Verdict: faster at TP 2.
// Measured: docs/performance-log.md [bulk signal lane].
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

// NOTE [bulk independence]: the side GEMM and the collective run in no particular order, so
// neither may write memory the other touches (refused before the op); both may read one input.
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

// Checks the side GEMM; returns its options with the SM margin applied.
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

// NOTE [bulk schedule]: the GEMM is issued first on its own lane, so a late peer delays the
// collective, never the GEMM. Both ops only push: the put lanes wait for each peer's
// acknowledgement (NOTE [deferred acknowledgements]), or for lane 0 where begin_op waited for
// all. If begin_op throws, the lanes are joined so the caller's stream still covers the GEMM.
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

// Copies into `peer`'s buffer on lanes first..first+split-1 (the first write once `peer` may
// be written, NOTE [bulk schedule]); lane `first` then waits for the others.
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

// NOTE [bulk_all_gather schedule]: rank r, S = put_split, c0 = the caller's stream:
// clang-format off
//   c0      | fork | begin_op | put own shard -> own slot r | wait kData(r-1) ... kData(r+1) | join
//   gemm    |      | GEMM (independent operands, its own sm_count) .......................... |
//   put     |      |          | wait kAck(r+1), put shard + scale_inv -> slot r of r+1; then r+2, ..., r-1 |
//   signal  |      |          | after each peer's put (event edge): signal its kData          |
// clang-format on
// Copy engines and stream memory operations only: no SM taken from the GEMM.
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

// NOTE [bulk_reduce_scatter schedule]: push, then reduce locally (rank r, one piece):
// clang-format off
//   c0      | fork | begin_op | wait kData(r-1) ... kData(r+1) | reduce (<= reduce_max_blocks) | join
//   gemm    |      | GEMM (sm_count = SMs - gemm_sm_margin) ................................... |
//   put     |      |          | wait kAck(r+1), put input rows of r+1 -> its slot r; then r+2, ..., r-1 |
//   signal  |      |          | after each peer's put (event edge): signal its kData            |
// clang-format on
// The reduction reads local memory only, in rank order, on a bounded grid beside the GEMM.
//
// NOTE [bulk_rs pieces]: with one piece the reduction starts after the last byte, so the GEMM
// must leave many SMs free for nearly its whole run. With P > 1 row pieces (announced as in NOTE
// [ag_gemm pieces]) c0 reduces piece p beside the later pushes: a smaller SM margin suffices.
// Serial puts go peer-major (one sender per receiver; piece-major was slower on 4xH200).
// Measured: docs/performance-log.md [bulk_rs pieces].
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
  // In the order the pieces land: serial puts peer-major, a lane set per peer piece-major.
  const bool serial = buf.serial_puts();
  const int steps = (n - 1) * pc.count();
  for (int k = 0; k < steps; ++k) {
    const int i = 1 + (serial ? k / pc.count() : k % (n - 1));
    const int p = serial ? k % pc.count() : k / (n - 1);
    const int peer = (r + i) % n;
    const int first = first_put_lane(buf, i);
    const std::size_t offset = static_cast<std::size_t>(pc.lo(p)) * in_row_bytes;
    const std::size_t bytes = static_cast<std::size_t>(pc.rows(p)) * in_row_bytes;
    put_to_peer(buf, epoch, peer, buf.data(peer) + bulk_rs_slot(peer, r) * l.slot_bytes + offset,
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
      inputs[j] =
          j == r
              ? static_cast<const void*>(src + r * chunk_bytes + offset)
              : static_cast<const void*>(buf.data(r) + bulk_rs_slot(r, j) * l.slot_bytes + offset);
    }
    o.accumulate_amax = p > 0;
    t.reduce(static_cast<char*>(out.data) + pc.lo(p) * out_row_bytes, inputs.data(), n,
             static_cast<std::size_t>(pc.rows(p) * in.cols), in.dtype, o, stream, 0);
  }
  t.join(stream);
}

}  // namespace overlap::comm

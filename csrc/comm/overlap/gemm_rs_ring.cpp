// GEMM -> RS, ring exchange: Y_shard = ReduceScatter(X @ op(W_shard)) with each chunk's running
// sum travelling the ring and every rank adding its partial with the GEMM's own epilogue.
#include <algorithm>

#include "comm/op_protocol.h"
#include "comm/overlap/op_common.h"
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

using detail::kSlotAlign;
using detail::round_up;

GemmRsLayout gemm_rs_ring_layout(int size, std::size_t partial_bytes) {
  GemmRsLayout l;
  l.slot_bytes = round_up(partial_bytes, kSlotAlign);
  l.recv_offset = l.slot_bytes;  // slot 0 is the send slot
  l.bytes = l.slot_bytes * static_cast<std::size_t>(size);
  return l;
}

// NOTE [ring sub-epochs]: flag values only grow (NOTE [flags]), so the ring's (size - 1) x
// subchunks pieces on the one flag r -> r+1 take E epochs of their own: piece i is announced by
// e + i ("flag >= e + i": pieces 0..i landed, they go in order). E depends on the group size
// alone (ranks stay in step) and is odd (NOTE [op records] keep alternating slots).
std::uint64_t gemm_rs_ring_epochs(int size) {
  const std::uint64_t pieces =
      static_cast<std::uint64_t>(std::max(0, size - 1)) * kMaxRingSubchunks;
  const std::uint64_t e = std::max<std::uint64_t>(1, pieces);
  return e % 2 ? e : e + 1;
}

namespace {

constexpr const char* kOp = "gemm_rs_ring";
constexpr std::uint64_t kRingTag = 0x52494e47;  // "RING": the op record differs from gemm_rs's

// The sub-GEMMs of one op, the same list for validation and for the issue loop.
class RingPlan {
 public:
  RingPlan(const SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOutput& d,
           const detail::GemmRsShape& shape, int subchunks)
      : buf_(buf), a_(a), d_(d), s_(shape), r_(buf.rank()), n_(buf.size()) {
    k_ = static_cast<int>(std::min<std::int64_t>(subchunks, shape.m));
    l_ = gemm_rs_ring_layout(n_, part_bytes(shape.m));
    fp8_out_ = dtype_is_fp8(d.dtype);
  }

  int subchunks() const { return k_; }
  // Byte offset and size of sub-chunk k within a slot (or within the output).
  std::size_t offset(int k) const { return part_bytes(lo(k)); }
  std::size_t bytes(int k) const { return part_bytes(rows(k)); }
  const GemmRsLayout& layout() const { return l_; }
  // Rows [lo(k), lo(k + 1)) of a chunk form sub-chunk k.
  std::int64_t lo(int k) const { return s_.m * k / k_; }
  std::int64_t rows(int k) const { return lo(k + 1) - lo(k); }
  std::size_t part_bytes(std::int64_t rows) const {
    return static_cast<std::size_t>(rows * s_.cols) * dtype_size(s_.partial);
  }
  // The chunk rank r works on at step s: rank (r - s - 1) mod n's.
  int chunk(int s) const { return ((r_ - s - 1) % n_ + n_) % n_; }
  // Slot `i` of `owner`'s region (0: send, 1 + h: receive slot of hop h).
  char* slot(int owner, int i) const { return buf_.data(owner) + i * l_.slot_bytes; }
  // Where step s leaves its running sum: the output (non-FP8, last step), else a slot.
  bool writes_output(int s) const { return s == n_ - 1 && !fp8_out_; }
  int out_slot(int s) const { return s == 0 ? 0 : s; }  // slot 1 + (s - 1)
  int final_slot() const { return out_slot(n_ - 1); }

  char* output_rows(int k) const { return static_cast<char*>(d_.data) + offset(k); }

  gemm::GemmOperand input(int s, int k) const {
    return detail::row_block(a_, chunk(s) * s_.m + lo(k), rows(k));
  }
  gemm::GemmOutput output(int s, int k) const {
    gemm::GemmOutput o;
    if (writes_output(s)) {
      o = d_;
    } else {
      o.data = slot(r_, out_slot(s));
      o.dtype = s_.partial;
      o.rows = s_.m;
      o.cols = s_.cols;
      o.ld = s_.cols;
    }
    o.row_offset = lo(k);
    return o;
  }
  gemm::GemmOptions options(const gemm::GemmOptions& base, int s) const {
    gemm::GemmOptions o = base;
    o.beta = s == 0 ? 0.0f : 1.0f;  // add the received running sum, in place
    return o;
  }

 private:
  const SymmetricBuffer& buf_;
  const gemm::GemmOperand& a_;
  const gemm::GemmOutput& d_;
  detail::GemmRsShape s_;
  int r_;
  int n_;
  int k_ = 1;
  bool fp8_out_ = false;
  GemmRsLayout l_;
};

// The ring's two schedules: NOTE [gemm_rs_ring schedule] and NOTE [gemm_rs_ring pulls].
struct RingSchedule {
  RingSchedule(SymmetricBuffer& buf_, const RingPlan& plan_, const gemm::GemmOperand& b_,
               const gemm::GemmOptions& options_, int lanes_c_, cudaStream_t stream_)
      : buf(buf_),
        t(buf_.transport()),
        plan(plan_),
        b(b_),
        options(options_),
        lanes_c(lanes_c_),
        stream(stream_),
        r(buf_.rank()),
        n(buf_.size()),
        next((r + 1) % n),
        prev((r + n - 1) % n),
        sub(plan_.subchunks()) {}

  // begin_op, then the sub-epochs (NOTE [ring sub-epochs]); returns the first epoch.
  std::uint64_t open(std::uint64_t arg, OpAccess access) const {
    const std::uint64_t epoch = begin_op(buf, OpCode::kGemmReduceScatter, arg, kOp, stream, access);
    for (std::uint64_t i = 1; i < gemm_rs_ring_epochs(n); ++i) {
      t.note_op(buf, buf.next_epoch(), stream);
    }
    return epoch;
  }

  // NOTE [gemm_rs_ring schedule]: pushes.
  void pushes(std::uint64_t arg) const {
    const std::uint64_t epoch = open(arg, OpAccess{/*pushes_only=*/true});
    const int split = buf.put_split();
    const int put_lane = lanes_c;           // .. put_lane + split - 1
    const int copy_lane = lanes_c + split;  // the last step's copies into the output
    t.fork(stream, lanes_c + split + 1);
    wait_ack(buf, epoch, next, kOp, stream, put_lane);
    for (int p = 1; p < split; ++p) t.lane_wait(stream, put_lane + p, put_lane);
    // Host program order: rank r-1 issues step s-1 before it waits for anything of step s.
    for (int s = 0; s < n; ++s) {
      for (int k = 0; k < sub; ++k) {
        const int q = s * sub + k;
        const int lane = q % lanes_c;
        const std::size_t offset = plan.offset(k);
        const std::size_t bytes = plan.bytes(k);
        if (s > 0) {  // piece (s - 1, k) of rank r-1 is in our receive slot of hop s - 1
          const std::uint64_t piece = epoch + static_cast<std::uint64_t>((s - 1) * sub + k);
          WaitContext ctx{kOp, r, prev, s, piece, buf.timeout_s()};
          const char* recv = plan.slot(r, s) + offset;
          if (plan.writes_output(s)) {
            t.wait(buf.flag(r, prev, FlagSlot::kData), piece, ctx, stream, copy_lane);
            t.put(plan.output_rows(k), recv, bytes, stream, copy_lane);
            t.lane_wait(stream, lane, copy_lane);
          } else {
            t.wait(buf.flag(r, prev, FlagSlot::kData), piece, ctx, stream, lane);
          }
        }
        t.gemm(plan.input(s, k), b, plan.output(s, k), plan.options(options, s), stream, lane);
        if (s == n - 1) continue;
        // Push the running sum on to rank r+1's receive slot of hop s, then announce it.
        const char* src = plan.slot(r, plan.out_slot(s)) + offset;
        char* dst = plan.slot(next, 1 + s) + offset;
        const std::size_t slice = (bytes + split - 1) / split;
        for (int p = 0; p < split; ++p) {
          const std::size_t begin = std::min(bytes, p * slice);
          t.lane_wait(stream, put_lane + p, lane);
          t.put(dst + begin, src + begin, std::min(bytes - begin, slice), stream, put_lane + p);
        }
        for (int p = 1; p < split; ++p) t.lane_wait(stream, put_lane, put_lane + p);
        t.signal(buf.flag(next, r, FlagSlot::kData), epoch + static_cast<std::uint64_t>(q), stream,
                 put_lane);
      }
    }
    t.join(stream);
  }

  // NOTE [gemm_rs_ring pulls].
  void pulls(std::uint64_t arg) const {
    // The successor reads our slots, so every acknowledgement comes first, in one handshake.
    const std::uint64_t epoch = open(arg, OpAccess{/*pushes_only=*/false, /*handshake=*/true});
    const int pull_lane = lanes_c;
    // Several compute lanes announce through one lane, in order (NOTE [ring sub-epochs]).
    const bool signal_lane = lanes_c > 1;
    const int sig_lane = lanes_c + 1;
    t.fork(stream, lanes_c + (signal_lane ? 2 : 1));
    for (int s = 0; s < n; ++s) {
      for (int k = 0; k < sub; ++k) {
        const int q = s * sub + k;
        const int lane = q % lanes_c;
        if (s > 0) {  // rank r-1 left piece (s - 1, k) of its running sum in its slot
          const std::uint64_t piece = epoch + static_cast<std::uint64_t>((s - 1) * sub + k);
          WaitContext ctx{kOp, r, prev, s, piece, buf.timeout_s()};
          char* dst =
              plan.writes_output(s) ? plan.output_rows(k) : plan.slot(r, s) + plan.offset(k);
          t.wait(buf.flag(r, prev, FlagSlot::kData), piece, ctx, stream, pull_lane);
          t.put(dst, plan.slot(prev, plan.out_slot(s - 1)) + plan.offset(k), plan.bytes(k), stream,
                pull_lane);
          t.lane_wait(stream, lane, pull_lane);
        }
        t.gemm(plan.input(s, k), b, plan.output(s, k), plan.options(options, s), stream, lane);
        if (s == n - 1) continue;
        int announce = lane;
        if (signal_lane) {
          t.lane_wait(stream, sig_lane, lane);
          announce = sig_lane;
        }
        t.signal(buf.flag(next, r, FlagSlot::kData), epoch + static_cast<std::uint64_t>(q), stream,
                 announce);
      }
    }
    t.join(stream);
  }

  SymmetricBuffer& buf;
  Transport& t;
  const RingPlan& plan;
  const gemm::GemmOperand& b;
  const gemm::GemmOptions& options;
  int lanes_c;
  cudaStream_t stream;
  int r, n, next, prev;  // this rank, the group size, the ring successor and predecessor
  int sub;               // sub-chunks per chunk
};

}  // namespace

// NOTE [gemm_rs_ring schedule]: chunk c starts at rank c+1, which computes its partial and
// pushes it to c+2; each rank adds its partial to the running sum received (beta = 1, in place)
// and passes it on; rank c adds the last into its output. With whole chunks every step would
// cost GEMM + transfer, so each chunk is split into S = ring_subchunks pieces: one travels while
// the other S-1 are multiplied. Rank r, S = 2, one compute lane, G(s,k) = sub-GEMM k of step s,
// "in" = wait for piece (s-1, k) from r-1:
// clang-format off
//   c0    | begin_op | fork | G(0,0) | G(0,1) | in G(1,0) | in G(1,1) | ... | G(n-1,0) | G(n-1,1) | join | FP8: cast
//   put   |          |      | wait kAck(r+1) | push (0,0) -> r+1 | push (0,1) | push (1,0) | ...  |      |
//   copy  |          |      |                               ... in (n-2,k): recv slot -> out rows |      |
// clang-format on
// The last step accumulates in the output rows (an FP8 output: in its slot, then one cast). No
// slot is written twice in an op, so the put lanes wait for r+1's acknowledgement only once.
//
// NOTE [gemm_rs_ring pulls] (config.pull_shards): each rank signals r+1 right after a piece's
// GEMM and r+1's pull lane copies the running sum from its slot; a pushed piece waits behind its
// copy's signal and the receiver's copy instead.
// Verdict: fastest GEMM+RS on most TP 2 rows (NOTE [ub tp 2]), few at TP 4. Measured:
// docs/performance-log.md [gemm_rs_ring pulls]. Rank r, S = 2, "in" = the pulled piece:
// clang-format off
//   c0    | begin_op: handshake | G(0,0) | sig | G(0,1) | sig | in G(1,0) | sig | in G(1,1) | ... | join
//   pull  |                     | wait (0,0) of r-1 | pull (0,0) | wait (0,1) | pull (0,1) | ...
// clang-format on
//
// NOTE [gemm_rs_ring numerics]: chunk c is (((p_{c+1} + p_{c+2}) + ...) + p_c), each running
// sum rounded to the partial dtype. Verdict: not bit-exact with gemm_rs, which rounds the n
// partials and the fp32 sum once (the tests allow 2 (n + 1) roundings of the largest value).
void gemm_rs_ring(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
                  const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
                  const GemmRsRingConfig& config, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  // ---- validation: nothing below begin_op may throw for a bad argument -----------------------
  const detail::GemmRsShape shape =
      detail::check_gemm_rs(buf, a, b, d, out_scale_inv, options, config.compute_lanes, kOp);
  OVERLAP_CHECK(config.ring_subchunks >= 1 && config.ring_subchunks <= kMaxRingSubchunks, kConfig,
                kOp << ": ring_subchunks must be in [1, " << kMaxRingSubchunks << "], got "
                    << config.ring_subchunks);
  const RingPlan plan(buf, a, d, shape, config.ring_subchunks);
  const int sub = plan.subchunks();
  detail::check_fits(buf, plan.layout().bytes, kOp);
  const gemm::GemmTarget target = gemm::gemm_target(t.device());
  for (int s = 0; s < n; ++s) {
    for (int k = 0; k < sub; ++k) {
      gemm::validate_gemm(plan.input(s, k), b, plan.output(s, k), plan.options(options, s), target);
    }
  }
  std::uint64_t arg = kRingTag;
  for (std::uint64_t v : {std::uint64_t(a.rows), std::uint64_t(a.cols), std::uint64_t(shape.cols),
                          std::uint64_t(a.dtype), std::uint64_t(d.dtype), std::uint64_t(sub),
                          std::uint64_t(config.pull_shards)}) {
    arg = mix_arg(arg, v);
  }

  // ---- the op --------------------------------------------------------------------------------
  const RingSchedule ring(buf, plan, b, options, config.compute_lanes, stream);
  if (config.pull_shards) {
    ring.pulls(arg);
  } else {
    ring.pushes(arg);
  }
  if (dtype_is_fp8(d.dtype)) {  // the final running sum, cast with scale / scale_inv / amax
    const void* input = plan.slot(r, plan.final_slot());
    t.reduce(d.data, &input, 1, static_cast<std::size_t>(shape.m * shape.cols), shape.partial,
             detail::gemm_rs_output(d, out_scale_inv, config.reduce_max_blocks), stream, 0);
  }
}

}  // namespace overlap::comm

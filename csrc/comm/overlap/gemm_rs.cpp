// GEMM -> RS: Y_shard = ReduceScatter(X @ op(W_shard)), each chunk's partial sums leaving for
// their rank while the next chunk is computed.
#include <algorithm>
#include <vector>

#include "comm/op_protocol.h"
#include "comm/overlap/op_common.h"
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

using detail::kSlotAlign;
using detail::Pieces;
using detail::round_up;

GemmRsLayout gemm_rs_layout(int size, std::size_t partial_bytes) {
  GemmRsLayout l;
  l.slot_bytes = round_up(partial_bytes, kSlotAlign);
  l.recv_offset = l.slot_bytes * size;
  l.bytes = l.recv_offset + l.slot_bytes * static_cast<std::size_t>(size - 1);
  return l;
}

std::size_t gemm_rs_recv_slot(int rank, int peer) {
  return static_cast<std::size_t>(peer < rank ? peer : peer - 1);
}

DType gemm_rs_partial_dtype(DType out) {
  return dtype_is_fp8(out) ? DType::kBFloat16 : out;
}

namespace {

constexpr const char* kOp = "gemm_rs";

// Piece p of the rows of X whose sums belong to rank j (NOTE [gemm_rs pieces]).
gemm::GemmOperand piece_operand(const gemm::GemmOperand& a, std::int64_t m, int j, const Pieces& pc,
                                int p) {
  return detail::row_block(a, j * m + pc.lo(p), pc.rows(p));
}

// Piece p of send slot j of this rank's region: its partial sums of rank j's rows.
gemm::GemmOutput piece_slot(const SymmetricBuffer& buf, const GemmRsLayout& l, DType partial,
                            std::int64_t m, std::int64_t cols, int j, const Pieces& pc, int p) {
  gemm::GemmOutput o;
  o.data = buf.data(buf.rank()) + j * l.slot_bytes;
  o.dtype = partial;
  o.rows = m;
  o.cols = cols;
  o.ld = cols;
  o.row_offset = pc.lo(p);
  return o;
}

}  // namespace

namespace detail {

GemmRsShape check_gemm_rs(const SymmetricBuffer& buf, const gemm::GemmOperand& a,
                          const gemm::GemmOperand& b, const gemm::GemmOutput& d,
                          const float* out_scale_inv, const gemm::GemmOptions& options,
                          int compute_lanes, const char* op) {
  const int n = buf.size();
  check_op(buf, compute_lanes, a, b, op);
  OVERLAP_CHECK_ARG(!a.transposed, op << ": the input must not be transposed (its rows are "
                                         "split among the ranks)");
  OVERLAP_CHECK_ARG(a.rows >= n && a.rows % n == 0,
                    op << ": the input's " << a.rows
                       << " rows (tokens) must be a positive multiple of the group size " << n
                       << "; pad the tokens");
  GemmRsShape s;
  s.m = a.rows / n;
  s.cols = b.transposed ? b.rows : b.cols;
  OVERLAP_CHECK_ARG(d.rows == s.m && d.cols == s.cols && d.ld == s.cols && d.row_offset == 0,
                    op << ": the output must be a contiguous [" << s.m << ", " << s.cols
                       << "] matrix (M / size rows), got [" << d.rows << ", " << d.cols
                       << "] with ld " << d.ld << " and row_offset " << d.row_offset);
  OVERLAP_CHECK_ARG(options.bias == nullptr && !options.gelu && options.beta == 0.0f,
                    op << ": bias, gelu and beta would apply to each rank's partial sums; "
                          "apply them after the op");
  const bool fp8_out = dtype_is_fp8(d.dtype);
  OVERLAP_CHECK_ARG(
      fp8_out || d.dtype == DType::kBFloat16 || d.dtype == DType::kFloat16 ||
          d.dtype == DType::kFloat32,
      op << ": the output must be bfloat16, float16, float32 or FP8, got " << dtype_name(d.dtype));
  OVERLAP_CHECK_ARG(fp8_out ? d.scale != nullptr
                            : (d.scale == nullptr && d.amax == nullptr && out_scale_inv == nullptr),
                    op << ": an FP8 output needs a scale (amax and scale_inv optional); other "
                          "outputs take none");
  s.partial = gemm_rs_partial_dtype(d.dtype);
  return s;
}

}  // namespace detail

// NOTE [gemm_rs schedule]: rank r computes the chunks in the order r+1, r+2, ..., r and signals
// each as soon as it is written; its rank pulls it while the next is computed. Only our own
// chunk and the local reduction are exposed. Rank r, one piece:
// clang-format off
//   c0      | begin_op | fork | GEMM r+1, signal | GEMM r+2, signal | ... | GEMM r | join | reduce
//   pull 1  |          |      | wait kData(r-1), pull its send slot r -> recv slot r-1  |      |
//   pull 2  |          |      |        wait kData(r-2), pull its send slot r ...        |      |
//   ...     |          |      |                  ...                                    |      |
//   pull n-1|          |      |                  wait kData(r+1), pull ...              |      |
// clang-format on
// The reduction reads local memory only, in rank order, on a bounded grid. Peers read our send
// slots until they acknowledge our next op (NOTE [buffer reuse]).
//
// NOTE [gemm_rs pieces]: with whole chunks a comm-bound op takes about T_gemm + T_pull(chunk) +
// T_reduce. With P = config.pieces > 1 the GEMMs run in P rounds of row pieces of every chunk;
// piece p is announced by e + p (NOTE [ag_gemm pieces]), pulled, and reduced on a reduce lane
// while later rounds run: about T_gemm + (T_pull + T_reduce) / P, for GEMMs 1/P as tall.
// clang-format off
//   c0 ... C-1 | round 0: GEMM piece 0 of r+1, signal e, ..., of r | round 1: ... e+1 ... | join | reduce P-1
//   pull i     |   wait kData(r-i) >= e, pull piece 0 | wait >= e+1, pull piece 1 | ...  |      |
//   reduce     |        wait pulls and own piece 0, reduce piece 0 | ... piece P-2 |      |      |
// clang-format on
// Verdict: pieces did not pay on 4xH200 (through NVSwitch a rank's pulls run back to back
// whatever the schedule), so the default is 1; no alternative tried beat whole chunks.
// Measured: docs/performance-log.md [gemm_rs pieces].
void gemm_rs(SymmetricBuffer& buf, const gemm::GemmOperand& a, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, float* out_scale_inv, const gemm::GemmOptions& options,
             const GemmRsConfig& config, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  // ---- validation: nothing below begin_op may throw for a bad argument -----------------------
  const detail::GemmRsShape shape =
      detail::check_gemm_rs(buf, a, b, d, out_scale_inv, options, config.compute_lanes, kOp);
  detail::check_pieces(config.pieces, kOp);
  const std::int64_t m = shape.m;
  const std::int64_t cols = shape.cols;
  const DType partial = shape.partial;
  const std::size_t psize = dtype_size(partial);
  const GemmRsLayout l = gemm_rs_layout(n, static_cast<std::size_t>(m * cols) * psize);
  detail::check_fits(buf, l.bytes, kOp);
  const Pieces pc(m, config.pieces);
  const gemm::GemmTarget target = gemm::gemm_target(t.device());
  for (int j : {0, n - 1}) {
    for (int p = 0; p < pc.count(); ++p) {
      gemm::validate_gemm(piece_operand(a, m, j, pc, p), b,
                          piece_slot(buf, l, partial, m, cols, j, pc, p), options, target);
    }
  }
  const int lanes_c = config.compute_lanes;
  const int split = buf.put_split();
  std::uint64_t arg = 0;
  for (std::uint64_t v :
       {std::uint64_t(a.rows), std::uint64_t(a.cols), std::uint64_t(cols), std::uint64_t(a.dtype),
        std::uint64_t(d.dtype), std::uint64_t(pc.count())}) {
    arg = mix_arg(arg, v);
  }
  const ReduceOutput o = detail::gemm_rs_output(d, out_scale_inv, config.reduce_max_blocks);
  const std::size_t out_row_bytes = static_cast<std::size_t>(cols) * dtype_size(d.dtype);
  // Piece p of the output: in rank order, so the same sum on every rank.
  const auto reduce_piece = [&](int p, int lane) {
    const std::size_t offset = static_cast<std::size_t>(pc.lo(p) * cols) * psize;
    std::vector<const void*> inputs(n);
    for (int j = 0; j < n; ++j) {
      const char* slot = j == r
                             ? buf.data(r) + r * l.slot_bytes
                             : buf.data(r) + l.recv_offset + gemm_rs_recv_slot(r, j) * l.slot_bytes;
      inputs[j] = slot + offset;
    }
    ReduceOutput op = o;
    op.accumulate_amax = p > 0;
    t.reduce(static_cast<char*>(d.data) + pc.lo(p) * out_row_bytes, inputs.data(), n,
             static_cast<std::size_t>(pc.rows(p) * cols), partial, op, stream, lane);
  };

  // ---- the op --------------------------------------------------------------------------------
  // One handshake kernel while the SMs are idle (docs/performance-log.md [gemm_rs handshake]).
  const std::uint64_t epoch = begin_op(buf, OpCode::kGemmReduceScatter, arg, kOp, stream,
                                       OpAccess{/*pushes_only=*/false, /*handshake=*/true});
  detail::take_piece_epochs(buf, stream);  // NOTE [gemm_rs pieces]
  const int pull_lanes = std::max(1, (n - 1) * split);
  const int reduce_lane = lanes_c + pull_lanes;  // used with pieces only
  t.fork(stream, reduce_lane + (pc.count() > 1 ? 1 : 0));
  for (int p = 0; p < pc.count(); ++p) {
    // GEMMs first: on host every rank publishes a round before it waits for any peer's.
    for (int s = 0; s < n; ++s) {
      const int j = (r + 1 + s) % n;
      const int lane = s % lanes_c;  // one lane per destination: its pieces stay in order
      t.gemm(piece_operand(a, m, j, pc, p), b, piece_slot(buf, l, partial, m, cols, j, pc, p),
             options, stream, lane);
      if (j != r) {
        t.signal(buf.flag(j, r, FlagSlot::kData), epoch + static_cast<std::uint64_t>(p), stream,
                 lane);
      }
    }
    // Pulls: peer r-i computes our chunk at step i-1, so lanes are listed in arrival order.
    const std::size_t offset = static_cast<std::size_t>(pc.lo(p) * cols) * psize;
    const std::size_t bytes = static_cast<std::size_t>(pc.rows(p) * cols) * psize;
    const std::size_t slice = (bytes + split - 1) / split;
    const std::uint64_t value = epoch + static_cast<std::uint64_t>(p);
    for (int i = 1; i < n; ++i) {
      const int peer = (r + n - i) % n;
      WaitContext ctx{kOp, r, peer, i, value, buf.timeout_s()};
      for (int s = 0; s < split; ++s) {
        const int lane = lanes_c + (i - 1) * split + s;
        const std::size_t begin = offset + std::min(bytes, s * slice);
        t.wait(buf.flag(r, peer, FlagSlot::kData), value, ctx, stream, lane);
        t.put(buf.data(r) + l.recv_offset + gemm_rs_recv_slot(r, peer) * l.slot_bytes + begin,
              buf.data(peer) + r * l.slot_bytes + begin, std::min(offset + bytes - begin, slice),
              stream, lane);
      }
    }
    // Every piece but the last is summed on the reduce lane while later rounds run.
    if (p + 1 < pc.count()) {
      t.lane_wait(stream, reduce_lane, (n - 1) % lanes_c);  // our own piece p
      for (int lane = lanes_c; lane < reduce_lane; ++lane) t.lane_wait(stream, reduce_lane, lane);
      reduce_piece(p, reduce_lane);
    }
  }
  t.join(stream);
  reduce_piece(pc.count() - 1, 0);
}

}  // namespace overlap::comm

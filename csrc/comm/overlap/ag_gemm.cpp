// AG -> GEMM: Y = AllGather(X_shard) @ op(W), each peer's shard multiplied as it arrives.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "comm/op_protocol.h"
#include "comm/overlap/op_common.h"
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

using detail::kSlotAlign;
using detail::Pieces;
using detail::round_up;

AgGemmLayout ag_gemm_layout(int size, std::size_t shard_bytes, bool scaled) {
  AgGemmLayout l;
  l.shard_bytes = shard_bytes;
  const std::size_t data = shard_bytes * static_cast<std::size_t>(size);
  l.scale_offset = scaled ? round_up(data, kSlotAlign) : 0;
  l.bytes = scaled ? l.scale_offset + kScaleSlotBytes * size : data;
  return l;
}

namespace {

constexpr const char* kOp = "ag_gemm";

// Chunk j of the gathered input; the local one is the caller's shard (its GEMM waits for nothing).
gemm::GemmOperand chunk_operand(const SymmetricBuffer& buf, const gemm::GemmOperand& shard,
                                const AgGemmLayout& l, int j) {
  if (j == buf.rank()) return shard;
  gemm::GemmOperand c = shard;
  c.data = buf.data(buf.rank()) + j * l.shard_bytes;
  if (c.scaling == gemm::ScalingMode::kTensor) {
    c.scale_inv =
        reinterpret_cast<const float*>(buf.data(buf.rank()) + l.scale_offset + j * kScaleSlotBytes);
  }
  return c;
}

gemm::GemmOutput chunk_output(const gemm::GemmOutput& d, std::int64_t m, int j) {
  gemm::GemmOutput c = d;
  c.row_offset = j * m;
  return c;
}

// NOTE [ag_gemm pieces]: a peer's shard may travel in P = config.pieces row pieces, each
// multiplied once it lands: a comm-bound op ends T_gemm / (n P) after the gather, not T_gemm / n
// (but smaller GEMMs: P = 1 suits GEMM-bound shapes). Piece p is announced on the kData flag by
// e + p, in order ("flag >= e + p": pieces 0..p landed). Every op takes kPieceEpochs epochs
// whatever P, so the ranks stay in step.
// Piece p of chunk j (the whole chunk for the local shard, j == rank): its operand and output.
gemm::GemmOperand piece_operand(const SymmetricBuffer& buf, const gemm::GemmOperand& shard,
                                const AgGemmLayout& l, int j, const Pieces& pc, int p) {
  const gemm::GemmOperand c = chunk_operand(buf, shard, l, j);
  return j == buf.rank() ? c : detail::row_block(c, pc.lo(p), pc.rows(p));
}

gemm::GemmOutput piece_output(const SymmetricBuffer& buf, const gemm::GemmOutput& d, std::int64_t m,
                              int j, const Pieces& pc, int p) {
  gemm::GemmOutput c = chunk_output(d, m, j);
  if (j != buf.rank()) c.row_offset += pc.lo(p);
  return c;
}

// The rules of one weight and its output; `index` names the weight in messages (-1: only one).
void check_weight(const SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
                  const AgGemmLayout& l, const Pieces& pc, const AgGemmWeight& x, int index,
                  const gemm::GemmTarget& target) {
  const std::string which = index < 0 ? "" : " (weight " + std::to_string(index) + ")";
  const int n = buf.size();
  const int r = buf.rank();
  const std::int64_t m = a_shard.rows;
  detail::check_scaling(x.b, kOp, "the weight");
  const gemm::GemmOutput& d = x.d;
  OVERLAP_CHECK_ARG(d.rows == m * n && d.row_offset == 0,
                    kOp << which << ": the output must have size * m = " << n << " * " << m << " = "
                        << m * n << " rows (got " << d.rows << ", row_offset " << d.row_offset
                        << ")");
  OVERLAP_CHECK(!dtype_is_fp8(d.dtype), kUnsupported,
                kOp << which
                    << ": FP8 outputs are not supported (one amax over the chunk GEMMs is not "
                       "implemented); use a bfloat16/float16/float32 output");
  OVERLAP_CHECK_ARG(x.options.beta == 0.0f,
                    kOp << which << ": beta must be 0 (got " << x.options.beta << ")");
  // The own shard, then every piece of the first and the last buffer slot.
  for (int j : {r, (r + 1) % n, (r + n - 1) % n}) {
    for (int p = 0; p < (j == r ? 1 : pc.count()); ++p) {
      try {
        gemm::validate_gemm(piece_operand(buf, a_shard, l, j, pc, p), x.b,
                            piece_output(buf, d, m, j, pc, p), x.options, target);
      } catch (const Error& e) {
        if (index < 0) throw;
        throw Error(e.kind(), kOp + which + ": " + e.what());
      }
    }
  }
}

// Pulls piece p of rank j's shard from rank j's slot j into ours, on `lane` (NOTE [ag_gemm
// pulls]).
void pull_piece(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const AgGemmLayout& l,
                const Pieces& pc, int j, int p, cudaStream_t stream, int lane) {
  const std::size_t row_bytes = l.shard_bytes / static_cast<std::size_t>(a_shard.rows);
  const std::size_t offset = j * l.shard_bytes + static_cast<std::size_t>(pc.lo(p)) * row_bytes;
  buf.transport().put(buf.data(buf.rank()) + offset, buf.data(j) + offset,
                      static_cast<std::size_t>(pc.rows(p)) * row_bytes, stream, lane);
}

// The local flag (NOTE [local flags]) our own pull lane sets to the op's epoch once chunk j's
// piece p has landed (NOTE [fused ag_gemm]); epochs only grow, so the flags do.
std::uint64_t* landed_flag(const SymmetricBuffer& buf, int j, int p) {
  return buf.local_flag(j * kMaxPieces + p);
}

// The waiting GEMM's groups (NOTE [waiting gemm]) and what each waits for: our own chunk,
// then each peer's pieces in pull order, every weight of each. Built (and validated) before
// the op begins; the op sets the awaited values to its epoch (with_epoch).
struct FusedGroups {
  std::vector<gemm::WaitingGemmGroup> groups;
  std::vector<WaitContext> ctxs;
  // When the last shard should land, from the GEMM's start (the pulls and the GEMM start
  // together, after the handshakes): for the kernel choice only (kFusedPullBytesPerMs).
  double last_arrival_ms = 0.0;

  void with_epoch(std::uint64_t epoch) {
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].flag == nullptr) continue;
      groups[i].value = epoch;
      ctxs[i].epoch = epoch;
    }
  }
};
FusedGroups fused_groups(const SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
                         const std::vector<AgGemmWeight>& weights, const AgGemmLayout& l,
                         const Pieces& pc) {
  const int r = buf.rank();
  const int n = buf.size();
  FusedGroups f;
  for (int s = 0; s < n; ++s) {
    const int j = (r + s) % n;
    for (int p = 0; p < (j == r ? 1 : pc.count()); ++p) {
      for (const AgGemmWeight& x : weights) {
        gemm::WaitingGemmGroup g;
        g.a = piece_operand(buf, a_shard, l, j, pc, p);
        g.b = x.b;
        g.d = piece_output(buf, x.d, a_shard.rows, j, pc, p);
        if (j != r) g.flag = landed_flag(buf, j, p);
        f.groups.push_back(g);
        f.ctxs.push_back(WaitContext{kOp, r, j, s, 0, buf.timeout_s()});
      }
    }
  }
  const double shard_bytes = static_cast<double>(a_shard.rows * a_shard.cols) *
                             static_cast<double>(dtype_size(a_shard.dtype));
  f.last_arrival_ms = (n - 1) * shard_bytes / kFusedPullBytesPerMs;
  return f;
}

// NOTE [fused ag_gemm]: config.fused_gemm, on the pulls' handshakes (NOTE [ag_gemm pulls]):
// clang-format off
//   c0 | begin_op | handshakes (as the pulls) | fork | waiting GEMM: own chunk, then each chunk once its flag is set | join
//   P  |          |                           |      | pull slot r+1, signal landed(r+1) := e | pull slot r+2, signal ... | ...
// clang-format on
// One GEMM kernel for the whole op (NOTE [waiting gemm]): no GEMM launch, wait or join per
// chunk, and the chunks' tiles share the SMs, so a GEMM-bound op runs as one GEMM and a
// comm-bound one ends a last chunk's share of the GEMM after its pull. Every SM-using step the
// GEMM depends on (the handshakes) precedes it on c0; the pulls and flags are copy-engine work
// and memops, so a GEMM holding every SM cannot starve them. The pulls are issued before the
// GEMM (the host transport runs lanes in program order). The flags are local (NOTE [local
// flags]): only our own pull lane sets them, so the GEMM's waits need no watchdog. A captured op
// runs the chunked pulls instead: a graph replays the flag values it captured, and a local flag
// already holding one would pass before its shard landed (the result is the same). bfloat16
// only (the kernel's rules); ranks may differ in this setting. Measured:
// docs/performance-log.md [fused ag_gemm].
void ag_gemm_fused(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const AgGemmLayout& l,
                   const Pieces& pc, const gemm::GemmOptions& options, FusedGroups& fused,
                   std::uint64_t epoch, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  constexpr int kPullLane = 1;
  t.fork(stream, kPullLane + 1);
  for (int s = 1; s < n; ++s) {
    const int j = (r + s) % n;
    for (int p = 0; p < pc.count(); ++p) {
      pull_piece(buf, a_shard, l, pc, j, p, stream, kPullLane);
      t.signal(landed_flag(buf, j, p), epoch, stream, kPullLane);
    }
  }
  fused.with_epoch(epoch);
  t.waiting_gemm(fused.groups, fused.ctxs, options, fused.last_arrival_ms, stream, 0);
  t.join(stream);
}

// NOTE [ag_gemm pulls]: config.pull_shards, torch async-TP's order with handshake kernels
// (NOTE [handshakes]) where the ranks meet. Rank r, C compute lanes, P = the pull lane:
// clang-format off
//   c0 | begin_op: handshake kAck(e) | shard -> slot r | handshake kData(e) (+ scale_invs) | fork | GEMM chunk r | GEMM r+C ... | join
//   c1 |                             |                 |                                   |      | wait P(r+1), GEMM chunk r+1 | ...
//   P  |                             |                 |                                   |      | pull slot r+1 of r+1 | pull slot r+2 of r+2 | ...
// clang-format on
// The first handshake frees our slot r, the second publishes every shard and moves the FP8
// scale_invs as words; then rank r+s's slot is pulled at step s, no flag per chunk. Verdict: no
// faster than the pushes once regions were rounded to 2 MiB (NOTE [allocation granularity]).
// Measured: docs/performance-log.md [ag_gemm pulls].
void ag_gemm_pulled(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
                    const std::vector<AgGemmWeight>& weights, const AgGemmLayout& l,
                    const Pieces& pc, const AgGemmConfig& config, std::uint64_t arg,
                    FusedGroups* fused, cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  const bool scaled = a_shard.scaling == gemm::ScalingMode::kTensor;
  const int lanes_c = config.compute_lanes;
  const std::uint64_t epoch = begin_op(buf, OpCode::kAllGatherGemm, arg, kOp, stream,
                                       OpAccess{/*pushes_only=*/false, /*handshake=*/true});
  detail::take_piece_epochs(buf, stream);  // NOTE [ag_gemm pieces]: same epochs as pushes
  char* const own = buf.data(r);
  t.put(own + r * l.shard_bytes, a_shard.data, l.shard_bytes, stream, 0);
  const auto scale_slot = [&](int rank, int j) {
    return buf.data(rank) + l.scale_offset + j * kScaleSlotBytes;
  };
  Handshake h;
  h.value = epoch;
  if (scaled) h.before.push_back(WordCopy{scale_slot(r, r), a_shard.scale_inv});
  for (int i = 1; i < n; ++i) {
    const int peer = (r + i) % n;
    h.signals.push_back(buf.flag(peer, r, FlagSlot::kData));
    h.waits.push_back(FlagWait{buf.flag(r, peer, FlagSlot::kData), epoch,
                               WaitContext{kOp, r, peer, i, epoch, buf.timeout_s()}});
    if (scaled) h.after.push_back(WordCopy{scale_slot(r, peer), scale_slot(peer, peer)});
  }
  t.handshake(h, stream, 0);
  if (fused != nullptr && !t.capturing(stream)) {
    ag_gemm_fused(buf, a_shard, l, pc, weights.front().options, *fused, epoch, stream);
    return;
  }
  const int pull_lane = lanes_c;
  t.fork(stream, lanes_c + 1);
  int q = 0;  // GEMM q on lane q % C
  const auto gemms = [&](int j, int p) {
    for (const AgGemmWeight& x : weights) {
      const int lane = q++ % lanes_c;
      if (j != r) t.lane_wait(stream, lane, pull_lane);
      t.gemm(piece_operand(buf, a_shard, l, j, pc, p), x.b,
             piece_output(buf, x.d, a_shard.rows, j, pc, p), x.options, stream, lane);
    }
  };
  gemms(r, 0);
  for (int s = 1; s < n; ++s) {
    const int j = (r + s) % n;
    for (int p = 0; p < pc.count(); ++p) {
      pull_piece(buf, a_shard, l, pc, j, p, stream, pull_lane);
      gemms(j, p);
    }
  }
  t.join(stream);
}

}  // namespace

// NOTE [ag_gemm schedule]: one chunk per rank, pushed by copy engines and multiplied as it
// lands. Rank r, C compute lanes, S = put_split, c0 = the caller's stream:
// clang-format off
//   c0      | begin_op | fork | GEMM chunk r (own shard) | wait kData(r-C), GEMM r-C | ... | join
//   c1      |          |      | wait kData(r-1), GEMM chunk r-1 | wait kData(r-1-C), GEMM ... |
//   put 1   |          |      | wait kAck(r+1), put shard + scale_inv -> slot r of rank r+1, signal kData |
//   ...     |          |      | ... (S lanes per peer, joined before the peer's signal)                   |
//   put n-1 |          |      | wait kAck(r-1), put shard + scale_inv -> slot r of rank r-1, signal kData |
//   own     |          |      | our own shard -> our slot r                                  |
// clang-format on
// With staggered_puts one set of put lanes carries the peers' puts in ring order: each rank
// sends to one peer and receives from one at a time, r-1's shard first (NOTE [serial puts]).
// Each put lane waits for its peer's acknowledgement, so the local GEMM starts at once. GEMM q
// of the (chunk, piece, weight) sequence runs on lane q % C: a late peer delays its chunk alone.
//
// NOTE [no ring forwarding]: every shard goes to its destination in one hop (staggered: a ring's
// steps without a flag wait per hop). TransformerEngine's forwarding ring measured the same.
// Verdict: direct pushes. Measured: docs/performance-log.md [no ring forwarding].
//
// NOTE [ag_gemm vs torch]: torch's async-TP was faster on the qkv FP8 rows at TP 4 only until
// regions were rounded to 2 MiB (NOTE [allocation granularity]); since then the staggered pushes
// match or beat it. Measured: docs/performance-log.md [ag_gemm vs torch].
void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard, const gemm::GemmOperand& b,
             const gemm::GemmOutput& d, const gemm::GemmOptions& options,
             const AgGemmConfig& config, cudaStream_t stream) {
  ag_gemm(buf, a_shard, std::vector<AgGemmWeight>{AgGemmWeight{b, d, options}}, config, stream);
}

void ag_gemm(SymmetricBuffer& buf, const gemm::GemmOperand& a_shard,
             const std::vector<AgGemmWeight>& weights, const AgGemmConfig& config,
             cudaStream_t stream) {
  const int r = buf.rank();
  const int n = buf.size();
  Transport& t = buf.transport();
  // ---- validation: nothing below begin_op may throw for a bad argument -----------------------
  OVERLAP_CHECK_ARG(!weights.empty(), kOp << ": no weight given");
  detail::check_op(buf, config.compute_lanes, a_shard, weights[0].b, kOp);
  detail::check_pieces(config.pieces, kOp);
  OVERLAP_CHECK_ARG(!a_shard.transposed && a_shard.rows >= 1 && a_shard.ld == a_shard.cols,
                    kOp << ": the input shard must be a contiguous [m, k] matrix with m >= 1 (got "
                        << a_shard.rows << " x " << a_shard.cols << ", ld " << a_shard.ld
                        << (a_shard.transposed ? ", transposed" : "") << ")");
  const std::int64_t m = a_shard.rows;
  const bool scaled = a_shard.scaling == gemm::ScalingMode::kTensor;
  const AgGemmLayout l = ag_gemm_layout(
      n, static_cast<std::size_t>(m * a_shard.cols) * dtype_size(a_shard.dtype), scaled);
  detail::check_fits(buf, l.bytes, kOp);
  const Pieces pc(m, config.pieces);
  const gemm::GemmTarget target = gemm::gemm_target(t.device());
  for (std::size_t w = 0; w < weights.size(); ++w) {
    check_weight(buf, a_shard, l, pc, weights[w], weights.size() > 1 ? static_cast<int>(w) : -1,
                 target);
  }
  FusedGroups fused;
  if (config.fused_gemm) {  // NOTE [fused ag_gemm]
    OVERLAP_CHECK_ARG(config.pull_shards,
                      kOp << ": fused_gemm runs on the pulls; set pull_shards=True as well");
    for (std::size_t w = 1; w < weights.size(); ++w) {
      const gemm::GemmOptions& a = weights[0].options;
      const gemm::GemmOptions& b = weights[w].options;
      OVERLAP_CHECK(a.alpha == b.alpha && a.sm_count == b.sm_count, kUnsupported,
                    kOp << ": with fused_gemm every weight takes one alpha and sm_count (weight "
                        << w << " differs from weight 0)");
    }
    fused = fused_groups(buf, a_shard, weights, l, pc);
    gemm::validate_waiting_gemm(fused.groups, weights[0].options, target);
  }
  const int lanes_c = config.compute_lanes;
  const int split = buf.put_split();
  std::uint64_t arg = 0;
  for (std::uint64_t v :
       {std::uint64_t(m), std::uint64_t(a_shard.cols), std::uint64_t(a_shard.dtype),
        std::uint64_t(scaled), std::uint64_t(pc.count()), std::uint64_t(config.pull_shards)}) {
    arg = mix_arg(arg, v);
  }
  if (config.pull_shards) {
    ag_gemm_pulled(buf, a_shard, weights, l, pc, config, arg, config.fused_gemm ? &fused : nullptr,
                   stream);
    return;
  }

  // ---- the op --------------------------------------------------------------------------------
  const std::uint64_t epoch =
      begin_op(buf, OpCode::kAllGatherGemm, arg, kOp, stream, OpAccess{/*pushes_only=*/true});
  detail::take_piece_epochs(buf, stream);  // NOTE [ag_gemm pieces]
  // The put lanes announce each piece and copy the scale_inv themselves: no alternative was
  // faster (docs/performance-log.md [ag_gemm put lanes]).
  const bool serial = config.staggered_puts;
  const int put_lanes = serial ? split : std::max(1, (n - 1) * split);
  const int own_lane = lanes_c + put_lanes;
  t.fork(stream, own_lane + (config.keep_gathered ? 1 : 0));
  // NOTE [ag_gemm own slot]: our own slot's copy (nothing in this op reads it) runs beside the
  // pushes and shares their copy engines: up to 8% of the op. Verdict: only with keep_gathered.
  // Measured: docs/performance-log.md [ag_gemm own slot].
  if (config.keep_gathered) {
    char* const own = buf.data(r);
    t.put(own + r * l.shard_bytes, a_shard.data, l.shard_bytes, stream, own_lane);
    if (scaled) {
      t.put(own + l.scale_offset + r * kScaleSlotBytes, a_shard.scale_inv, sizeof(float), stream,
            own_lane);
    }
  }
  // Pushes first: on host every rank publishes its shard before it waits for any peer's.
  const std::size_t row_bytes = l.shard_bytes / static_cast<std::size_t>(m);
  for (int i = 1; i < n; ++i) {
    const int peer = (r + i) % n;
    const int first = lanes_c + (serial ? 0 : (i - 1) * split);
    wait_ack(buf, epoch, peer, kOp, stream, first);
    if (scaled) {  // with the first piece
      t.put(buf.data(peer) + l.scale_offset + r * kScaleSlotBytes, a_shard.scale_inv, sizeof(float),
            stream, first);
    }
    for (int p = 0; p < pc.count(); ++p) {
      const std::size_t offset = static_cast<std::size_t>(pc.lo(p)) * row_bytes;
      const std::size_t piece = static_cast<std::size_t>(pc.rows(p)) * row_bytes;
      for (int s = 1; s < split; ++s) t.lane_wait(stream, first + s, first);
      const std::size_t slice = (piece + split - 1) / split;
      for (int s = 0; s < split; ++s) {
        const std::size_t begin = offset + std::min(piece, s * slice);
        const std::size_t bytes = std::min(offset + piece - begin, slice);
        t.put(buf.data(peer) + r * l.shard_bytes + begin,
              static_cast<const char*>(a_shard.data) + begin, bytes, stream, first + s);
      }
      for (int s = 1; s < split; ++s) t.lane_wait(stream, first, first + s);
      t.signal(buf.flag(peer, r, FlagSlot::kData), epoch + static_cast<std::uint64_t>(p), stream,
               first);
    }
  }
  // Chunk GEMMs: our own first, then peers r-1, r-2, ..., each in its pieces.
  const int num_weights = static_cast<int>(weights.size());
  std::vector<std::pair<int, int>> landed(lanes_c, {r, 0});  // per lane: last (chunk, piece)
  int q = 0;
  for (int s = 0; s < n; ++s) {
    const int j = (r + n - s) % n;
    for (int p = 0; p < (j == r ? 1 : pc.count()); ++p) {
      for (int w = 0; w < num_weights; ++w, ++q) {
        const int lane = q % lanes_c;
        if (j != r && landed[lane] != std::make_pair(j, p)) {
          const std::uint64_t value = epoch + static_cast<std::uint64_t>(p);
          WaitContext ctx{kOp, r, j, s, value, buf.timeout_s()};
          t.wait(buf.flag(r, j, FlagSlot::kData), value, ctx, stream, lane);
          landed[lane] = {j, p};
        }
        const AgGemmWeight& x = weights[w];
        t.gemm(piece_operand(buf, a_shard, l, j, pc, p), x.b, piece_output(buf, x.d, m, j, pc, p),
               x.options, stream, lane);
      }
    }
  }
  t.join(stream);
}

}  // namespace overlap::comm

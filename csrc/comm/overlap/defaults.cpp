// The tuning defaults of the overlap ops by group size (NOTE [overlap defaults] in
// overlap_ops.h): the one place where a default that depends on the TP size is chosen.
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

// NOTE [ub tp 2]: at TP 2 a GEMM -> RS that nobody chose runs the ring with pulls instead of the
// pipelined method, and an ag_gemm takes one compute lane instead of two.
//  - The ring with pulls (NOTE [gemm_rs_ring pulls]) was faster than the pipelined default (one
//    lane, one copy per peer) on nearly every GEMM+RS row of the TP 2 suite. At TP 4 it was
//    faster on some rows and slower on others, a tie over several runs, so other sizes keep the
//    pipelined method. A ring that is asked for keeps its own defaults (pushes): only the choice
//    made here pulls.
//  - One compute lane: each rank's chunk GEMMs are twice as tall at TP 2 as at TP 4, and two of
//    them side by side contend rather than fill each other's tails; one lane was faster on most
//    rows of the TP 2 suite. At TP 4 two lanes were the best single setting.
// The op classes of overlap.ops keep the defaults of any size (a caller who builds an op picks
// its own tuning); initialize_ub() takes these for its group. Measured: docs/performance-log.md
// [ub tp 2].
AgGemmConfig ag_gemm_defaults(int size) {
  AgGemmConfig c;
  if (size == 2) c.compute_lanes = 1;
  return c;
}

GemmRsDefault gemm_rs_default(int size) {
  GemmRsDefault c;
  if (size == 2) {
    c.method = RsMethod::kRing;
    c.pull_shards = true;
  }
  return c;
}

GemmRsConfig gemm_rs_defaults(int /*size*/) {
  return GemmRsConfig{};
}

GemmRsRingConfig gemm_rs_ring_defaults(int /*size*/) {
  return GemmRsRingConfig{};
}

// NOTE [bulk_rs defaults]: 8 SMs, with 4 pieces at TP 2 and 2 pieces at other sizes. Over repeated
// runs of the bulk_rs rows of the suite these beat the former 16 SMs and one piece in total, on
// 2xH200 and on 4xH200 (at TP 4 the comm-bound qkv rows vary from run to run, and 4 pieces are
// slower on the qkv FP8 row). The op class takes its group's (unlike the others: its defaults
// were chosen per size from the start). Measured: docs/performance-log.md [bulk_rs defaults].
BulkRsConfig bulk_rs_defaults(int size) {
  BulkRsConfig c;
  if (size == 2) c.pieces = 4;
  return c;
}

}  // namespace overlap::comm

// The tuning defaults that depend on the group size (NOTE [overlap defaults] in overlap_ops.h).
#include "comm/overlap/overlap_ops.h"

namespace overlap::comm {

// NOTE [ub tp 2]: at TP 2 a GEMM -> RS that nobody chose runs the ring with pulls (NOTE
// [gemm_rs_ring pulls]), faster there on nearly every row; at TP 4 a tie, so other sizes keep
// the pipelined method. An ag_gemm takes one compute lane at TP 2: its chunk GEMMs are twice as
// tall and two side by side contend. Verdict: initialize_ub() takes these for its group; the op
// classes keep the size-free defaults. Measured: docs/performance-log.md [ub tp 2].
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

// NOTE [bulk_rs defaults]: 8 SMs, with 4 pieces at TP 2 and 2 elsewhere: these beat 16 SMs and
// one piece over repeated runs on 2xH200 and 4xH200. The op class takes its group's. Measured:
// docs/performance-log.md [bulk_rs defaults].
BulkRsConfig bulk_rs_defaults(int size) {
  BulkRsConfig c;
  if (size == 2) c.pieces = 4;
  return c;
}

}  // namespace overlap::comm

// One instantiation of the waiting GEMM (NOTE [waiting gemm tiles] in waiting_gemm.cu).
#include "gemm/cuda/waiting_gemm_tiles.h"

#ifdef OVERLAP_WITH_CUTLASS
#include "gemm/cuda/waiting_gemm_kernel.cuh"

namespace overlap::gemm {

void launch_waiting_co128x256(const WaitingLaunch& l) {
  waiting::launch<waiting::Cooperative<128, 256, waiting::Cluster1>>(l);
}

}  // namespace overlap::gemm
#endif  // OVERLAP_WITH_CUTLASS

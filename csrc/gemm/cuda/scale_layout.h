// Conversion of block scales from overlap's layout (NOTE [gemm scaling] in gemm/gemm.h) to
// cuBLASLt's (NOTE [cublaslt block scale layout] in gemm/cuda/cublaslt_gemm.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace overlap::gemm {

// 1x128: src [rows, kblocks] row-major -> dst [kblocks, rows] (rows contiguous).
void transpose_block_scales(const float* src, std::int64_t rows, std::int64_t kblocks, float* dst,
                            cudaStream_t stream);

// 128x128: src [rblocks, kblocks] row-major -> dst [rblocks, ld] with ld >= kblocks, the
// padding columns zeroed.
void pad_block_scales(const float* src, std::int64_t rblocks, std::int64_t kblocks, std::int64_t ld,
                      float* dst, cudaStream_t stream);

}  // namespace overlap::gemm

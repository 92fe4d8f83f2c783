// The stream type every launcher takes. Non-CUDA builds see an opaque declaration so that
// headers stay identical in both builds.
#pragma once

#ifdef OVERLAP_WITH_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
typedef CUstream_st* cudaStream_t;  // NOLINT: must match the CUDA runtime's typedef
#endif

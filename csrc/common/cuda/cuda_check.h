// Check macros for CUDA runtime, driver and cuBLAS(Lt) calls. CUDA builds only.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/errors.h"

namespace overlap::detail {
// "cudaErrorInvalidValue (1): invalid argument"
std::string cuda_error_string(cudaError_t err);
std::string cu_result_string(CUresult res);
std::string cublas_status_string(cublasStatus_t status);
}  // namespace overlap::detail

#define OVERLAP_CHECK_CUDA(expr)                                                                 \
  do {                                                                                           \
    const cudaError_t overlap_err_ = (expr);                                                     \
    if (overlap_err_ != cudaSuccess) {                                                           \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kCuda, __FILE__, __LINE__, __func__,  \
                                     #expr, ::overlap::detail::cuda_error_string(overlap_err_)); \
    }                                                                                            \
  } while (0)

// Checks the launch status of the last kernel (cudaGetLastError), naming the kernel.
#define OVERLAP_CHECK_LAUNCH(kernel_name)                                                       \
  do {                                                                                          \
    const cudaError_t overlap_err_ = cudaGetLastError();                                        \
    if (overlap_err_ != cudaSuccess) {                                                          \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kCuda, __FILE__, __LINE__, __func__, \
                                     "launch of " kernel_name,                                  \
                                     ::overlap::detail::cuda_error_string(overlap_err_));       \
    }                                                                                           \
  } while (0)

#define OVERLAP_CHECK_CU(expr)                                                                  \
  do {                                                                                          \
    const CUresult overlap_res_ = (expr);                                                       \
    if (overlap_res_ != CUDA_SUCCESS) {                                                         \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kCuda, __FILE__, __LINE__, __func__, \
                                     #expr, ::overlap::detail::cu_result_string(overlap_res_)); \
    }                                                                                           \
  } while (0)

#define OVERLAP_CHECK_CUBLAS(expr)                                                                 \
  do {                                                                                             \
    const cublasStatus_t overlap_st_ = (expr);                                                     \
    if (overlap_st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      ::overlap::detail::throw_error(::overlap::ErrorKind::kCuda, __FILE__, __LINE__, __func__,    \
                                     #expr, ::overlap::detail::cublas_status_string(overlap_st_)); \
    }                                                                                              \
  } while (0)

// Cleanup-path variant: logs the failure and carries on (destructors never throw).
#define OVERLAP_WARN_CUDA(expr)                                                                    \
  do {                                                                                             \
    const cudaError_t overlap_err_ = (expr);                                                       \
    if (overlap_err_ != cudaSuccess) {                                                             \
      OVERLAP_WARN(                                                                                \
          #expr " failed during cleanup: " << ::overlap::detail::cuda_error_string(overlap_err_)); \
    }                                                                                              \
  } while (0)

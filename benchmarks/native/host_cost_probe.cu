// What each CUDA call that an overlap op issues costs the host, piece by piece: one cuBLASLt
// GEMM (the matmul, its descriptor and layouts, the heuristic, the workspace from a
// stream-ordered pool on one or several streams) and the transport's calls (a device-to-device
// copy, a kernel launch, an event edge, stream memory operations). It also checks on the GPU
// whether a pooled workspace on one stream waits for another stream's pending GEMM.
// Standalone on purpose (no overlap code): the figures are the driver's and cuBLASLt's, the
// floor under any op built on them. docs/performance-log.md [gemm workspace] holds a run.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 benchmarks/native/host_cost_probe.cu \
//       -o /tmp/host_cost_probe -lcublasLt -lcudart -lcuda && /tmp/host_cost_probe
//
// Each figure is the median of 5 runs of N back-to-back calls (us per call); bf16 16 x 64 x 32.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#define CHECK(x)                                                   \
  do {                                                             \
    const int status_ = static_cast<int>(x);                       \
    if (status_ != 0) {                                            \
      std::fprintf(stderr, "%s failed: status %d\n", #x, status_); \
      return 1;                                                    \
    }                                                              \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double per_call_us(F&& f, int n = 4000) {
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) f(i);
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
    cudaDeviceSynchronize();  // never let the queue grow between runs
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

__global__ void empty_kernel() {}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

void row(const char* what, double us) {
  std::printf("%-60s %8.2f\n", what, us);
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  cudaStream_t s[4];
  for (cudaStream_t& x : s) CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  constexpr int kM = 16, kK = 64, kN = 32;
  void *a, *b, *d;
  CHECK(cudaMalloc(&a, 1 << 20));
  CHECK(cudaMalloc(&b, 1 << 20));
  CHECK(cudaMalloc(&d, 1 << 20));

  // Two private pools that keep what they reserve; the second without internal dependencies.
  cudaMemPool_t pool[2];
  for (cudaMemPool_t& p : pool) {
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CHECK(cudaMemPoolCreate(&p, &props));
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    CHECK(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  int no = 0;
  CHECK(cudaMemPoolSetAttribute(pool[1], cudaMemPoolReuseAllowInternalDependencies, &no));

  // A row-major D = A B^T as overlap maps it (NOTE [row-major mapping]): cuBLAS TN.
  const auto make_desc = [](cublasLtMatmulDesc_t* desc) {
    cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n));
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
  };
  const auto make_layouts = [](cublasLtMatrixLayout_t* l) {
    cublasLtMatrixLayoutCreate(&l[0], CUDA_R_16BF, kK, kN, kK);
    cublasLtMatrixLayoutCreate(&l[1], CUDA_R_16BF, kK, kM, kK);
    cublasLtMatrixLayoutCreate(&l[2], CUDA_R_16BF, kN, kM, kN);
    cublasLtMatrixLayoutCreate(&l[3], CUDA_R_16BF, kN, kM, kN);
  };
  cublasLtMatmulDesc_t desc;
  make_desc(&desc);
  cublasLtMatrixLayout_t l[4];
  make_layouts(l);
  cublasLtMatmulPreference_t pref;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = 32u << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, l[0], l[1], l[2], l[3], pref, 1, &heuristic,
                                       &found));
  void* fixed_ws[4];
  for (void*& w : fixed_ws) CHECK(cudaMalloc(&w, ws));
  const float alpha = 1, beta = 0;
  const auto matmul = [&](cudaStream_t st, void* w) {
    return cublasLtMatmul(lt, desc, &alpha, b, l[0], a, l[1], &beta, d, l[2], d, l[3],
                          &heuristic.algo, w, ws, st);
  };
  const auto pooled = [&](cudaMemPool_t p, cudaStream_t st) {
    void* w = nullptr;
    cudaMallocFromPoolAsync(&w, ws, p, st);
    matmul(st, w);
    cudaFreeAsync(w, st);
  };
  CHECK(matmul(s[0], fixed_ws[0]));
  CHECK(cudaDeviceSynchronize());
  std::printf("algorithm's workspace: %zu bytes\n", heuristic.workspaceSize);
  std::printf("%-60s %8s\n", "host cost per call", "us");

  row("cublasLtMatmul, one stream, fixed workspace",
      per_call_us([&](int) { matmul(s[0], fixed_ws[0]); }));
  row("the same, 2 streams alternating, a workspace each",
      per_call_us([&](int i) { matmul(s[i & 1], fixed_ws[i & 1]); }));
  row("the same, 4 streams alternating, a workspace each",
      per_call_us([&](int i) { matmul(s[i & 3], fixed_ws[i & 3]); }));
  row("pool workspace + cublasLtMatmul, one stream",
      per_call_us([&](int) { pooled(pool[0], s[0]); }));
  row("the same, 2 streams alternating", per_call_us([&](int i) { pooled(pool[0], s[i & 1]); }));
  row("the same, 4 streams alternating", per_call_us([&](int i) { pooled(pool[0], s[i & 3]); }));
  row("the same, no internal dependencies, 2 streams",
      per_call_us([&](int i) { pooled(pool[1], s[i & 1]); }));
  row("descriptor: create, 3 attributes, destroy", per_call_us([&](int) {
        cublasLtMatmulDesc_t x;
        make_desc(&x);
        cublasLtMatmulDescDestroy(x);
      }));
  row("four matrix layouts: create, destroy", per_call_us([&](int) {
        cublasLtMatrixLayout_t x[4];
        make_layouts(x);
        for (cublasLtMatrixLayout_t y : x) cublasLtMatrixLayoutDestroy(y);
      }));
  row("heuristic query (1 result)", per_call_us(
                                        [&](int) {
                                          int f = 0;
                                          cublasLtMatmulAlgoGetHeuristic(lt, desc, l[0], l[1], l[2],
                                                                         l[3], pref, 1, &heuristic,
                                                                         &f);
                                        },
                                        1000));
  row("cudaStreamGetDevice + cudaStreamIsCapturing", per_call_us([&](int) {
        int device = 0;
        cudaStreamCaptureStatus status;
        cudaStreamGetDevice(s[0], &device);
        cudaStreamIsCapturing(s[0], &status);
      }));
  row("cudaMemcpyAsync device to device, 4 KiB",
      per_call_us([&](int) { cudaMemcpyAsync(d, a, 4096, cudaMemcpyDeviceToDevice, s[0]); }));
  row("an empty kernel's launch", per_call_us([&](int) { empty_kernel<<<1, 32, 0, s[0]>>>(); }));
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  row("cudaEventRecord + cudaStreamWaitEvent", per_call_us([&](int i) {
        cudaEventRecord(ev, s[i & 1]);
        cudaStreamWaitEvent(s[(i + 1) & 1], ev, 0);
      }));
  CUdeviceptr flag;
  CHECK(cuMemAlloc(&flag, 64));
  CHECK(cuMemsetD8(flag, 0, 64));
  row("cuStreamWriteValue64", per_call_us([&](int i) {
        cuStreamWriteValue64(reinterpret_cast<CUstream>(s[0]), flag, static_cast<cuuint64_t>(i), 0);
      }));
  row("cuStreamWaitValue64 (already satisfied)", per_call_us([&](int) {
        cuStreamWaitValue64(reinterpret_cast<CUstream>(s[0]), flag, 0, CU_STREAM_WAIT_VALUE_GEQ);
      }));

  // On the GPU: does a pooled workspace on stream B wait for stream A's pending GEMM?
  int rate_khz = 0;
  CHECK(cudaDeviceGetAttribute(&rate_khz, cudaDevAttrClockRate, 0));
  const long long cycles = static_cast<long long>(rate_khz) * 20;  // about 20 ms
  for (int p = 0; p < 2; ++p) {
    CHECK(cudaDeviceSynchronize());
    void* w = nullptr;
    cudaMallocFromPoolAsync(&w, ws, pool[p], s[0]);
    spin_kernel<<<1, 1, 0, s[0]>>>(cycles);
    matmul(s[0], w);
    cudaFreeAsync(w, s[0]);
    const auto t0 = Clock::now();
    void* w2 = nullptr;
    cudaMallocFromPoolAsync(&w2, ws, pool[p], s[1]);
    matmul(s[1], w2);
    cudaFreeAsync(w2, s[1]);
    CHECK(cudaStreamSynchronize(s[1]));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf(
        "a pooled GEMM on stream B behind stream A's 20 ms spin (%s): done after %.2f ms, "
        "%s\n",
        p == 0 ? "default pool" : "no internal dependencies", ms,
        w == w2 ? "the same block" : "another block");
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}

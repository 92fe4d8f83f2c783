// Fused AG+GEMM probe (design §6.4.1; docs/performance-log.md [fused ag_gemm probe], where its
// results are): the experiment that preceded the library's waiting GEMM
// (csrc/gemm/cuda/waiting_gemm.cu). One GPU stands in for a TP group: the "gathered" A holds
// `ranks` shards in rank order; a second stream lands them one after another (copy engine; pulled
// from GPUs 1.. over NVLink where the machine has them, as the pull-based all-gather does) and
// publishes one flag per shard with a stream memory operation. ONE grouped Hopper GEMM (CUTLASS's
// pointer-array kernel, one group per shard, groups in arrival order: our own shard first)
// multiplies each shard as soon as its flag is set: the mainloop's producer waits on the group's
// flag before its first TMA load of A (WaitingMainloop below). Printed: the result against a
// reference GEMM (every shard landed first), and the time of the fused kernel against "wait for
// every shard, then the same grouped GEMM".
//
// Build (CUTLASS/CuTe headers from the registry's nvidia-cutlass wheel, 4.2.0.0:
// `cutlass_library/source/include` and `cutlass_library/source/tools/util/include`):
//   nvcc -std=c++17 -O2 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -I$CUTLASS/include \
//     -I$CUTLASS/tools/util/include benchmarks/native/fused_ag_probe.cu -lcuda -o fused_ag_probe
// (-DNDEBUG matters: CUTLASS's device asserts otherwise split the kernel at a call and ptxas
// serializes its wgmma instructions, warning C7510. Linking needs libcuda, which only the GPU
// machines have; tests/unit/test_build.py compiles it without linking.)
// Run: ./fused_ag_probe [m_per_shard=256] [N=1536] [K=4096] [ranks=4] [peers=1] [iters=30]
// (-DPROBE_PINGPONG builds the 64-row-tile variant.)
//
// Why the flags are written by stream memory operations and the shards by copy engines: the
// GEMM is persistent (one CTA per SM, waiting in its producer warps), so nothing that needs an
// SM may stand between a shard and its flag, or the two would wait on each other.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/util/device_memory.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <algorithm>
#include <cmath>

using namespace cute;

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CHECK_CU(x)                                                                     \
  do {                                                                                  \
    CUresult r_ = (x);                                                                  \
    if (r_ != CUDA_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, int(r_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)
#define CHECK_CUTLASS(x)                                                                          \
  do {                                                                                            \
    cutlass::Status s_ = (x);                                                                     \
    if (s_ != cutlass::Status::kSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cutlassGetStatusString(s_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// What the producer warp waits on: group g's flag reaches `epoch`. A wait that outlives
// `timeout_ns` (globaltimer) or finds `*abort` set records `fault` and returns, so the kernel
// never hangs (the op would then raise, as the handshake kernel's waits do).
struct ShardWait {
  std::uint64_t const* flags = nullptr;  // one per group, in group order
  std::uint64_t epoch = 0;
  std::uint64_t timeout_ns = 0;
  int const* abort = nullptr;
  int* fault = nullptr;  // 1: timed out, 2: aborted
};

__device__ __forceinline__ std::uint64_t load_acquire_sys(std::uint64_t const* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The builder's Hopper array mainloop, with one wait before each tile's loads (NOTE in the
// header comment). Everything else, pipelines and TMA included, is CUTLASS's.
template <class Base>
struct WaitingMainloop : Base {
  struct Arguments : Base::Arguments {
    ShardWait wait;
  };
  struct Params : Base::Params {
    ShardWait wait;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(
        shapes, static_cast<typename Base::Arguments const&>(args), workspace);
    p.wait = args.wait;
    return p;
  }

  int group_ = 0;  // the group whose tensors the producer loads (tensors_perform_update)

  template <class InputTensors, class ProblemShapeMNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& tensors,
                                                     Params const& params, ProblemShapeMNKL shape,
                                                     int32_t next_batch) {
    group_ = next_batch;
    return Base::tensors_perform_update(tensors, params, shape, next_batch);
  }

  template <class... Rest>
  CUTLASS_DEVICE void load(Params const& params, Rest&&... rest) {
    ShardWait const& w = params.wait;
    std::uint64_t const* flag = w.flags + group_;
    if (load_acquire_sys(flag) < w.epoch) {  // every lane polls: one coalesced load a spin
      std::uint64_t const start = global_ns();
      while (load_acquire_sys(flag) < w.epoch) {
        if (*reinterpret_cast<int const volatile*>(w.abort) != 0) {
          atomicExch(w.fault, 2);
          break;
        }
        if (global_ns() - start > w.timeout_ns) {
          atomicExch(w.fault, 1);
          break;
        }
        __nanosleep(64);
      }
    }
    // The shard was written by a copy engine and is read by TMA (the async proxy): order the
    // acquire above before those reads.
    asm volatile("fence.proxy.async.global;" ::: "memory");
    Base::load(params, static_cast<Rest&&>(rest)...);
  }
};

using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // the gathered input [M, K]
using LayoutB = cutlass::layout::ColumnMajor;  // the weight [N, K] row-major = [K, N] col-major
using LayoutD = cutlass::layout::RowMajor;     // the output [M, N]
constexpr int kAlign = 8;
// -DPROBE_PINGPONG: 64-row tiles (the ping-pong kernel), so a small shard spreads over more SMs;
// default: 128 x 128 tiles (the cooperative kernel).
#ifdef PROBE_PINGPONG
using TileShape = Shape<_64, _128, _64>;
using MainloopSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
constexpr char const* kKernel = "pingpong 64x128x64";
#else
using TileShape = Shape<_128, _128, _64>;
using MainloopSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
constexpr char const* kKernel = "cooperative 128x128x64";
#endif
using ClusterShape = Shape<_1, _1, _1>;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign, Element,
    LayoutD*, kAlign, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<Element, float, void>>::CollectiveOp;
using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
    LayoutB*, kAlign, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;

template <class Mainloop>
using GemmOf = cutlass::gemm::device::GemmUniversalAdapter<
    cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>>;
using FusedGemm = GemmOf<WaitingMainloop<BuiltMainloop>>;
using PlainGemm = GemmOf<BuiltMainloop>;

__global__ void fill(Element* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = Element((float(h & 0xffff) / 65535.0f - 0.5f) * 2.0f);
  }
}

// Reference: D[i, j] = sum_k A[i, k] W[j, k], FP32 accumulation, one thread per element.
__global__ void reference(Element const* a, Element const* w, float* d, int m, int n, int k) {
  const int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float acc = 0.f;
  for (int kk = 0; kk < k; ++kk)
    acc += float(a[std::size_t(i) * k + kk]) * float(w[std::size_t(j) * k + kk]);
  d[std::size_t(i) * n + j] = acc;
}

struct Groups {  // device arrays of the grouped GEMM's arguments, one entry per shard
  cutlass::DeviceAllocation<typename ProblemShape::UnderlyingProblemShape> shapes;
  cutlass::DeviceAllocation<Element const*> a, b;
  cutlass::DeviceAllocation<Element*> d;
  cutlass::DeviceAllocation<typename FusedGemm::GemmKernel::InternalStrideA> sa;
  cutlass::DeviceAllocation<typename FusedGemm::GemmKernel::InternalStrideB> sb;
  cutlass::DeviceAllocation<typename FusedGemm::GemmKernel::InternalStrideD> sd;
  std::vector<typename ProblemShape::UnderlyingProblemShape> host_shapes;
};

template <class Gemm, class MainloopArgs>
typename Gemm::Arguments arguments(Groups& g, MainloopArgs mainloop, int groups) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.f;
  fusion.beta = 0.f;
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {groups, g.shapes.get(), g.host_shapes.data()},
                                  mainloop,
                                  {fusion, nullptr, g.sd.get(), g.d.get(), g.sd.get()},
                                  hw};
  return args;
}

// What one run prints, for one shape (all times the median of `iters` calls, ms):
//   comm        the peers' shards landing one after another, nothing else
//   gemm        the plain grouped GEMM over a gathered input already in place
//   fused       the waiting GEMM launched first, the shards landing beside it
//   sequential  every shard landed, then the plain grouped GEMM
//   fused_ready the waiting GEMM with every flag already set (its cost over `gemm`)
// and fused / max(comm, gemm), the figure the overlap ops are judged by.
int main(int argc, char** argv) {
  const int m = argc > 1 ? std::atoi(argv[1]) : 256;
  const int n = argc > 2 ? std::atoi(argv[2]) : 1536;
  const int k = argc > 3 ? std::atoi(argv[3]) : 4096;
  const int ranks = argc > 4 ? std::atoi(argv[4]) : 4;
  const int want_peers = argc > 5 ? std::atoi(argv[5]) : 1;
  const int iters = argc > 6 ? std::atoi(argv[6]) : 30;
  const int me = 0;  // "our" rank: its shard is in place before the op
  const std::size_t shard = std::size_t(m) * k, rows = std::size_t(m) * ranks;
  const std::size_t shard_bytes = shard * sizeof(Element);
  CHECK_CU(cuInit(0));
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  // With peers, shard s (s != 0) lives on GPU s and is pulled over NVLink by GPU 0's copy
  // engine, as the pull-based all-gather does; otherwise it is copied within GPU 0.
  const bool peers = want_peers && devices >= ranks;
  std::vector<Element*> src(ranks, nullptr);
  for (int s = 0; s < ranks; ++s) {
    const int dev = peers ? s : 0;
    CHECK_CUDA(cudaSetDevice(dev));
    CHECK_CUDA(cudaMalloc(&src[s], shard_bytes));
    fill<<<1024, 256>>>(src[s], shard, 1u + unsigned(s));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  CHECK_CUDA(cudaSetDevice(0));
  if (peers)
    for (int s = 1; s < ranks; ++s) {
      cudaError_t e = cudaDeviceEnablePeerAccess(s, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK_CUDA(e);
      (void)cudaGetLastError();
    }

  Element *a, *w, *d;
  float* d_ref;
  std::uint64_t* flags;
  int *abort_word, *fault;
  CHECK_CUDA(cudaMalloc(&a, rows * k * sizeof(Element)));  // the gathered input
  CHECK_CUDA(cudaMalloc(&w, std::size_t(n) * k * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&d, rows * n * sizeof(Element)));
  CHECK_CUDA(cudaMalloc(&d_ref, rows * n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&flags, ranks * sizeof(std::uint64_t)));
  CHECK_CUDA(cudaMalloc(&abort_word, sizeof(int)));
  CHECK_CUDA(cudaMalloc(&fault, sizeof(int)));
  CHECK_CUDA(cudaMemset(flags, 0, ranks * sizeof(std::uint64_t)));
  CHECK_CUDA(cudaMemset(abort_word, 0, sizeof(int)));
  CHECK_CUDA(cudaMemset(fault, 0, sizeof(int)));
  fill<<<1024, 256>>>(w, std::size_t(n) * k, 99u);
  for (int s = 0; s < ranks; ++s)
    CHECK_CUDA(cudaMemcpyPeer(a + s * shard, 0, src[s], peers ? s : 0, shard_bytes));
  reference<<<dim3((n + 127) / 128, unsigned(rows)), 128>>>(a, w, d_ref, int(rows), n, k);
  CHECK_CUDA(cudaDeviceSynchronize());

  // Group g = shard (me + g) % ranks: our own first, then in arrival order.
  Groups g;
  std::vector<Element const*> pa(ranks), pb(ranks, w);
  std::vector<Element*> pd(ranks);
  for (int gi = 0; gi < ranks; ++gi) {
    const int s = (me + gi) % ranks;
    pa[gi] = a + s * shard;
    pd[gi] = d + std::size_t(s) * m * n;
    g.host_shapes.push_back({m, n, k});
  }
  g.shapes.reset(ranks);
  g.shapes.copy_from_host(g.host_shapes.data());
  g.a.reset(ranks);
  g.a.copy_from_host(pa.data());
  g.b.reset(ranks);
  g.b.copy_from_host(pb.data());
  g.d.reset(ranks);
  g.d.copy_from_host(pd.data());
  using KernelF = typename FusedGemm::GemmKernel;
  std::vector<typename KernelF::InternalStrideA> sa(
      ranks, cutlass::make_cute_packed_stride(typename KernelF::InternalStrideA{}, {m, k, 1}));
  std::vector<typename KernelF::InternalStrideB> sb(
      ranks, cutlass::make_cute_packed_stride(typename KernelF::InternalStrideB{}, {n, k, 1}));
  std::vector<typename KernelF::InternalStrideD> sd(
      ranks, cutlass::make_cute_packed_stride(typename KernelF::InternalStrideD{}, {m, n, 1}));
  g.sa.reset(ranks);
  g.sa.copy_from_host(sa.data());
  g.sb.reset(ranks);
  g.sb.copy_from_host(sb.data());
  g.sd.reset(ranks);
  g.sd.copy_from_host(sd.data());

  // Flags are cleared before every op and set to 1 as shards land, so the kernel's arguments
  // never change and it is initialized once.
  typename WaitingMainloop<BuiltMainloop>::Arguments wait_args;
  static_cast<typename BuiltMainloop::Arguments&>(wait_args) = {g.a.get(), g.sa.get(), g.b.get(),
                                                                g.sb.get()};
  wait_args.wait = ShardWait{flags, 1, 2'000'000'000ull, abort_word, fault};
  FusedGemm fused;
  auto fused_args = arguments<FusedGemm>(g, wait_args, ranks);
  PlainGemm plain;
  auto plain_args = arguments<PlainGemm>(
      g, typename BuiltMainloop::Arguments{g.a.get(), g.sa.get(), g.b.get(), g.sb.get()}, ranks);
  cutlass::device_memory::allocation<std::uint8_t> ws_f(FusedGemm::get_workspace_size(fused_args));
  cutlass::device_memory::allocation<std::uint8_t> ws_p(PlainGemm::get_workspace_size(plain_args));
  CHECK_CUTLASS(fused.can_implement(fused_args));
  CHECK_CUTLASS(plain.can_implement(plain_args));

  cudaStream_t compute, copies;
  CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
  CHECK_CUTLASS(fused.initialize(fused_args, ws_f.get(), compute));
  CHECK_CUTLASS(plain.initialize(plain_args, ws_p.get(), compute));
  cudaEvent_t t0, t1, landed;
  CHECK_CUDA(cudaEventCreate(&t0));
  CHECK_CUDA(cudaEventCreate(&t1));
  CHECK_CUDA(cudaEventCreate(&landed));
  auto set_flag = [&](cudaStream_t st, int gi) {
    CHECK_CU(cuStreamWriteValue64(st, reinterpret_cast<CUdeviceptr>(flags + gi), 1, 0));
  };

  enum class Path { comm, gemm, fused, sequential, fused_ready };
  // One op. Before it (untimed): our own shard in place and flagged, the peers' rows cleared
  // (so a GEMM that read a row before it landed shows in the check), their flags 0.
  auto one_op = [&](Path path) -> float {
    const bool land = path != Path::gemm && path != Path::fused_ready;
    CHECK_CUDA(cudaMemsetAsync(flags, 0, ranks * sizeof(std::uint64_t), copies));
    if (land)
      CHECK_CUDA(cudaMemsetAsync(a + shard, 0, (rows * k - shard) * sizeof(Element), copies));
    set_flag(copies, 0);
    if (path == Path::fused_ready)
      for (int gi = 1; gi < ranks; ++gi) set_flag(copies, gi);
    CHECK_CUDA(cudaStreamSynchronize(copies));
    CHECK_CUDA(cudaEventRecord(t0, compute));
    if (path == Path::fused || path == Path::fused_ready) CHECK_CUTLASS(fused.run(compute));
    if (land) {
      CHECK_CUDA(cudaStreamWaitEvent(copies, t0));
      for (int gi = 1; gi < ranks; ++gi) {
        const int s = (me + gi) % ranks;
        CHECK_CUDA(
            cudaMemcpyPeerAsync(a + s * shard, 0, src[s], peers ? s : 0, shard_bytes, copies));
        set_flag(copies, gi);
      }
      CHECK_CUDA(cudaEventRecord(landed, copies));
      CHECK_CUDA(cudaStreamWaitEvent(compute, landed));
    }
    if (path == Path::sequential || path == Path::gemm) CHECK_CUTLASS(plain.run(compute));
    CHECK_CUDA(cudaEventRecord(t1, compute));
    CHECK_CUDA(cudaEventSynchronize(t1));
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
    return ms;
  };

  int worst_bad = 0;
  for (Path p : {Path::fused, Path::sequential, Path::fused_ready}) {
    CHECK_CUDA(cudaMemset(d, 0, rows * n * sizeof(Element)));
    CHECK_CUDA(cudaMemset(fault, 0, sizeof(int)));
    one_op(p);
    std::vector<Element> got(rows * n);
    std::vector<float> want(rows * n);
    CHECK_CUDA(cudaMemcpy(got.data(), d, got.size() * sizeof(Element), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(want.data(), d_ref, want.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float tol = 0.02f * std::abs(want[i]) + 0.05f;
      bad += std::abs(float(got[i]) - want[i]) > tol;
    }
    int f = 0;
    CHECK_CUDA(cudaMemcpy(&f, fault, sizeof(int), cudaMemcpyDeviceToHost));
    if (bad || f)
      std::printf("CHECK FAILED (%s): %d of %zu outputs off the reference, fault %d\n",
                  p == Path::fused        ? "fused"
                  : p == Path::sequential ? "sequential"
                                          : "fused_ready",
                  bad, got.size(), f);
    worst_bad = std::max(worst_bad, bad + f);
  }
  constexpr int kPaths = 5;
  std::vector<float> t[kPaths];
  for (int it = 0; it < 3; ++it)
    for (int p = 0; p < kPaths; ++p) one_op(Path(p));  // warm-up
  for (int it = 0; it < iters; ++it)
    for (int p = 0; p < kPaths; ++p) t[p].push_back(one_op(Path(p)));
  float med[kPaths];
  for (int p = 0; p < kPaths; ++p) {
    std::sort(t[p].begin(), t[p].end());
    med[p] = t[p][t[p].size() / 2];
  }
  const float floor_ms = std::max(med[0], med[1]);
  std::printf(
      "%s | M %zu N %d K %d ranks %d %s | comm %.4f gemm %.4f fused %.4f sequential %.4f "
      "fused_ready %.4f ms | fused/floor %.3f seq/floor %.3f | check %s\n",
      kKernel, rows, n, k, ranks, peers ? "peers" : "local", med[0], med[1], med[2], med[3], med[4],
      med[2] / floor_ms, med[3] / floor_ms, worst_bad ? "FAILED" : "ok");
  return worst_bad == 0 ? 0 : 2;
}

// The waiting GEMM's kernel template (NOTE [waiting gemm] in gemm/gemm.h): CUTLASS's Hopper
// pointer-array GEMM whose mainloop waits on each group's flag before its first TMA load of
// that group. Included by the waiting_gemm_tiles_*.cu files only, each instantiating one tile
// shape (NOTE [waiting gemm tiles] in waiting_gemm.cu); CUTLASS builds only.
//
// NOTE [waiting mainloop]: the only code of ours inside the kernel is WaitingMainloop below, a
// collective derived from CUTLASS's Hopper array mainloop. The producer warp records the group
// of its tile in tensors_perform_update (called whenever its tile's group changes) and, in
// load, lets one lane poll that group's flag (ld.acquire.sys) until it reaches the group's
// value, then __syncwarp and fence.proxy.async.global: the shard was written by a copy engine
// and is read by TMA (the async proxy), and the fence orders the acquire before those reads.
// The consumer warps need no wait: they consume what the producer loaded. A warp polls a
// group's flag once (flags only grow: a group seen landed stays landed), and the flags are
// local flags in device memory (NOTE [local flags] in comm/transport.h): polled at every tile
// by every lane in the pinned host flag page, the first library build ran 2-45x its floor
// (docs/performance-log.md [fused ag_gemm]). The poll has no deadline of its own: a local flag
// is set by this rank's own copy lane, which waits on nothing the GEMM holds. In a 2-CTA
// cluster both CTAs take tiles of one group, so each waits on the flag of the A rows it loads
// itself (the weight, multicast between them, waits for nothing). Probed on 4xH200
// (docs/performance-log.md [fused ag_gemm probe]) before it was built here. Verdict: derive the
// mainloop, keep everything else CUTLASS's.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "common/cuda/cuda_check.h"
#include "gemm/cuda/gemm_context.h"
#include "gemm/cuda/waiting_gemm_tiles.h"

namespace overlap::gemm::waiting {

using namespace cute;

// Groups per launch: their flags travel in the kernel's parameters, the rest in one staged
// block (store_block). More groups take more launches, in order on the stream.
struct GroupWaits {
  const std::uint64_t* flags[kWaitingMaxGroups];
  std::uint64_t values[kWaitingMaxGroups];
};

// NOTE [waiting mainloop].
template <class Base>
struct WaitingMainloop : Base {
  struct Arguments : Base::Arguments {
    GroupWaits waits;
  };
  struct Params : Base::Params {
    GroupWaits waits;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape shapes, Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(
        shapes, static_cast<typename Base::Arguments const&>(args), workspace);
    p.waits = args.waits;
    return p;
  }

  int group_ = 0;

  CUTLASS_DEVICE static std::uint64_t load_acquire_sys(const std::uint64_t* p) {
    std::uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }

  template <class InputTensors, class ProblemShapeMNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& tensors,
                                                     Params const& params, ProblemShapeMNKL shape,
                                                     int32_t next_batch) {
    group_ = next_batch;
    return Base::tensors_perform_update(tensors, params, shape, next_batch);
  }

  int waited_ = -1;  // the last group whose flag this warp saw set

  template <class... Rest>
  CUTLASS_DEVICE void load(Params const& params, Rest&&... rest) {
    const std::uint64_t* flag = params.waits.flags[group_];
    if (flag != nullptr && waited_ != group_) {
      // NOTE [waiting mainloop]: once per group and warp, by one lane (flags only grow).
      if ((threadIdx.x & 31) == 0) {
        const std::uint64_t value = params.waits.values[group_];
        while (load_acquire_sys(flag) < value) __nanosleep(128);
      }
      __syncwarp();  // orders lane 0's acquire before every lane's later accesses
      asm volatile("fence.proxy.async.global;" ::: "memory");
      waited_ = group_;
    }
    Base::load(params, static_cast<Rest&&>(rest)...);
  }
};

using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // A [m, k]
using LayoutB = cutlass::layout::ColumnMajor;  // the weight [n, k] row-major = [k, n] col-major
using LayoutD = cutlass::layout::RowMajor;     // D [m, n]
constexpr int kAlign = 8;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int> >;

template <class TileShape, class ClusterShape, class MainloopSchedule, class EpilogueSchedule>
struct Kernel {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlign,
      Element, LayoutD*, kAlign, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, float, void> >::CollectiveOp;
  using Built = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlign, Element,
      LayoutB*, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Mainloop = WaitingMainloop<Built>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue> >;
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;
};

template <int M, int N, class Cluster>
using Pingpong = Kernel<Shape<Int<M>, Int<N>, _64>, Cluster,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                        cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
template <int M, int N, class Cluster>
using Cooperative = Kernel<Shape<Int<M>, Int<N>, _64>, Cluster,
                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                           cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using Cluster1 = Shape<_1, _1, _1>;
using Cluster2 = Shape<_2, _1, _1>;  // two CTAs along M: the weight's tiles multicast

// The grouped GEMM's device-side arguments of one launch, staged through the kernel parameters
// of store_block (capturable; no host memory is read when the copy runs).
constexpr std::size_t kBlockBytes = 2560;
struct Block {
  unsigned char bytes[kBlockBytes];
};

// Defined once (waiting_gemm.cu); every instantiation stages its block with it.
void stage_block(const Block& block, unsigned bytes, unsigned char* dst, cudaStream_t stream);

constexpr std::size_t align_up(std::size_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

template <class K>
void launch(const WaitingLaunch& l) {
  using Gemm = typename K::Gemm;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  // The block: shapes, then the pointer arrays, then the strides.
  std::size_t off = 0;
  const auto take = [&](std::size_t bytes) {
    const std::size_t at = align_up(off, 16);
    off = at + bytes;
    return at;
  };
  const int count = l.count;
  OVERLAP_CHECK(count >= 1 && count <= kWaitingMaxGroups, kInternal,
                "waiting gemm: " << count << " groups in one launch");
  const std::size_t n = static_cast<std::size_t>(count);
  const std::size_t o_shapes = take(n * sizeof(Shape3));
  const std::size_t o_a = take(n * sizeof(const Element*));
  const std::size_t o_b = take(n * sizeof(const Element*));
  const std::size_t o_d = take(n * sizeof(Element*));
  const std::size_t o_sa = take(n * sizeof(typename K::StrideA));
  const std::size_t o_sb = take(n * sizeof(typename K::StrideB));
  const std::size_t o_sd = take(n * sizeof(typename K::StrideD));
  OVERLAP_CHECK(
      off <= kBlockBytes, kInternal,
      "waiting gemm: " << off << " bytes of arguments exceed the block of " << kBlockBytes);
  Block block;
  std::vector<Shape3> host_shapes(n);
  GroupWaits waits{};
  for (int i = 0; i < count; ++i) {
    const WaitingGemmGroup& g = l.groups[i];
    const int m = static_cast<int>(g.a.rows);
    const int cols = static_cast<int>(g.b.rows);  // n: the weight is [n, k]
    const int k = static_cast<int>(g.a.cols);
    host_shapes[i] = Shape3{m, cols, k};
    const Element* a = static_cast<const Element*>(g.a.data);
    const Element* b = static_cast<const Element*>(g.b.data);
    Element* d = static_cast<Element*>(g.d.data) + g.d.row_offset * g.d.ld;
    auto sa = cutlass::make_cute_packed_stride(typename K::StrideA{}, {m, k, 1});
    auto sb = cutlass::make_cute_packed_stride(typename K::StrideB{}, {cols, k, 1});
    auto sd = cutlass::make_cute_packed_stride(typename K::StrideD{}, {m, cols, 1});
    cute::get<0>(sa) = g.a.ld;  // the row pitches (validated multiples of 8)
    cute::get<0>(sb) = g.b.ld;
    cute::get<0>(sd) = g.d.ld;
    std::memcpy(block.bytes + o_shapes + i * sizeof(Shape3), &host_shapes[i], sizeof(Shape3));
    std::memcpy(block.bytes + o_a + i * sizeof(a), &a, sizeof(a));
    std::memcpy(block.bytes + o_b + i * sizeof(b), &b, sizeof(b));
    std::memcpy(block.bytes + o_d + i * sizeof(d), &d, sizeof(d));
    std::memcpy(block.bytes + o_sa + i * sizeof(sa), &sa, sizeof(sa));
    std::memcpy(block.bytes + o_sb + i * sizeof(sb), &sb, sizeof(sb));
    std::memcpy(block.bytes + o_sd + i * sizeof(sd), &sd, sizeof(sd));
    waits.flags[i] = g.flag;
    waits.values[i] = g.value;
  }

  typename Gemm::Arguments args;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = l.device;
  hw.sm_count = l.sm_count;
  // Pointers into the block, valid once the block is staged (placeholders for the size query).
  const auto fill_args = [&](unsigned char* base) {
    typename K::Mainloop::Arguments mainloop;
    static_cast<typename K::Built::Arguments&>(mainloop) = {
        reinterpret_cast<const Element**>(base + o_a),
        reinterpret_cast<typename K::StrideA*>(base + o_sa),
        reinterpret_cast<const Element**>(base + o_b),
        reinterpret_cast<typename K::StrideB*>(base + o_sb)};
    mainloop.waits = waits;
    decltype(args.epilogue.thread) fusion;
    fusion.alpha = l.alpha;
    fusion.beta = 0.0f;
    args = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {count, reinterpret_cast<Shape3*>(base + o_shapes), host_shapes.data()},
        mainloop,
        {fusion, nullptr, reinterpret_cast<typename K::StrideD*>(base + o_sd),
         reinterpret_cast<Element**>(base + o_d),
         reinterpret_cast<typename K::StrideD*>(base + o_sd)},
        hw};
    args.scheduler.max_swizzle_size = l.swizzle;
  };
  fill_args(nullptr);
  const std::size_t o_workspace = align_up(off, 256);
  const std::size_t total = o_workspace + Gemm::get_workspace_size(args);
  ScratchBuffer scratch(l.pool, total, l.stream);  // stream-ordered (NOTE [gemm workspace])
  unsigned char* base = reinterpret_cast<unsigned char*>(scratch.data());
  fill_args(base);
  stage_block(block, static_cast<unsigned>(off), base, l.stream);
  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  OVERLAP_CHECK(
      can == cutlass::Status::kSuccess, kInternal,
      "waiting gemm: CUTLASS refused a validated problem: " << cutlassGetStatusString(can));
  const cutlass::Status init = gemm.initialize(args, base + o_workspace, l.stream);
  OVERLAP_CHECK(init == cutlass::Status::kSuccess, kInternal,
                "waiting gemm: initialize failed: " << cutlassGetStatusString(init));
  const cutlass::Status run = gemm.run(l.stream);
  OVERLAP_CHECK(run == cutlass::Status::kSuccess, kInternal,
                "waiting gemm: launch failed: " << cutlassGetStatusString(run));
  OVERLAP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace overlap::gemm::waiting

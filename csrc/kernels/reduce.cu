// CUDA reduction of k input buffers (reduce_pointers_cuda): the reduction step of the CUDA
// transport's reduce-scatter and of reduce_partials on CUDA tensors.
//
// NOTE [peer inputs]: the inputs may be other GPUs' memory mapped through CUDA IPC, and out
// may alias one of them. So the loads are plain global loads (no read-only/texture path,
// whose caches assume the data does not change during the kernel), nothing is __restrict__,
// and each thread reads all k inputs of its elements before it writes those elements. The
// k pointers travel by value in the kernel's parameters (no device allocation, no copy).
#include "kernels/device_utils.cuh"
#include "kernels/reduce.h"

namespace overlap::kernels {

namespace {

using device::abs_bits;
using device::element;

constexpr int kThreads = 256;
constexpr int kMaxInputs = 64;
// Inputs loaded before any of them is summed: up to kLoadBatch independent 16-byte loads in
// flight per thread (4 registers each), which hides the latency of peer memory.
constexpr int kLoadBatch = 8;
// NOTE [reduce loads in flight]: with k <= kSmallK inputs (k a template argument) a thread
// takes kLoadsInFlight / k vectors a grid-stride step (the others grid-stride away, so each
// load instruction of a warp stays one contiguous 512-byte run), all of the step's loads
// issued before any sum: 8 independent 16-byte loads in flight per thread whatever k, 128
// bytes a thread, 128 KiB an SM at 1024 resident threads (4 blocks at <= 64 registers).
// Little's law (~4.8 TB/s x ~0.8 us / 132 SMs, an estimate) asks ~30 KiB an SM when every SM
// reduces; a reduction beside a GEMM gets a few SMs (bulk_rs: 8 of 132 by default, NOTE
// [bulk_rs defaults]) and then needs several times that to move its bytes at HBM latency:
// beside bulk_rs's side GEMM, 128 bytes in flight a thread moved about a third more per SM than
// 64 (docs/performance-log.md [reduce loads in flight]). All instantiations stay <= 64 registers.
constexpr int kSmallK = 4;
constexpr int kLoadsInFlight = 8;

struct InputPointers {
  const void* ptr[kMaxInputs];
};

constexpr bool is_fp8(DType d) {
  return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2;
}

template <DType kOut>
using OutElement = std::conditional_t<
    kOut == DType::kFloat32, float,
    std::conditional_t<kOut == DType::kFloat16, __half,
                       std::conditional_t<kOut == DType::kBFloat16, __nv_bfloat16, std::uint8_t>>>;

// One output element from the float32 sum: rounded to out's dtype, or fp8(sum * scale).
template <DType kOut>
__device__ __forceinline__ void store_one(void* out, std::size_t i, float acc, float scale) {
  if constexpr (is_fp8(kOut)) {
    static_cast<std::uint8_t*>(out)[i] = device::to_fp8<kOut>(__fmul_rn(acc, scale));
  } else {
    static_cast<OutElement<kOut>*>(out)[i] = device::from_float<OutElement<kOut>>(acc);
  }
}

template <DType kOut, int kVec>
__device__ __forceinline__ void store_vector(void* out, std::size_t i, const float (&acc)[kVec],
                                             float scale) {
  if constexpr (is_fp8(kOut)) {
    float q[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) q[j] = __fmul_rn(acc[j], scale);
    std::uint32_t w[kVec / 4];
    device::pack_fp8<kOut, kVec>(q, w);
    device::store_words<kVec / 4>(static_cast<std::uint8_t*>(out) + i, w);
  } else {
    using OutT = OutElement<kOut>;
    std::uint32_t w[kVec * sizeof(OutT) / 4];
    device::pack_elements<OutT, kVec>(acc, w);
    device::store_words<kVec * sizeof(OutT) / 4>(static_cast<OutT*>(out) + i, w);
  }
}

// The sum of one element vector (kVec elements) of the kK inputs, NOTE [reduction order], from
// loads already made: x[p] is input p's vector.
template <typename T, int kVec, int kK>
__device__ __forceinline__ void sum_loaded(const uint4 (&x)[kK], float (&acc)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = element<T>(x[0], j);
#pragma unroll
  for (int p = 1; p < kK; ++p) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = __fadd_rn(acc[j], element<T>(x[p], j));
  }
}

// NOTE [reduction order] (reduce.h): acc = in[0]; acc += in[1]; ... with __fadd_rn, so that
// the sum is the host reference's to the bit. kK: the number of inputs k when k <= kSmallK
// (NOTE [reduce loads in flight]), else 0 (any k, the runtime argument).
template <typename T, DType kOut, int kK>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(const InputPointers in, int k, std::size_t n, void* out, const float* scale,
                  float* scale_inv, unsigned* amax, bool vectorized) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  float s = 1.0f;
  if constexpr (is_fp8(kOut)) {
    s = *scale;
    if (scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      *scale_inv = device::reciprocal(s);
    }
  }
  unsigned local = 0;
  const auto scalar_op = [&](std::size_t i) {
    float acc = device::to_float(static_cast<const T*>(in.ptr[0])[i]);
    for (int p = 1; p < k; ++p) {
      acc = __fadd_rn(acc, device::to_float(static_cast<const T*>(in.ptr[p])[i]));
    }
    local = max(local, abs_bits(acc));
    store_one<kOut>(out, i, acc, s);
  };
  if constexpr (kK > 0) {
    // NOTE [vector and scalar paths] with kVecs vectors a step, then the scalar tail.
    constexpr int kVecs = kLoadsInFlight / kK;
    const std::size_t tid = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const std::size_t n_vec = vectorized ? n / kVec : 0;
    for (std::size_t v0 = tid; v0 < n_vec; v0 += kVecs * stride) {
      uint4 x[kVecs][kK];
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        const std::size_t i = (v0 + u * stride) * kVec;
#pragma unroll
        for (int p = 0; p < kK; ++p) {
          x[u][p] = make_uint4(0u, 0u, 0u, 0u);
          if (v0 + u * stride < n_vec) {
            x[u][p] = *(reinterpret_cast<const uint4*>(static_cast<const T*>(in.ptr[p]) + i));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kVecs; ++u) {
        if (v0 + u * stride < n_vec) {
          float acc[kVec];
          sum_loaded<T, kVec, kK>(x[u], acc);
#pragma unroll
          for (int j = 0; j < kVec; ++j) local = max(local, abs_bits(acc[j]));
          store_vector<kOut, kVec>(out, (v0 + u * stride) * kVec, acc, s);
        }
      }
    }
    for (std::size_t i = n_vec * kVec + tid; i < n; i += stride) scalar_op(i);
  } else {
    device::grid_stride<kVec>(
        n, vectorized,
        [&](std::size_t i) {
          float acc[kVec] = {};
          for (int p0 = 0; p0 < k; p0 += kLoadBatch) {
            uint4 v[kLoadBatch];
#pragma unroll
            for (int u = 0; u < kLoadBatch; ++u) {
              if (p0 + u < k)
                v[u] = *(reinterpret_cast<const uint4*>(static_cast<const T*>(in.ptr[p0 + u]) + i));
            }
#pragma unroll
            for (int u = 0; u < kLoadBatch; ++u) {
              if (p0 + u < k) {
#pragma unroll
                for (int j = 0; j < kVec; ++j) {
                  const float e = element<T>(v[u], j);
                  acc[j] = p0 + u == 0 ? e : __fadd_rn(acc[j], e);
                }
              }
            }
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) local = max(local, abs_bits(acc[j]));
          store_vector<kOut, kVec>(out, i, acc, s);
        },
        scalar_op);
  }
  if (amax != nullptr) device::block_amax_to<kThreads>(local, amax);
}

template <typename Fn>
void dispatch_out_format(DType fmt, const char* op, Fn&& fn) {
  switch (fmt) {
    case DType::kFloat32:
      return fn(DTypeTag<DType::kFloat32>{});
    case DType::kFloat16:
      return fn(DTypeTag<DType::kFloat16>{});
    case DType::kBFloat16:
      return fn(DTypeTag<DType::kBFloat16>{});
    case DType::kFloat8E4M3:
      return fn(DTypeTag<DType::kFloat8E4M3>{});
    case DType::kFloat8E5M2:
      return fn(DTypeTag<DType::kFloat8E5M2>{});
    default:
      OVERLAP_THROW(kInvalidArgument, op << ": out_format must be float32, float16, bfloat16, "
                                            "float8_e4m3fn or float8_e5m2, got "
                                         << dtype_name(fmt));
  }
}

}  // namespace

void reduce_pointers_cuda(const void* const* inputs, DType dtype, std::size_t k, std::size_t n,
                          void* out, DType out_format, const float* scale, float* scale_inv,
                          float* amax, int max_blocks, cudaStream_t stream, bool accumulate_amax) {
  constexpr const char* kOp = "reduce_pointers_cuda";
  // Every check before any GPU work.
  OVERLAP_CHECK_ARG(k >= 1 && k <= static_cast<std::size_t>(kMaxInputs),
                    kOp << ": k must be in [1, " << kMaxInputs
                        << "] (the input pointers travel by value in the kernel's parameters), "
                           "got k = "
                        << k);
  OVERLAP_CHECK_ARG(
      dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16,
      kOp << ": inputs must hold float32, float16 or bfloat16, got " << dtype_name(dtype));
  OVERLAP_CHECK_ARG(inputs != nullptr, kOp << ": inputs is nullptr");
  InputPointers in{};
  for (std::size_t p = 0; p < k; ++p) {
    OVERLAP_CHECK_ARG(n == 0 || inputs[p] != nullptr,
                      kOp << ": inputs[" << p << "] is nullptr (n = " << n << ")");
    in.ptr[p] = inputs[p];
  }
  OVERLAP_CHECK_ARG(n == 0 || out != nullptr, kOp << ": out is nullptr (n = " << n << ")");
  const bool fp8 = dtype_is_fp8(out_format);
  if (fp8) {
    OVERLAP_CHECK_ARG(scale != nullptr, kOp << ": an FP8 out_format (" << dtype_name(out_format)
                                            << ") needs a device float32 scale");
  } else {
    OVERLAP_CHECK_ARG(scale == nullptr && scale_inv == nullptr,
                      kOp << ": scale and scale_inv apply to FP8 outputs only; out_format is "
                          << dtype_name(out_format));
  }
  // NOTE [scalar aliasing] (kernel_args.h).
  OVERLAP_CHECK_ARG(scale == nullptr || (static_cast<const void*>(scale) != scale_inv &&
                                         static_cast<const void*>(scale) != amax),
                    kOp << ": scale_inv and amax must not alias scale on CUDA");
  OVERLAP_CHECK_ARG(amax == nullptr || amax != scale_inv,
                    kOp << ": amax and scale_inv must be distinct");

  bool vectorized = aligned_to(out, 16);
  for (std::size_t p = 0; p < k; ++p) vectorized = vectorized && aligned_to(inputs[p], 16);
  dispatch_out_format(out_format, kOp, [&](auto out_tag) {
    constexpr DType kOut = decltype(out_tag)::value;
    dispatch_float_type(dtype, kOp, [&](auto type_tag) {
      using T = typename decltype(type_tag)::type;
      constexpr std::size_t kVec = 16 / sizeof(T);
      const unsigned grid = grid_size(vectorized ? n / kVec : n, kThreads, max_blocks);
      // NOTE [amax bits]: zeroed in stream order, then max-reduced into by the kernel.
      if (amax != nullptr && !accumulate_amax) {
        OVERLAP_CHECK_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), stream));
      }
      const auto launch = [&](auto kernel) {
        kernel<<<grid, kThreads, 0, stream>>>(in, static_cast<int>(k), n, out, scale, scale_inv,
                                              reinterpret_cast<unsigned*>(amax), vectorized);
      };
      static_assert(kSmallK == 4, "one instantiation per k <= kSmallK below");
      switch (k) {
        case 1:
          launch(reduce_kernel<T, kOut, 1>);
          break;
        case 2:
          launch(reduce_kernel<T, kOut, 2>);
          break;
        case 3:
          launch(reduce_kernel<T, kOut, 3>);
          break;
        case 4:
          launch(reduce_kernel<T, kOut, 4>);
          break;
        default:
          launch(reduce_kernel<T, kOut, 0>);
      }
      OVERLAP_CHECK_LAUNCH("reduce_kernel");
    });
  });
}

}  // namespace overlap::kernels

// The host transport: POSIX shared memory, memcpy puts, atomic flags with a spin-wait. It runs
// in program order (streams ignored): the executable specification that CI runs without a GPU.
#include <sched.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/host/shm_region.h"
#include "comm/symmetric_buffer.h"
#include "comm/transport.h"
#include "common/errors.h"
#include "kernels/reduce.h"

namespace overlap::comm {

namespace {

constexpr const char* kHandlePrefix = "host-shm-v2";

// Segment layout: [flags: kFlagBytes][data].
class HostRegion final : public LocalRegion {
 public:
  HostRegion(const std::string& name, std::size_t bytes) : segment_(name, kFlagBytes + bytes) {
    std::memset(segment_.data(), 0, kFlagBytes);  // flags start at epoch 0
    cookie_ = write_cookie(segment_.data());      // NOTE [segment cookies]
  }
  void* data() const override { return static_cast<char*>(segment_.data()) + kFlagBytes; }
  std::size_t size() const override { return segment_.size() - kFlagBytes; }
  std::uint64_t* flags() const override { return static_cast<std::uint64_t*>(segment_.data()); }
  std::uint64_t* local_flags() const override { return local_flags_.get(); }  // NOTE [local flags]
  std::string export_handle() const override {
    std::ostringstream oss;
    oss << kHandlePrefix << ' ' << segment_.size() << ' ' << segment_.name() << ' ' << cookie_;
    return oss.str();
  }
  void on_all_peers_mapped() override { segment_.unlink(); }

 private:
  ShmSegment segment_;
  std::string cookie_;
  std::unique_ptr<std::uint64_t[]> local_flags_{new std::uint64_t[kLocalFlagBytes / 8]()};
};

class HostMapping final : public PeerMapping {
 public:
  HostMapping(const std::string& name, std::size_t segment_bytes, const std::string& cookie)
      : mapping_(name, segment_bytes) {
    check_cookie(mapping_.data(), cookie, name);  // NOTE [segment cookies]
  }
  void* data() const override { return static_cast<char*>(mapping_.data()) + kFlagBytes; }
  std::size_t size() const override { return mapping_.size() - kFlagBytes; }
  std::uint64_t* flags() const override { return static_cast<std::uint64_t*>(mapping_.data()); }

 private:
  ShmMapping mapping_;
};

class HostTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::kHost; }

  std::unique_ptr<LocalRegion> allocate(std::size_t bytes, const std::string& tag) override {
    // SymmetricBuffer bounds `bytes` (kMaxBytes), so the segment's size cannot wrap around.
    OVERLAP_CHECK_ARG(bytes <= SymmetricBuffer::kMaxBytes,
                      "host transport: " << bytes << " bytes exceed the largest buffer, "
                                         << SymmetricBuffer::kMaxBytes);
    return std::make_unique<HostRegion>(shm_name(tag), bytes);
  }

  std::unique_ptr<PeerMapping> map_peer(const std::string& handle) override {
    std::istringstream iss(handle);
    std::string prefix, name, cookie;
    std::size_t bytes = 0;
    iss >> prefix >> bytes >> name >> cookie;
    OVERLAP_CHECK(prefix == kHandlePrefix && !name.empty() && bytes > kFlagBytes &&
                      bytes - kFlagBytes <= SymmetricBuffer::kMaxBytes &&
                      cookie.size() == 2 * kCookieBytes,
                  kBootstrap,
                  "malformed host-transport handle '"
                      << handle << "': do all ranks use the host transport and one overlap build?");
    return std::make_unique<HostMapping>(name, bytes, cookie);
  }

  // Program order: every lane is the caller itself.
  void fork(cudaStream_t, int) override {}
  void join(cudaStream_t) override {}
  void lane_wait(cudaStream_t, int, int) override {}

  void put(void* dst, const void* src, std::size_t bytes, cudaStream_t, int) override {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
  }

  void put_sm(void* dst, const void* src, std::size_t bytes, int, cudaStream_t stream,
              int lane) override {
    put(dst, src, bytes, stream, lane);
  }

  void signal(std::uint64_t* flag, std::uint64_t value, cudaStream_t, int) override {
    // Release: every earlier put is visible to a peer that acquires this value.
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
  }

  // Besides its deadline, the spin checks NOTE [abort] and NOTE [poisoned flags] on every spin,
  // NOTE [interrupting waits] every kInterruptPeriod.
  void wait(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx, cudaStream_t,
            int) override {
    using Clock = std::chrono::steady_clock;
    std::uint64_t seen = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
    if (seen >= value && !poisoned_short(seen, value)) return;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(ctx.timeout_s));
    auto next_check = start + kInterruptPeriod;
    for (unsigned spins = 1;; ++spins) {
      seen = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
      if (seen >= value) {
        if (poisoned_short(seen, value)) raise_peer_failed(ctx, seen, value);
        return;
      }
      if (stopping()) raise_stopped(ctx);
      // Ranks may outnumber cores (tests oversubscribe): yield instead of burning a core.
      if (spins % 64 == 0) sched_yield();
      if (spins % 256 == 0) {
        const auto now = Clock::now();
        if (now > deadline) {
          // NOTE [failed transport]: the peers' epochs are out of step with ours from here on.
          const std::string what = describe_timeout(ctx, seen, value);
          fail(ErrorKind::kTimeout, what);
          OVERLAP_THROW(kTimeout, what);
        }
        if (now >= next_check) {
          next_check = now + kInterruptPeriod;
          if (interrupt_requested()) raise_interrupted(ctx);
        }
      }
    }
  }

  void reduce(void* out, const void* const* inputs, int num_inputs, std::size_t count, DType dtype,
              const ReduceOutput& o, cudaStream_t, int) override {
    OVERLAP_CHECK_ARG(num_inputs > 0, "reduce needs at least one input");
    OVERLAP_CHECK_ARG(
        dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16,
        "reduce: dtype " << dtype_name(dtype)
                         << " is not supported; use float32, bfloat16 or float16");
    // The kernels' host reference: the same fixed-order fp32 sum the CUDA kernel must match.
    const bool fp8 = dtype_is_fp8(o.format);
    OVERLAP_CHECK_ARG(o.format == dtype || fp8, "reduce: output format "
                                                    << dtype_name(o.format)
                                                    << " must be the inputs' dtype or FP8");
    OVERLAP_CHECK_ARG(!fp8 || o.scale != nullptr, "reduce: an FP8 output needs a scale");
    const float scale = fp8 ? *o.scale : 1.0f;
    const float amax = kernels::reduce_pointers_host(
        inputs, dtype, static_cast<std::size_t>(num_inputs), count, out, o.format, scale);
    if (fp8 && o.scale_inv != nullptr) *o.scale_inv = 1.0f / scale;
    if (o.amax != nullptr) {
      // NaN wins, as in the kernel's max over float bits.
      const float before = *o.amax;
      *o.amax = !o.accumulate_amax || std::isnan(amax) || amax > before ? amax : before;
    }
  }

  void gemm(const gemm::GemmOperand& a, const gemm::GemmOperand& b, const gemm::GemmOutput& d,
            const gemm::GemmOptions& options, cudaStream_t, int) override {
    gemm::gemm_host(a, b, d, options);
  }

  // Program order: everything issued has run; only a failure is left to raise.
  void synchronize(cudaStream_t) override { raise_if_failed(); }
};

}  // namespace

std::unique_ptr<Transport> make_host_transport() {
  return std::make_unique<HostTransport>();
}

}  // namespace overlap::comm

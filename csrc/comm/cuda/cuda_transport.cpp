// NOTE [cuda transport design]:
// - Data: cudaMalloc'd regions shared by CUDA IPC; puts are cudaMemcpyAsync (copy engines, no SM).
// - Flags: a POSIX shared-memory page per region, registered with CUDA (NOTE [flags in host
//   memory]). signal() is cuStreamWriteValue64 with its memory barrier (a peer that sees the
//   value sees the lane's earlier puts); wait() is cuStreamWaitValue64 (GEQ), polled by the
//   front end without an SM. The host can read and write the flags, so it can release a stuck
//   wait (NOTE [watchdog]) and check op records at issue time (NOTE [op records]).
// - Flags in device memory were no faster than in host memory; a polling kernel is faster than
//   a memop but needs an SM the GEMMs hold. Verdict: memops, except in handshakes where the SMs
//   are idle (NOTE [handshakes]); waits and markers off the critical path (NOTE [deferred
//   acknowledgements], NOTE [one marker per op]). Measured: docs/performance-log.md [cuda
//   transport design].
// - No multicast objects, no multimem instructions, ever (docs/design.md §3, invariant 6).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/cuda/cuda_memory.h"
#include "comm/cuda/graph_log.h"
#include "comm/cuda/lanes.h"
#include "comm/cuda/watchdog.h"
#include "comm/host/shm_region.h"
#include "comm/transport.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/device_guard.h"
#include "common/cuda/driver_api.h"
#include "common/errors.h"
#include "common/lifecycle.h"
#include "kernels/copy.h"
#include "kernels/handshake.h"
#include "kernels/reduce.h"

namespace overlap::comm {

namespace {

constexpr const char* kHandlePrefix = "cuda-ipc-v2";

CUdeviceptr device_ptr(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}

// The flag page of a region: a shared-memory page registered with CUDA, with its cookie
// (NOTE [segment cookies] in transport.h).
struct FlagPage {
  ShmSegment segment;
  std::string cookie;
  cuda::HostRegistration registration;
  explicit FlagPage(const std::string& name)
      : segment(name, kFlagBytes),
        cookie(write_cookie(segment.data())),
        registration(segment.data(), kFlagBytes) {}
};

class CudaRegion final : public LocalRegion {
 public:
  CudaRegion(int device, std::size_t bytes, const std::string& tag,
             std::shared_ptr<cuda::Watchdog> watchdog)
      : watchdog_(std::move(watchdog)),
        memory_(device, bytes),
        flags_(shm_name(tag)),
        local_flags_(device, kLocalFlagBytes) {}

  ~CudaRegion() override {
    // Ops may still be queued against this memory: wait for the device (the watchdog releases
    // stuck waits), stop watching our flags, then free in reverse order.
    if (!process_finalizing()) {
      DeviceGuard guard(memory_.device());
      OVERLAP_WARN_CUDA(cudaDeviceSynchronize());
    }
    watchdog_->forget(flags_.segment.data(), kFlagBytes);
  }

  void* data() const override { return memory_.data(); }
  std::size_t size() const override { return memory_.size(); }
  std::size_t allocated_bytes() const override { return memory_.allocated(); }
  std::uint64_t* flags() const override {
    return static_cast<std::uint64_t*>(flags_.segment.data());
  }
  std::uint64_t* local_flags() const override { return local_flags_.data(); }
  std::string export_handle() const override {
    std::ostringstream oss;
    oss << kHandlePrefix << ' ' << memory_.size() << ' ' << memory_.export_ipc_handle() << ' '
        << flags_.segment.name() << ' ' << flags_.cookie;
    return oss.str();
  }
  void on_all_peers_mapped() override { flags_.segment.unlink(); }

 private:
  std::shared_ptr<cuda::Watchdog> watchdog_;
  cuda::DeviceAllocation memory_;
  FlagPage flags_;
  cuda::LocalFlagMemory local_flags_;  // NOTE [local flags]
};

class CudaMapping final : public PeerMapping {
 public:
  CudaMapping(int device, std::size_t bytes, const std::string& ipc, const std::string& shm,
              const std::string& cookie)
      : bytes_(bytes),
        flags_(shm, kFlagBytes),
        cookie_checked_(checked(flags_, shm, cookie)),
        memory_(device, ipc),
        registration_(flags_.data(), kFlagBytes) {}
  void* data() const override { return memory_.data(); }
  std::size_t size() const override { return bytes_; }
  std::uint64_t* flags() const override { return static_cast<std::uint64_t*>(flags_.data()); }

 private:
  // The peer's flag page is refused unless it holds the cookie the peer sent (NOTE [segment
  // cookies]); checked before the IPC memory is mapped, so that a forged page maps nothing else.
  static bool checked(const ShmMapping& flags, const std::string& shm, const std::string& cookie) {
    check_cookie(flags.data(), cookie, shm);
    return true;
  }

  std::size_t bytes_;
  ShmMapping flags_;
  bool cookie_checked_;
  cuda::IpcMapping memory_;
  cuda::HostRegistration registration_;
};

class CudaTransport final : public Transport {
 public:
  explicit CudaTransport(int device)
      : device_(device),
        watchdog_(std::make_shared<cuda::Watchdog>(flag_registry_ptr())),
        lanes_(device) {
    check_device_capabilities();
  }

  TransportKind kind() const override { return TransportKind::kCuda; }
  int device() const override { return device_; }

  std::unique_ptr<LocalRegion> allocate(std::size_t bytes, const std::string& tag) override {
    DeviceGuard guard(device_);
    return std::make_unique<CudaRegion>(device_, bytes, tag, watchdog_);
  }

  std::unique_ptr<PeerMapping> map_peer(const std::string& handle) override {
    std::istringstream iss(handle);
    std::string prefix, ipc, shm, cookie;
    std::size_t bytes = 0;
    iss >> prefix >> bytes >> ipc >> shm >> cookie;
    OVERLAP_CHECK(
        prefix == kHandlePrefix && bytes > 0 && !shm.empty() && cookie.size() == 2 * kCookieBytes,
        kBootstrap,
        "malformed cuda-transport handle '"
            << handle << "': do all ranks use the cuda transport and one overlap build?");
    DeviceGuard guard(device_);
    return std::make_unique<CudaMapping>(device_, bytes, ipc, shm, cookie);
  }

  void fork(cudaStream_t stream, int lanes) override {
    DeviceGuard guard(device_);
    lanes_.fork(stream, lanes);
  }

  void join(cudaStream_t stream) override {
    DeviceGuard guard(device_);
    lanes_.join(stream);
  }

  void lane_wait(cudaStream_t stream, int lane, int other) override {
    DeviceGuard guard(device_);
    lanes_.wait(stream, lane, other);
  }

  void put(void* dst, const void* src, std::size_t bytes, cudaStream_t stream, int lane) override {
    if (dst == src || bytes == 0) return;
    DeviceGuard guard(device_);
    OVERLAP_CHECK_CUDA(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lanes_.stream(stream, lane)));
  }

  void put_sm(void* dst, const void* src, std::size_t bytes, int blocks, cudaStream_t stream,
              int lane) override {
    DeviceGuard guard(device_);
    kernels::copy_cuda(dst, src, bytes, blocks, lanes_.stream(stream, lane));
  }

  void signal(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream, int lane) override {
    DeviceGuard guard(device_);
    // Default flags: a memory barrier orders every earlier write of the lane before this one.
    OVERLAP_CHECK_CU(driver().cuStreamWriteValue64(lanes_.stream(stream, lane), device_ptr(flag),
                                                   value, CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  void wait(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
            cudaStream_t stream, int lane) override {
    DeviceGuard guard(device_);
    CUstream s = lanes_.stream(stream, lane);
    if (std::shared_ptr<cuda::GraphLog> log = cuda::graph_log_for(s)) {
      // Captured: always enqueued, with a placeholder marker (NOTE [graph capture]).
      const cuda::Watchdog::Ticket ticket = watchdog_->reserve();
      log->note_wait(watchdog_, ticket, flag, value, ctx);
      write_marker_value(s, ticket);
    } else {
      // NOTE [abort]: a stopped transport enqueues no more waits (the op raises).
      if (stopping()) raise_stopped(ctx);
      // Already satisfied: nothing to enqueue, unless only by a poison (NOTE [poisoned flags]).
      const std::uint64_t seen = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
      if (seen >= value) {
        if (poisoned_short(seen, value)) raise_peer_failed(ctx, seen, value);
        return;
      }
      std::lock_guard<std::mutex> lock(marks_mu_);
      cuda::Watchdog::Ticket own{};
      watchdog_->arm(flag, value, ctx, reached_marker(stream, s, own));
    }
    OVERLAP_CHECK_CU(
        driver().cuStreamWaitValue64(s, device_ptr(flag), value, CU_STREAM_WAIT_VALUE_GEQ));
  }

  // NOTE [handshakes]: one kernel; captured ones run as memops (re-armed markers).
  void handshake(const Handshake& h, cudaStream_t stream, int lane) override {
    if (is_capturing(stream)) {
      Transport::handshake(h, stream, lane);
      return;
    }
    OVERLAP_CHECK(h.before.size() <= kernels::kMaxHandshakeWords &&
                      h.after.size() <= kernels::kMaxHandshakeWords &&
                      h.signals.size() <= kernels::kMaxHandshakeFlags &&
                      h.waits.size() <= kernels::kMaxHandshakeFlags,
                  kInternal,
                  "handshake: " << h.before.size() << " + " << h.after.size() << " words, "
                                << h.signals.size() << " signals and " << h.waits.size()
                                << " waits exceed the kernel's bounds");
    DeviceGuard guard(device_);
    CUstream s = lanes_.stream(stream, lane);
    kernels::HandshakeParams p;
    const auto words = [](const std::vector<WordCopy>& from, kernels::HandshakeWord* to) {
      for (std::size_t i = 0; i < from.size(); ++i) {
        to[i].dst = static_cast<std::uint32_t*>(from[i].dst);
        to[i].src = static_cast<const std::uint32_t*>(from[i].src);
      }
      return static_cast<int>(from.size());
    };
    p.num_before = words(h.before, p.before);
    p.num_after = words(h.after, p.after);
    p.value = h.value;
    for (std::uint64_t* flag : h.signals) p.signals[p.num_signals++] = flag;
    {
      std::lock_guard<std::mutex> lock(marks_mu_);
      cuda::Watchdog::Ticket own{};
      const cuda::Watchdog::Ticket* reached = nullptr;  // only if the kernel waits at all
      for (const FlagWait& w : h.waits) {
        const std::uint64_t seen = __atomic_load_n(w.flag, __ATOMIC_ACQUIRE);
        if (seen >= w.value) {  // flags only grow (NOTE [poisoned flags]: unless poisoned)
          if (poisoned_short(seen, w.value)) raise_peer_failed(w.ctx, seen, w.value);
          continue;
        }
        if (reached == nullptr) reached = reached_marker(stream, s, own);
        watchdog_->arm(w.flag, w.value, w.ctx, reached);
        p.waits[p.num_waits] = w.flag;
        p.wait_values[p.num_waits++] = w.value;
      }
    }
    kernels::handshake_cuda(p, s);
  }

  // NOTE [waiting gemm]: one kernel. Its flags are local (NOTE [local flags]): device memory the
  // host must not read, set by this rank's own copy lanes, so nothing is armed.
  void waiting_gemm(const std::vector<gemm::WaitingGemmGroup>& groups,
                    const std::vector<WaitContext>& ctxs, const gemm::GemmOptions& options,
                    double last_arrival_ms, cudaStream_t stream, int lane) override {
    OVERLAP_CHECK(!is_capturing(stream), kInternal,
                  "waiting_gemm: captured ops run the chunked schedule (NOTE [fused ag_gemm])");
    if (stopping()) raise_stopped(ctxs.empty() ? WaitContext{} : ctxs.front());  // NOTE [abort]
    DeviceGuard guard(device_);
    gemm::waiting_gemm_cuda(groups, options, device_, lanes_.stream(stream, lane), last_arrival_ms);
  }

  void reduce(void* out, const void* const* inputs, int num_inputs, std::size_t count, DType dtype,
              const ReduceOutput& o, cudaStream_t stream, int lane) override {
    DeviceGuard guard(device_);
    kernels::reduce_pointers_cuda(inputs, dtype, static_cast<std::size_t>(num_inputs), count, out,
                                  o.format, o.scale, o.scale_inv, o.amax, o.max_blocks,
                                  lanes_.stream(stream, lane), o.accumulate_amax);
  }

  // Each lane's GEMM has its own workspace (NOTE [gemm workspace] in gemm_context.h).
  void gemm(const gemm::GemmOperand& a, const gemm::GemmOperand& b, const gemm::GemmOutput& d,
            const gemm::GemmOptions& options, cudaStream_t stream, int lane) override {
    DeviceGuard guard(device_);
    gemm::gemm_cuda(a, b, d, options, device_, lanes_.stream(stream, lane));
  }

  void order_ops(const void* key, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(ops_mu_);
    OpOrder& o = op_order_[key];
    // A capture may not wait outside it: every replay orders itself instead.
    const bool capturing = is_capturing(stream);
    if (o.used && o.last != stream && !capturing) {
      DeviceGuard guard(device_);
      if (!o.event) o.event = std::make_unique<cuda::OwnedEvent>();
      // Recorded now, on the previous op's stream: covers that whole op, already issued.
      OVERLAP_CHECK_CUDA(cudaEventRecord(o.event->get(), o.last));
      OVERLAP_CHECK_CUDA(cudaStreamWaitEvent(stream, o.event->get(), 0));
    }
    o.used = true;
    o.last = stream;
  }

  void forget_ops(const void* key) override {
    std::lock_guard<std::mutex> lock(ops_mu_);
    op_order_.erase(key);
  }

  void note_op(SymmetricBuffer& buf, std::uint64_t epoch, cudaStream_t stream) override {
    if (std::shared_ptr<cuda::GraphLog> log = cuda::graph_log_for(stream)) {
      // A window's epochs are its root's (NOTE [buffer windows]): one span per root.
      log->note_op(buf.root().shared_from_this(), epoch);
    }
  }

  // NOTE [one marker per op]: the op's, or else `own`, written now. Holds marks_mu_.
  const cuda::Watchdog::Ticket* reached_marker(cudaStream_t stream, CUstream s,
                                               cuda::Watchdog::Ticket& own) {
    const auto mark = op_marks_.find(stream);
    if (mark != op_marks_.end()) return &mark->second;
    own = watchdog_->reserve();
    write_marker_value(s, own);
    return &own;
  }

  void op_begun(cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(marks_mu_);
    if (is_capturing(stream)) {
      op_marks_.erase(stream);
      return;
    }
    const cuda::Watchdog::Ticket ticket = watchdog_->reserve();
    DeviceGuard guard(device_);
    write_marker_value(lanes_.beside(stream), ticket);
    op_marks_[stream] = ticket;
  }

  // Polls rather than cudaStreamSynchronize, so that NOTE [abort] or NOTE [interrupting waits]
  // ends it at once (a stream behind released waits may still hold seconds of GEMMs).
  void synchronize(cudaStream_t stream) override {
    using Clock = std::chrono::steady_clock;
    DeviceGuard guard(device_);
    auto next_check = Clock::now() + kInterruptPeriod;
    for (unsigned polls = 0;; ++polls) {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaSuccess) break;
      if (status != cudaErrorNotReady) OVERLAP_CHECK_CUDA(status);
      if (stopping()) break;  // raise_if_failed() below raises the fault
      const auto now = Clock::now();
      if (now >= next_check) {
        next_check = now + kInterruptPeriod;
        if (interrupt_requested()) {
          fail(ErrorKind::kAborted, "synchronize() " + interrupted_message());
          request_abort();
          break;
        }
      }
      // Spin briefly (short ops), then poll at a few tens of microseconds.
      if (polls >= 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    raise_if_failed();
  }

  // NOTE [destroy while in use]: released ops still write to the peers' memory.
  void quiesce() noexcept override {
    if (process_finalizing()) return;
    DeviceGuard guard(device_);
    OVERLAP_WARN_CUDA(cudaDeviceSynchronize());
  }

  void check_stream(cudaStream_t stream) const override { cuda::graph_log_for(stream); }
  bool capturing(cudaStream_t stream) const override { return is_capturing(stream); }

 private:
  void check_device_capabilities() const {
    int count = 0;
    OVERLAP_CHECK_CUDA(cudaGetDeviceCount(&count));
    OVERLAP_CHECK(device_ >= 0 && device_ < count, kConfig,
                  "cuda:" << device_ << " does not exist (" << count << " visible GPUs)");
    int host_ptr = 0;
    OVERLAP_CHECK_CUDA(
        cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem, device_));
    OVERLAP_CHECK(host_ptr != 0, kUnsupported,
                  "cuda:" << device_
                          << " cannot use host pointers of registered memory; the cuda "
                             "transport keeps its flags there (NOTE [flags in host memory])");
    CUdevice dev = 0;
    OVERLAP_CHECK_CU(driver().cuDeviceGet(&dev, device_));
    int memops = 0;
    OVERLAP_CHECK_CU(driver().cuDeviceGetAttribute(
        &memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
    OVERLAP_CHECK(memops != 0, kUnsupported,
                  "cuda:" << device_
                          << " does not support 64-bit stream memory operations, which the "
                             "cuda transport's signals use; update the NVIDIA driver");
  }

  static bool is_capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    OVERLAP_CHECK_CUDA(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }

  // NOTE [ops on several streams]: per buffer, the stream of its last op.
  struct OpOrder {
    bool used = false;
    cudaStream_t last = nullptr;
    std::unique_ptr<cuda::OwnedEvent> event;
  };

  // NOTE [failed transport]: the watchdog's fault, unless another came first.
  void poll_async_faults() const override {
    const cuda::Watchdog::Fault fault = watchdog_->fault();
    if (!fault.message.empty()) record_fault(fault.kind, fault.message);
  }
  // NOTE [monotone release] (watchdog.h): any fault releases every GPU wait at once.
  void on_failed() const noexcept override { watchdog_->stop(); }
  // NOTE [abort]: atomics only; the watchdog releases at its next poll.
  void on_abort() noexcept override { watchdog_->request_stop(); }

  // The marker write of a ticket: the stream has reached this point (NOTE [watchdog]).
  static void write_marker_value(CUstream s, const cuda::Watchdog::Ticket& ticket) {
    OVERLAP_CHECK_CU(driver().cuStreamWriteValue64(s, device_ptr(ticket.marker), ticket.seq,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  int device_;
  std::shared_ptr<cuda::Watchdog> watchdog_;
  cuda::Lanes lanes_;
  // NOTE [one marker per op]: per caller stream, the marker of the last op begun on it.
  std::mutex marks_mu_;
  std::unordered_map<cudaStream_t, cuda::Watchdog::Ticket> op_marks_;
  std::mutex ops_mu_;
  std::unordered_map<const void*, OpOrder> op_order_;
};

}  // namespace

std::unique_ptr<Transport> make_cuda_transport(int device) {
  return std::make_unique<CudaTransport>(device);
}

}  // namespace overlap::comm

// The transport interface: everything an overlap algorithm needs from the memory system.
// NOTE [one algorithm, two transports]: collectives and overlap schedules are written once
// against this interface. `host` (shared memory, memcpy, atomic flags; program order) is what
// CI runs; `cuda` (CUDA IPC, copy engines, stream-ordered flags) is the product.
//
// NOTE [lanes]: fork(stream, n) opens lanes 1..n-1, each starting after everything issued on
// `stream` (lane 0); join(stream) makes `stream` wait for them all, so the caller sees one
// stream-ordered op. On cuda a lane is a side stream; host runs every lane in program order.
//
// NOTE [flags]: a region has a data part and a flag part (kFlagBytes of uint64). Flags are
// written only by signal() and read only by wait(); their values (epochs) only grow.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/fault.h"
#include "common/dtype.h"
#include "common/errors.h"
#include "common/stream.h"
#include "gemm/gemm.h"

namespace overlap::comm {

class SymmetricBuffer;

enum class TransportKind { kHost = 0, kCuda = 1 };
const char* transport_name(TransportKind kind);

// Who is waiting for what: every timeout message names the op, rank, peer and step.
struct WaitContext {
  const char* op = "";
  int rank = 0;
  int peer = 0;
  int step = 0;
  std::uint64_t epoch = 0;
  double timeout_s = 60.0;
};

// How reduce() stores its sum (NOTE [reduction order] in kernels/reduce.h).
struct ReduceOutput {
  DType format = DType::kFloat32;  // the inputs' dtype, or an FP8 format
  const float* scale = nullptr;    // FP8 only (required): out = fp8(sum * scale)
  float* scale_inv = nullptr;      // FP8 only (optional): receives 1 / scale
  float* amax = nullptr;           // optional: receives max |sum| of the unscaled sum
  bool accumulate_amax = false;    // max-reduce into *amax (the later pieces of one output)
  int max_blocks = 0;              // cuda: bound on the grid (<= 0: fill the GPU)
};

// NOTE [handshakes]: copy a few words (`before`), signal every flag of `signals`, wait for every
// flag of `waits`, copy more words (`after`). On cuda it is ONE one-block polling kernel, several
// times faster than memops but holding an SM: ops use it only where the SMs are idle. Its waits
// keep the watchdog's deadline. Measured: docs/performance-log.md [handshakes].
struct FlagWait {
  const std::uint64_t* flag = nullptr;
  std::uint64_t value = 0;
  WaitContext ctx;
};
struct WordCopy {  // 4 bytes, 4-byte aligned
  void* dst = nullptr;
  const void* src = nullptr;
};
struct Handshake {
  std::vector<WordCopy> before;
  std::vector<std::uint64_t*> signals;
  std::uint64_t value = 0;
  std::vector<FlagWait> waits;
  std::vector<WordCopy> after;
};

// Bytes of the flag part of every region: 64 ranks x 4 slots x uint64, one 4 KiB page.
constexpr std::size_t kFlagBytes = 4096;
// NOTE [segment cookies]: the last kCookieBytes of a flag part hold a random cookie, also sent
// in the handle through the bootstrap; a peer refuses a region whose cookie differs (another
// process's segment of that name, or a stale one). Verdict: a cookie per region.
constexpr std::size_t kCookieBytes = 16;
constexpr std::size_t kCookieOffset = kFlagBytes - kCookieBytes;

std::string describe_timeout(const WaitContext& ctx, std::uint64_t seen, std::uint64_t wanted);
// A wait satisfied only by a failed peer's poison (NOTE [poisoned flags]).
std::string describe_peer_failure(const WaitContext& ctx, std::uint64_t seen, std::uint64_t wanted);

// NOTE [local flags]: besides the flag page its peers write, a region has kLocalFlagBytes of
// flags that only this rank writes (its own lanes' signals, stream-ordered) and reads (its own
// kernels and waits), zero-initialised, in the memory its GPU polls fastest: device memory on
// cuda, plain memory on host. A kernel polling the pinned host flag page from every SM costs
// PCIe round trips that serialise (the first fused AG+GEMM ran 2-45x its floor;
// docs/performance-log.md [fused ag_gemm]). No peer maps them and the watchdog cannot read
// them, so a wait on a local flag must depend on nothing but this rank's own copy-engine work
// and memops. Verdict: device memory for flags only our own GPU reads.
constexpr std::size_t kLocalFlagBytes = 4096;

// Memory this rank allocated and can share with peers. Owned; freed by the destructor.
class LocalRegion {
 public:
  virtual ~LocalRegion() = default;
  virtual void* data() const = 0;  // the data part (size() bytes)
  virtual std::size_t size() const = 0;
  // size(), or more where allocations are rounded up (NOTE [allocation granularity]).
  virtual std::size_t allocated_bytes() const { return size(); }
  virtual std::uint64_t* flags() const = 0;        // kFlagBytes of flag slots, zero-initialised
  virtual std::uint64_t* local_flags() const = 0;  // NOTE [local flags]
  // Opaque bytes that let a peer map this region (exchanged by the bootstrap).
  virtual std::string export_handle() const = 0;
  // Called once every peer has mapped the region (e.g. unlink a shared-memory name).
  virtual void on_all_peers_mapped() {}
};

// A peer's region mapped into this process. Unmapped by the destructor.
class PeerMapping {
 public:
  virtual ~PeerMapping() = default;
  virtual void* data() const = 0;
  virtual std::size_t size() const = 0;
  virtual std::uint64_t* flags() const = 0;
};

// NOTE [failed transport]: after a fault that escapes an op past begin_op, our epochs and flags
// no longer match the peers' (a leftover flag could pass the next op's wait). So the first such
// fault fails the whole transport: later ops raise it until the communicator is recreated,
// waits stop (NOTE [abort]), peers fail through NOTE [poisoned flags]. Faults before begin_op
// fail nothing. Verdict: fail the transport, never resynchronise epochs.
class Transport {
 public:
  Transport();
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  // The CUDA device whose memory this transport shares; -1 for host memory.
  virtual int device() const { return -1; }

  // `tag` names the region (NOTE [shm names] in overlap/comm/communicator.py).
  virtual std::unique_ptr<LocalRegion> allocate(std::size_t bytes, const std::string& tag) = 0;
  virtual std::unique_ptr<PeerMapping> map_peer(const std::string& handle) = 0;

  // NOTE [lanes]. fork() may be called once per op and stream; join() closes it.
  virtual void fork(cudaStream_t stream, int lanes) = 0;
  virtual void join(cudaStream_t stream) = 0;
  // Later work on `lane` waits for everything issued so far on lane `other` (of one fork).
  virtual void lane_wait(cudaStream_t stream, int lane, int other) = 0;

  // Copy `bytes` from src to dst (either may be a peer mapping), in order on `lane`.
  virtual void put(void* dst, const void* src, std::size_t bytes, cudaStream_t stream,
                   int lane) = 0;
  // put by SM loads/stores with at most `blocks` blocks (NOTE [sm puts] in kernels/copy.h).
  virtual void put_sm(void* dst, const void* src, std::size_t bytes, int blocks,
                      cudaStream_t stream, int lane) = 0;
  // Publish `value` into a flag (local or a peer's), after all earlier puts on the lane.
  virtual void signal(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream, int lane) = 0;
  // Block (host) or make the lane wait (cuda) until *flag >= value. After ctx.timeout_s it
  // raises kTimeout (on cuda at the next raise_if_failed, the lane released); likewise a wait
  // satisfied only by a peer's poison (NOTE [poisoned flags]) or stopped by NOTE [abort].
  virtual void wait(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
                    cudaStream_t stream, int lane) = 0;
  // NOTE [handshakes]: in order on `lane`. The default runs it as put/signal/wait calls.
  virtual void handshake(const Handshake& h, cudaStream_t stream, int lane);
  // NOTE [waiting gemm] (gemm/gemm.h): group g's GEMM once *flag_g >= value_g (ctxs[g] names
  // the wait), in order on `lane`; validate with gemm::validate_waiting_gemm before an op
  // begins. The flags are local flags (NOTE [local flags]) set by this rank's own lanes. The
  // default waits and multiplies group by group (host: the reference); cuda runs ONE kernel
  // (not under capture), chosen with last_arrival_ms (NOTE [waiting gemm choice]).
  virtual void waiting_gemm(const std::vector<gemm::WaitingGemmGroup>& groups,
                            const std::vector<WaitContext>& ctxs, const gemm::GemmOptions& options,
                            double last_arrival_ms, cudaStream_t stream, int lane);
  // out[i] = sum_k in[k][i], fp32 accumulation in input order; bf16/fp16/fp32 inputs.
  virtual void reduce(void* out, const void* const* inputs, int num_inputs, std::size_t count,
                      DType dtype, const ReduceOutput& o, cudaStream_t stream, int lane) = 0;
  // gemm/gemm.h on `lane`; validate with gemm::validate_gemm before an op begins.
  virtual void gemm(const gemm::GemmOperand& a, const gemm::GemmOperand& b,
                    const gemm::GemmOutput& d, const gemm::GemmOptions& options,
                    cudaStream_t stream, int lane) = 0;
  // NOTE [ops on several streams]: one buffer's ops must run in issue order even on different
  // streams, so order_ops makes `stream` wait for the stream of `key`'s (a buffer's) last op.
  virtual void order_ops(const void* /*key*/, cudaStream_t /*stream*/) {}
  virtual void forget_ops(const void* /*key*/) {}
  // begin_op opened op `epoch` (cuda: logged under capture, NOTE [graph capture]).
  virtual void note_op(SymmetricBuffer& /*buf*/, std::uint64_t /*epoch*/, cudaStream_t /*stream*/) {
  }
  // begin_op signalled the acknowledgements (cuda: NOTE [one marker per op] in watchdog.h).
  virtual void op_begun(cudaStream_t /*stream*/) {}
  // Host waits for `stream`, then raise_if_failed(); NOTE [interrupting waits].
  virtual void synchronize(cudaStream_t stream) = 0;
  // Host waits until nothing queued by this transport runs (NOTE [destroy while in use]).
  virtual void quiesce() noexcept {}

  // NOTE [failed transport]: the first fault wins. Thread-safe, never throws.
  void fail(ErrorKind kind, const std::string& message) noexcept;
  // NOTE [abort]: only stores atomics (callable from a signal handler).
  void request_abort() noexcept;
  // Whether waits must stop: the transport failed or request_abort() was called (lock-free).
  bool stopping() const noexcept {
    return failed_fast_.load(std::memory_order_acquire) ||
           abort_requested_.load(std::memory_order_acquire);
  }
  // Whether a fault was recorded (including one found by looking).
  bool failed() const;
  // The first fault's message ("" while the transport works).
  std::string failure() const;
  // Throws the first fault again, with its kind; every op calls it before its epoch.
  void raise_if_failed() const;
  // For a wait that must stop: stopping(), a peer's poison (fails the transport, kTimeout) or
  // its interrupt check fired (aborts, kAborted).
  [[noreturn]] void raise_stopped(const WaitContext& ctx) const;
  [[noreturn]] void raise_peer_failed(const WaitContext& ctx, std::uint64_t seen,
                                      std::uint64_t value);
  [[noreturn]] void raise_interrupted(const WaitContext& ctx);
  // The flags of this transport's live buffers (NOTE [poisoned flags]).
  FlagRegistry& flag_registry() const { return *flags_; }
  // Throws kUnsupported unless ops may use `stream` (cuda: capturing needs a graph log).
  virtual void check_stream(cudaStream_t /*stream*/) const {}
  // Whether `stream` is capturing a CUDA graph (always false on the host transport).
  virtual bool capturing(cudaStream_t /*stream*/) const { return false; }

 protected:
  // Records faults found asynchronously (cuda's watchdog) when failed() looks.
  virtual void poll_async_faults() const {}
  // Called once after the first fault poisoned the outgoing flags. Must not throw.
  virtual void on_failed() const noexcept {}
  // Called by request_abort(); must only store atomics (NOTE [abort]).
  virtual void on_abort() noexcept {}
  void record_fault(ErrorKind kind, const std::string& message) const noexcept;
  // For the cuda watchdog's re-poisoning.
  const std::shared_ptr<FlagRegistry>& flag_registry_ptr() const { return flags_; }

 private:
  // Records faults found by looking (with `peers`, also a peer's poison).
  void poll_faults(bool peers) const noexcept;

  std::shared_ptr<FlagRegistry> flags_;
  std::atomic<bool> abort_requested_{false};
  mutable std::atomic<bool> failed_fast_{false};
  mutable std::mutex fault_mu_;
  mutable bool failed_ = false;
  mutable ErrorKind fault_kind_ = ErrorKind::kInternal;
  mutable std::string fault_;
};

std::unique_ptr<Transport> make_host_transport();
#ifdef OVERLAP_WITH_CUDA
// The cuda transport on `device` (the CUDA ordinal this rank's tensors live on).
std::unique_ptr<Transport> make_cuda_transport(int device);
#endif

}  // namespace overlap::comm

// The transport interface: everything an overlap algorithm needs from the memory system.
//
// NOTE [one algorithm, two transports]: collectives and overlap schedules are written once
// against this interface. The `host` transport (POSIX shared memory, memcpy, atomic flags)
// executes in program order and is what CI runs; the `cuda` transport (CUDA IPC, copy-engine
// puts, stream-ordered flags) is the product. Every call takes a stream; host ignores it.
//
// NOTE [lanes]: an op may spread independent work over `lanes` (e.g. one put per peer, so that
// every NVLink carries a copy at once). fork(stream, n) opens lanes 1..n-1, each starting after
// everything already issued on `stream`; lane 0 is `stream` itself. join(stream) makes
// `stream` wait for all its lanes. put/signal/wait name their lane; the host transport runs
// every lane in program order. On cuda each lane is a side stream joined back to the caller's
// stream by events, so the caller sees one stream-ordered op.
//
// NOTE [flags]: a region has a data part and a flag part (kFlagBytes of uint64 slots). Flags
// are written only by signal() and read only by wait(); their values (epochs) only grow.
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

// How reduce() stores its sum (NOTE [reduction order] in kernels/reduce.h). Pointers are in
// the transport's memory (host memory for host, device memory on cuda).
struct ReduceOutput {
  DType format = DType::kFloat32;  // the inputs' dtype, or an FP8 format
  const float* scale = nullptr;    // FP8 only (required): out = fp8(sum * scale)
  float* scale_inv = nullptr;      // FP8 only (optional): receives 1 / scale
  float* amax = nullptr;           // optional: receives max |sum| of the unscaled sum
  // amax: max-reduce into the value already there instead of overwriting it (the pieces of
  // one output reduced by several calls; the first call overwrites).
  bool accumulate_amax = false;
  int max_blocks = 0;  // cuda: bound on the grid (<= 0: fill the GPU)
};

// NOTE [handshakes]: a handshake is a short exchange that every rank runs at the same point of
// an op: copy a few 4-byte words (`before`, e.g. this rank's FP8 scale_inv into its slot),
// store `value` into every flag of `signals`, wait until every flag of `waits` holds its
// value, then copy a few more words (`after`, e.g. the peers' scale_invs, which their
// `before` words published, into our slots). The host transport (and the cuda transport
// while a CUDA graph is captured) runs it as puts, signals and waits in that order. The cuda
// transport otherwise runs it as ONE one-block kernel that stores and polls the flags with
// SM instructions: a stream memory operation costs 13-15 us a hop (NOTE [cuda transport
// design]), a kernel's stores and loads a few. It takes one SM, so ops use it only where the
// SMs are idle (on the caller's stream before the op's GEMMs); its waits keep the watchdog's
// deadline and release (NOTE [watchdog]): the deadline counts from when the caller's stream
// reaches the kernel, so a kernel kept off the SMs by other streams' work for longer than the
// timeout reports one. Measured in benchmarks.overlap_ops --trace on 4xH200: 5-9 us per
// handshake of four ranks arriving together (torch's symmetric-memory barrier: 3-4).
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
// NOTE [segment cookies]: the last kCookieBytes of a region's flag part hold a random cookie
// that the region's creator writes there and exports in its handle (which travels through the
// bootstrap, never through the file system). A peer that maps the region compares the two and
// refuses a region whose cookie differs: a segment of that name that another process created
// (or replaced), or one left over from an earlier job. The slots end long before it
// (symmetric_buffer.cpp). Verdict: a cookie per region, checked by every peer.
constexpr std::size_t kCookieBytes = 16;
constexpr std::size_t kCookieOffset = kFlagBytes - kCookieBytes;

// "all_gather: rank 1 timed out after 60 s waiting for peer 2 at step 1 (epoch 7, ...)".
std::string describe_timeout(const WaitContext& ctx, std::uint64_t seen, std::uint64_t wanted);
// A wait for `wanted` satisfied only by the failed peer's poison (NOTE [poisoned flags]):
// "all_gather: rank 1 stopped waiting for peer 2 at step 1 (epoch 7): peer 2's communicator
// failed before it got there (...)".
std::string describe_peer_failure(const WaitContext& ctx, std::uint64_t seen, std::uint64_t wanted);

// Memory this rank allocated and can share with peers. Owned; freed by the destructor.
class LocalRegion {
 public:
  virtual ~LocalRegion() = default;
  virtual void* data() const = 0;  // the data part (size() bytes)
  virtual std::size_t size() const = 0;
  // Bytes of memory held for the data part: size(), or more where the transport rounds its
  // allocations up (cuda: NOTE [allocation granularity] in cuda/cuda_memory.h).
  virtual std::size_t allocated_bytes() const { return size(); }
  virtual std::uint64_t* flags() const = 0;  // kFlagBytes of flag slots, zero-initialised
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

// NOTE [failed transport]: after a timeout, an abort or any error that escapes an op once the
// op has taken its epoch (begin_op), this rank's epochs and flags no longer match its peers':
// a peer may still be inside the failed op, or a flag the failed op left behind may satisfy a
// wait of the next op, which would then read another op's data. So the first such fault fails
// the whole transport (one per communicator, shared by all its buffers): from then on every op
// on any of its buffers raises at once, with the fault's kind (a timeout stays a timeout) and
// its message, until the communicator and its buffers are destroyed and created anew. Every
// wait in progress on this rank stops too (NOTE [abort]), and the peers learn of it through
// their flags (NOTE [poisoned flags] in fault.h): a peer's failure fails this transport at its
// next look. Faults found before an op takes its epoch (bad arguments, a buffer not ready)
// fail nothing: the peers never saw the op. Verdict: fail the transport, never try to
// resynchronise epochs.
class Transport {
 public:
  Transport();
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  // The CUDA device whose memory this transport shares; -1 for host memory.
  virtual int device() const { return -1; }

  // `tag` names the region (NOTE [shm names] in overlap/comm/communicator.py: random per job
  // and buffer). `bytes` is the data part's size.
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
  // The same as put, moved by SM loads/stores with at most `blocks` blocks (NOTE [sm puts] in
  // kernels/copy.h); the host transport copies with memcpy.
  virtual void put_sm(void* dst, const void* src, std::size_t bytes, int blocks,
                      cudaStream_t stream, int lane) = 0;
  // Publish `value` into a flag (local or a peer's), after all earlier puts on the lane.
  virtual void signal(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream, int lane) = 0;
  // Block (host) or make the lane wait (cuda) until *flag >= value. A wait that has not been
  // satisfied ctx.timeout_s after it started raises kTimeout naming `ctx`: at once on host,
  // on cuda at the next call that checks (see raise_if_failed), with the lane released. A
  // wait satisfied only by a failed peer's poison (NOTE [poisoned flags]) raises kTimeout
  // naming the peer, and one in progress when the transport fails or is aborted stops with
  // the fault (NOTE [abort]).
  virtual void wait(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
                    cudaStream_t stream, int lane) = 0;
  // NOTE [handshakes]: in order on `lane`. The default runs it as put/signal/wait calls.
  virtual void handshake(const Handshake& h, cudaStream_t stream, int lane);
  // out[i] = sum_k in[k][i] with fp32 accumulation in input order; inputs of `dtype` (bf16,
  // fp16 or fp32), out stored as `o` says; in order on `lane` (an SM kernel on cuda).
  virtual void reduce(void* out, const void* const* inputs, int num_inputs, std::size_t count,
                      DType dtype, const ReduceOutput& o, cudaStream_t stream, int lane) = 0;
  // The library's GEMM (gemm/gemm.h) on `lane`: the host reference on host, cuBLASLt on the
  // transport's device on cuda. Operands live in the transport's memory. Validate the call
  // with gemm::validate_gemm(..., gemm::gemm_target(device())) before an op begins.
  virtual void gemm(const gemm::GemmOperand& a, const gemm::GemmOperand& b,
                    const gemm::GemmOutput& d, const gemm::GemmOptions& options,
                    cudaStream_t stream, int lane) = 0;
  // NOTE [ops on several streams]: the ops on one buffer must run in issue order even when the
  // caller issues them on different streams (the epoch protocol assumes that the previous op
  // has finished reading before this rank acknowledges the next one). order_ops(key, stream)
  // makes `stream` wait for everything issued so far on the stream of the previous op under
  // `key` (a buffer), when that was another stream; forget_ops(key) drops the key. No-ops on
  // the host transport, which runs in program order.
  virtual void order_ops(const void* /*key*/, cudaStream_t /*stream*/) {}
  virtual void forget_ops(const void* /*key*/) {}
  // Called by begin_op once op `epoch` of `buf` is opened on `stream`: the cuda transport
  // logs ops issued while a CUDA graph is captured (NOTE [graph capture] in
  // comm/cuda/graph_log.h). A no-op on the host transport.
  virtual void note_op(SymmetricBuffer& /*buf*/, std::uint64_t /*epoch*/, cudaStream_t /*stream*/) {
  }
  // Called by begin_op once the op's acknowledgements are signalled on `stream` (right before,
  // where a handshake signals and awaits them in one go): the cuda transport writes the op's
  // watchdog marker on a side stream that follows `stream` from here, and every wait of the
  // op shares it (NOTE [one marker per op] in comm/cuda/watchdog.h). A no-op on the host
  // transport.
  virtual void op_begun(cudaStream_t /*stream*/) {}
  // Make the host wait for everything issued on `stream`, then raise_if_failed(). Stops
  // waiting, and raises, once the transport fails or is aborted, or a signal handler raises
  // (NOTE [interrupting waits] in fault.h).
  virtual void synchronize(cudaStream_t stream) = 0;
  // Make the host wait until nothing queued by this transport still runs (cuda: the device
  // is idle), before a buffer's memory goes (NOTE [destroy while in use] in
  // symmetric_buffer.h). Never throws; a no-op on the host transport.
  virtual void quiesce() noexcept {}

  // NOTE [failed transport]. fail() records a fault; the first one wins, later ones are
  // ignored. Thread-safe, never throws.
  void fail(ErrorKind kind, const std::string& message) noexcept;
  // NOTE [abort]: fails the transport with kAborted and stops every wait of it on this rank.
  // Only stores atomics: callable from any thread and from a signal handler.
  void abort() noexcept;
  // Whether waits must stop: the transport failed or abort() was called (lock-free).
  bool stopping() const noexcept {
    return failed_fast_.load(std::memory_order_acquire) ||
           abort_requested_.load(std::memory_order_acquire);
  }
  // Whether a fault was recorded (on cuda, also a wait that the watchdog timed out; on both,
  // a peer whose flags carry the poison mark: NOTE [poisoned flags]).
  bool failed() const;
  // The first fault's message ("" while the transport works).
  std::string failure() const;
  // Throws the first fault again, with its kind, naming it and what to do; a no-op while the
  // transport works. Every op calls it before it takes an epoch.
  void raise_if_failed() const;
  // For a wait (`ctx`) that found stopping(): throws the fault that stopped it, naming the wait.
  [[noreturn]] void raise_stopped(const WaitContext& ctx) const;
  // For a wait for `value` that read `seen`, satisfied only by a failed peer's poison (NOTE
  // [poisoned flags]): fails the transport and throws kTimeout naming the wait and the peer.
  [[noreturn]] void raise_peer_failed(const WaitContext& ctx, std::uint64_t seen,
                                      std::uint64_t value);
  // For a wait (`ctx`) whose interrupt check fired (NOTE [interrupting waits]): aborts the
  // transport and throws kAborted.
  [[noreturn]] void raise_interrupted(const WaitContext& ctx);
  // The flags of this transport's live buffers (NOTE [poisoned flags]).
  FlagRegistry& flag_registry() const { return *flags_; }
  // Whether `stream` can be used by ops right now (cuda: not capturing a graph, or capturing
  // one with a graph log; NOTE [graph capture] in comm/cuda/graph_log.h). Throws kUnsupported
  // with a reason if not.
  virtual void check_stream(cudaStream_t /*stream*/) const {}
  // Whether `stream` is capturing a CUDA graph (always false on the host transport).
  virtual bool capturing(cudaStream_t /*stream*/) const { return false; }

 protected:
  // Faults found asynchronously (cuda: a wait the watchdog timed out, or found satisfied by a
  // peer's poison) are recorded here by the transport when failed() or raise_if_failed()
  // looks (record_fault; first one wins).
  virtual void poll_async_faults() const {}
  // Called once, by the thread that recorded the first fault, after it has poisoned the
  // outgoing flags (cuda: the watchdog releases every pending wait). Must not throw.
  virtual void on_failed() const noexcept {}
  // Called by abort(); must only store atomics (NOTE [abort]).
  virtual void on_abort() noexcept {}
  void record_fault(ErrorKind kind, const std::string& message) const noexcept;
  // The shared registry, for the cuda watchdog's re-poisoning (NOTE [poisoned flags]).
  const std::shared_ptr<FlagRegistry>& flag_registry_ptr() const { return flags_; }

 private:
  // Records the faults that are found by looking: asynchronous ones, an abort and, with
  // `peers`, a peer's poison (not when a synchronous fault is being recorded: it comes first).
  void poll_faults(bool peers) const noexcept;

  std::shared_ptr<FlagRegistry> flags_;
  std::atomic<bool> abort_requested_{false};
  mutable std::atomic<bool> failed_fast_{false};
  // Mutable: poll_faults() records asynchronous faults from the const accessors.
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

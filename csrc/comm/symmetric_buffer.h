// A symmetric buffer: one region per rank of a group, every rank mapping every peer's region.
//
// Lifecycle (NOTE [rendezvous], driven by Python's bootstrap):
//   1. construct        local allocation (no communication)
//   2. local_handle()   bytes describing the local region -> exchanged by the bootstrap
//   3. connect(all)     COLLECTIVE: checks every rank asked for the same size, maps the peers
//   4. (bootstrap barrier) then finish_rendezvous(): names unlinked, the buffer is ready
//   5. destroy()        idempotent; waits for ops in flight on other threads, then unmaps
//                       peers and frees the local region (reverse order)
//
// Each rank's region has a data part (`bytes`) and a flag part (kFlagBytes: kMaxRanks x
// kNumSlots uint64). flag(owner, src, slot) lives in `owner`'s flags and is written only by
// rank `src`. Where the flags live is the transport's choice (NOTE [flags] in transport.h).
//
// NOTE [views outlive destroy]: regions are held by shared_ptr so that a view handed out of
// the buffer (a DLPack tensor) keeps its memory alive: destroy() drops the buffer's own
// references, and the memory goes when the last view does. A view's contents are only
// defined until the next op on the buffer (invariant 2: never save one for backward).
//
// NOTE [destroy while in use]: an op may be in progress on one thread (waiting for a peer on
// the host transport, or issuing on cuda) while another thread destroys the buffer or its
// communicator; freeing the memory then made the op's next read a segfault. So every op holds
// a Use of its buffer (run_op, and the bindings' views and copies), and destroy() refuses new
// Uses, waits until the ones in progress have left (an op leaves by its deadline, or within
// microseconds once the communicator is aborted: NOTE [abort] in fault.h), makes the device
// finish what the ops queued (Transport::quiesce: a drained op still writes into the peers'
// memory and flags) and only then unmaps and frees. destroy() from inside an op of the buffer
// on the same thread (a signal handler run by an interrupted wait, NOTE [interrupting waits])
// could never wait for itself: it raises kState instead. Verdict: destroy waits, never frees
// memory in use; abort() first to make it prompt.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/transport.h"
#include "common/tensor_ref.h"

namespace overlap::comm {

enum class FlagSlot : int {
  kData = 0,    // src -> owner: "my data for epoch e is in place"
  kAck = 1,     // src -> owner: "I entered op e: I no longer read anything of epochs < e"
  kOpEven = 2,  // src -> owner: the record of src's latest even-epoch op (NOTE [op records])
  kOpOdd = 3,   // ... and of its latest odd-epoch op; both host-written
};

// What an op record names (NOTE [op records] in op_protocol.cpp).
enum class OpCode : int {
  kAllGather = 1,
  kReduceScatter = 2,
  kBarrier = 3,
  kAllGatherGemm = 4,      // comm/overlap/ag_gemm.cpp
  kGemmReduceScatter = 5,  // comm/overlap/gemm_rs.cpp
  kBulkAllGather = 6,      // comm/overlap/bulk.cpp
  kBulkReduceScatter = 7,  // comm/overlap/bulk.cpp
};

class SymmetricBuffer : public std::enable_shared_from_this<SymmetricBuffer> {
 public:
  static constexpr int kMaxRanks = 64;
  static constexpr int kNumSlots = 4;
  // NOTE [size bounds]: the largest data region, 2^48 bytes (256 TiB, beyond any GPU's or
  // host's memory). Every size an op forms from it (a chunk times at most kMaxRanks ranks, an
  // offset plus a span, the host segment's flag page plus its data) then stays far below 2^64,
  // so no size check can be fooled by a wrap-around. Verdict: reject larger sizes at creation.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 48;
  // The longest deadline of a wait, in seconds (about 11.6 days). Deadlines are steady-clock
  // time points (int64 nanoseconds): an infinite or huge timeout would overflow them and
  // expire at once. overlap/env.py mirrors it (MAX_TIMEOUT_S).
  static constexpr double kMaxTimeoutS = 1e6;

  SymmetricBuffer(std::shared_ptr<Transport> transport, int rank, int size, std::size_t bytes,
                  const std::string& tag, double timeout_s);
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  std::string local_handle() const;
  void connect(const std::vector<std::string>& handles);
  void finish_rendezvous();
  // NOTE [destroy while in use]. Idempotent. Throws kState when called from inside an op of
  // this buffer on the calling thread.
  void destroy();

  // NOTE [destroy while in use]: held by every op for its whole run (run_op).
  class Use {
   public:
    // Throws kState once destroy() has begun (`what` names the caller).
    Use(SymmetricBuffer& buf, const char* what);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    SymmetricBuffer& buf_;
  };

  bool ready() const { return state_.load() == State::kReady; }
  bool destroyed() const { return state_.load() == State::kDestroyed; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t bytes() const { return bytes_; }
  // Device (or shared) memory this rank holds for its data region: bytes(), or more where the
  // transport rounds allocations up (LocalRegion::allocated_bytes).
  std::size_t allocated_bytes() const { return allocated_bytes_; }
  double timeout_s() const { return timeout_s_; }
  // Throws kConfig unless 0 < timeout_s <= kMaxTimeoutS (so NaN and infinity are refused).
  void set_timeout_s(double timeout_s);
  // NOTE [put split]: how many copies (lanes) carry one put to one peer; a tuning knob. On
  // 4xH200 one copy moves ~377 GB/s to one peer (32 MB). With serial puts, one copy was best
  // up to 32 MB; at 128-256 MB, pushes in one copy were sometimes 1.5x slower (in two runs of
  // benchmarks/baseline_collectives.py), pulls in one copy and pushes in two were not.
  static constexpr int kMaxPutSplit = 8;
  static constexpr int kDefaultPutSplit = 1;
  int put_split() const { return put_split_; }
  void set_put_split(int split);
  // NOTE [pull gather]: in an all-gather, peers' shards are pushed into our region by their
  // copy engines (false, the default) or pulled from their regions by ours (true).
  bool pull_gather() const { return pull_gather_; }
  void set_pull_gather(bool pull) { pull_gather_ = pull; }
  // NOTE [serial puts]: in an all-gather, the copies to (or from) the peers run one after
  // another on one set of put_split lanes, in ring order (true, the default), or at once on a
  // set of lanes per peer (false). A GPU's copy engines reach the same outgoing bandwidth to
  // one peer as to three at once (measured on H200: ~380 GB/s either way), and every lane
  // costs microseconds of fork, join and flag waits. On 4xH200 the best serial mode beat the
  // best parallel one at every size from 64 KB to 256 MB (e.g. 64 MB: 190 us against 272 us,
  // NCCL 190 us; benchmarks/baseline_collectives.py).
  bool serial_puts() const { return serial_puts_; }
  void set_serial_puts(bool serial) { serial_puts_ = serial; }
  // NOTE [sm puts]: `sm_percent` % of every all-gather put goes through an SM copy kernel of
  // `sm_blocks` blocks (on its own lane), the rest through the copy engines. 0 (the default)
  // keeps the all-gather off the SMs entirely.
  int sm_percent() const { return sm_percent_; }
  int sm_blocks() const { return sm_blocks_; }
  void set_sm_share(int percent, int blocks);
  Transport& transport() const { return *transport_; }

  // Start of the data region of `peer` (this rank's own when peer == rank()).
  char* data(int peer) const;
  // Shares ownership of `peer`'s memory (NOTE [views outlive destroy]).
  std::shared_ptr<const void> keep_alive(int peer) const;
  std::uint64_t* flag(int owner, int src, FlagSlot slot) const;

  // Throws kState unless the buffer is ready for ops; `op` names the caller.
  void check_ready(const char* op) const;
  // Throws kInvalidArgument unless `t` is contiguous and lives where this buffer's transport
  // can read it (host memory for host, a CUDA device for cuda).
  void check_tensor(const TensorRef& t, const char* what) const;
  // The epoch of the next op on this buffer; epochs only grow.
  std::uint64_t next_epoch() { return ++epoch_; }
  // The last epoch taken so far (0 before the first op).
  std::uint64_t epoch() const { return epoch_; }
  // Takes `count` epochs at once for a replay of a captured CUDA graph (NOTE [graph capture]
  // in comm/cuda/graph_log.h); returns the last epoch taken before.
  std::uint64_t take_epochs(std::uint64_t count) {
    const std::uint64_t before = epoch_;
    epoch_ += count;
    return before;
  }
  // Whether `p` is one of this buffer's flags (in any rank's region).
  bool owns_flag(const void* p) const;
  // Whether peers may have read this rank's region during the last op (pulls), so that the
  // next op must hear every peer's acknowledgement before it writes its own region (NOTE
  // [deferred acknowledgements] in op_protocol.h). True before the first op.
  bool peers_read_last_op() const { return peers_read_last_op_; }
  void set_peers_read_last_op(bool read) { peers_read_last_op_ = read; }
  // The last epoch whose acknowledgements begin_op waited for, all at once (0: none yet).
  std::uint64_t acked_epoch() const { return acked_epoch_; }
  void set_acked_epoch(std::uint64_t epoch) { acked_epoch_ = epoch; }

 private:
  enum class State { kCreated, kConnected, kReady, kDestroyed };
  void check_peer(int peer) const;
  // Frees everything once no op uses the buffer (destroy(), the destructor). Never throws.
  void release() noexcept;

  std::shared_ptr<Transport> transport_;
  int rank_;
  int size_;
  std::size_t bytes_;
  std::size_t allocated_bytes_ = 0;
  double timeout_s_;
  int put_split_ = kDefaultPutSplit;
  bool pull_gather_ = false;
  bool serial_puts_ = true;
  int sm_percent_ = 0;
  int sm_blocks_ = 0;
  std::atomic<State> state_{State::kCreated};
  // NOTE [destroy while in use]: the threads inside an op of this buffer, and whether
  // destroy() has begun.
  std::mutex use_mu_;
  std::condition_variable use_cv_;
  std::vector<std::thread::id> users_;
  bool closing_ = false;
  bool registered_ = false;  // its flags are in the transport's FlagRegistry
  std::uint64_t epoch_ = 0;
  bool peers_read_last_op_ = true;
  std::uint64_t acked_epoch_ = 0;
  std::shared_ptr<LocalRegion> local_;
  std::vector<std::shared_ptr<PeerMapping>> peers_;  // indexed by rank; null for self
};

}  // namespace overlap::comm

// A symmetric buffer: one region per rank of a group, every rank mapping every peer's region.
// Lifecycle, driven by Python's bootstrap: construct -> local_handle() (exchanged) ->
// connect(all) (COLLECTIVE) -> bootstrap barrier -> finish_rendezvous() -> destroy().
//
// NOTE [views outlive destroy]: regions are held by shared_ptr, so a view handed out of the
// buffer (a DLPack tensor) keeps its memory alive after destroy(). Its contents are only defined
// until the next op on the buffer (invariant 2: never save one for backward).
//
// NOTE [destroy while in use]: freeing a buffer while another thread's op still reads it was a
// segfault. So every op holds a Use (run_op, the bindings' views and copies), and destroy()
// refuses new Uses, waits for those in progress (bounded by their deadline, or prompt after
// NOTE [abort]), quiesces the device (drained ops still write to peers) and only then frees.
// destroy() from inside an op on the same thread (a signal handler) raises kState. Verdict:
// destroy waits, never frees memory in use.
//
// NOTE [buffer windows]: a window is a SymmetricBuffer over bytes [offset, offset + bytes) of
// another one's regions (its root), made after the root's rendezvous. It shares the root's
// memory, flags, epochs, acknowledgement state, use count and timeout: an op on a window takes the
// root's next epoch and acknowledges every earlier op on the root or on any of its windows, so
// the ops of all windows of one root form one op sequence and buffer reuse (invariant 8) holds
// across them as it does on one buffer. Its own are its size (what ops check their layouts
// against), its data offset and its copy settings (put_split, pull_gather, ...). It owns no memory:
// allocated_bytes() is 0 and destroy() does nothing; the root frees the memory, waiting for the
// ops on its windows too. What for: ops whose contents must outlive one another's (a bulk
// all-gather's gathered input, read by the GEMM beside the next bulk reduce-scatter) run on
// disjoint windows of one allocation, and ops whose contents never outlive their call share
// bytes, so a layer's userbuffers are one allocation of the largest step's need (NOTE
// [userbuffer memory] in overlap/ub/handle.py). Verdict: windows share the op sequence, never
// split it.
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
  // NOTE [size bounds]: at most 2^48 bytes, so no size an op forms from it (chunk x ranks,
  // offset + span) can wrap around 2^64. Verdict: reject larger sizes at creation.
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 48;
  // A larger timeout would overflow int64 ns deadlines (overlap/env.py: MAX_TIMEOUT_S).
  static constexpr double kMaxTimeoutS = 1e6;

  SymmetricBuffer(std::shared_ptr<Transport> transport, int rank, int size, std::size_t bytes,
                  const std::string& tag, double timeout_s);
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  // NOTE [buffer windows]: a window of `parent` (a root or a window) over bytes
  // [offset, offset + bytes) of its range; offset a multiple of kWindowAlign. Throws kState
  // unless `parent` is ready, kInvalidArgument for a range outside it.
  static constexpr std::size_t kWindowAlign = 256;
  static std::shared_ptr<SymmetricBuffer> window(const std::shared_ptr<SymmetricBuffer>& parent,
                                                 std::size_t offset, std::size_t bytes);
  bool is_window() const { return root_ != nullptr; }
  // Byte offset of this buffer's data in its root's regions (0 for a root).
  std::size_t window_offset() const { return offset_; }
  // The buffer that owns the memory, flags and epochs (itself unless a window).
  SymmetricBuffer& root() { return root_ ? *root_ : *this; }
  const SymmetricBuffer& root() const { return root_ ? *root_ : *this; }

  std::string local_handle() const;
  void connect(const std::vector<std::string>& handles);
  void finish_rendezvous();
  // NOTE [destroy while in use]. Idempotent.
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

  bool ready() const { return root().state_.load() == State::kReady; }
  bool destroyed() const { return root().state_.load() == State::kDestroyed; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t bytes() const { return bytes_; }
  // LocalRegion::allocated_bytes; 0 for a window (NOTE [buffer windows]).
  std::size_t allocated_bytes() const { return allocated_bytes_; }
  // A window's is its root's: one deadline for one op sequence (NOTE [buffer windows]).
  double timeout_s() const { return root().timeout_s_; }
  // Throws kConfig unless 0 < timeout_s <= kMaxTimeoutS (so NaN and infinity are refused).
  void set_timeout_s(double timeout_s);
  // NOTE [put split]: how many copies (lanes) carry one put to one peer. Verdict: one by
  // default. Measured: docs/performance-log.md [serial puts].
  static constexpr int kMaxPutSplit = 8;
  static constexpr int kDefaultPutSplit = 1;
  int put_split() const { return put_split_; }
  void set_put_split(int split);
  // NOTE [pull gather]: all-gather pulls the peers' shards instead of receiving pushes.
  bool pull_gather() const { return pull_gather_; }
  void set_pull_gather(bool pull) { pull_gather_ = pull; }
  // NOTE [serial puts]: the copies to the peers run one after another on one set of lanes, in
  // ring order (default), or at once on a set per peer. A GPU's copy engines send as fast to
  // one peer as to all, and every lane costs fork, join and flag waits. Verdict: serial.
  // Measured: docs/performance-log.md [serial puts].
  bool serial_puts() const { return serial_puts_; }
  void set_serial_puts(bool serial) { serial_puts_ = serial; }
  // NOTE [sm puts]: `sm_percent` % of every all-gather put goes through an SM copy kernel of
  // `sm_blocks` blocks; 0 (the default) keeps the all-gather off the SMs.
  int sm_percent() const { return sm_percent_; }
  int sm_blocks() const { return sm_blocks_; }
  void set_sm_share(int percent, int blocks);
  Transport& transport() const { return *transport_; }

  // Start of the data region of `peer` (this rank's own when peer == rank()).
  char* data(int peer) const;
  // Shares ownership of `peer`'s memory (NOTE [views outlive destroy]).
  std::shared_ptr<const void> keep_alive(int peer) const;
  std::uint64_t* flag(int owner, int src, FlagSlot slot) const;  // in `owner`'s, written by `src`
  // Local flag `index` of this rank's region (NOTE [local flags] in comm/transport.h): written
  // and read by this rank only; a window's are its root's.
  std::uint64_t* local_flag(int index) const;

  // Throws kState unless the buffer is ready for ops; `op` names the caller.
  void check_ready(const char* op) const;
  // Throws kInvalidArgument unless `t` is contiguous and where the transport can read it.
  void check_tensor(const TensorRef& t, const char* what) const;
  // The epoch of the next op on this buffer; epochs only grow.
  // A window's are its root's (NOTE [buffer windows]), as is the rest of the op state below.
  std::uint64_t next_epoch() { return ++root().epoch_; }
  // The last epoch taken so far (0 before the first op).
  std::uint64_t epoch() const { return root().epoch_; }
  // Takes `count` epochs for a graph replay (NOTE [graph capture]); returns the last before.
  std::uint64_t take_epochs(std::uint64_t count) {
    const std::uint64_t before = root().epoch_;
    root().epoch_ += count;
    return before;
  }
  // Whether `p` is one of this buffer's flags (in any rank's region).
  bool owns_flag(const void* p) const;
  // Whether peers may have read our region in the last op (NOTE [deferred acknowledgements]).
  bool peers_read_last_op() const { return root().peers_read_last_op_; }
  void set_peers_read_last_op(bool read) { root().peers_read_last_op_ = read; }
  // The last epoch whose acknowledgements begin_op waited for, all at once (0: none yet).
  std::uint64_t acked_epoch() const { return root().acked_epoch_; }
  void set_acked_epoch(std::uint64_t epoch) { root().acked_epoch_ = epoch; }

 private:
  enum class State { kCreated, kConnected, kReady, kDestroyed };
  // A window (NOTE [buffer windows]); `root` a root, `offset` from its start.
  SymmetricBuffer(std::shared_ptr<SymmetricBuffer> root, std::size_t offset, std::size_t bytes);
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
  // NOTE [destroy while in use]
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
  std::shared_ptr<SymmetricBuffer> root_;            // NOTE [buffer windows]: null for a root
  std::size_t offset_ = 0;                           // of a window's data in its root's regions
};

}  // namespace overlap::comm

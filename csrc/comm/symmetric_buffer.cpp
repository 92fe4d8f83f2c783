#include "comm/symmetric_buffer.h"

#include <algorithm>
#include <sstream>

#include "common/errors.h"

namespace overlap::comm {

namespace {
const char* kEnvelope = "overlap-symbuf-v1";
}  // namespace

static_assert(SymmetricBuffer::kMaxRanks * SymmetricBuffer::kNumSlots * sizeof(std::uint64_t) <=
                  kCookieOffset,
              "flag slots must fit in the flag area, before the cookie (NOTE [segment cookies])");

SymmetricBuffer::SymmetricBuffer(std::shared_ptr<Transport> transport, int rank, int size,
                                 std::size_t bytes, const std::string& tag, double timeout_s)
    : transport_(std::move(transport)), rank_(rank), size_(size), bytes_(bytes) {
  OVERLAP_CHECK_ARG(transport_ != nullptr, "symmetric buffer needs a transport");
  OVERLAP_CHECK(size >= 1 && size <= kMaxRanks, kConfig,
                "group size " << size << " is outside [1, " << kMaxRanks << "]");
  OVERLAP_CHECK(rank >= 0 && rank < size, kConfig,
                "rank " << rank << " is outside a group of size " << size);
  OVERLAP_CHECK_ARG(bytes > 0 && bytes <= kMaxBytes, "symmetric buffer size must be in [1, "
                                                         << kMaxBytes << "] bytes, got " << bytes);
  set_timeout_s(timeout_s);
  local_ = transport_->allocate(bytes, tag);
  allocated_bytes_ = local_->allocated_bytes();
  peers_.resize(size);
}

SymmetricBuffer::SymmetricBuffer(std::shared_ptr<SymmetricBuffer> root, std::size_t offset,
                                 std::size_t bytes)
    : transport_(root->transport_),
      rank_(root->rank_),
      size_(root->size_),
      bytes_(bytes),
      timeout_s_(root->timeout_s_),
      put_split_(root->put_split_),
      pull_gather_(root->pull_gather_),
      serial_puts_(root->serial_puts_),
      sm_percent_(root->sm_percent_),
      sm_blocks_(root->sm_blocks_),
      root_(std::move(root)),
      offset_(offset) {
  // Its own lifecycle is over: local_handle/connect/finish_rendezvous refuse a window, and
  // whether it is usable is its root's state (ready(), destroyed()).
  state_ = State::kReady;
}

std::shared_ptr<SymmetricBuffer> SymmetricBuffer::window(
    const std::shared_ptr<SymmetricBuffer>& parent, std::size_t offset, std::size_t bytes) {
  OVERLAP_CHECK_ARG(parent != nullptr, "window() needs a buffer");
  parent->check_ready("window()");
  OVERLAP_CHECK_ARG(offset % kWindowAlign == 0,
                    "window offset " << offset << " must be a multiple of " << kWindowAlign);
  OVERLAP_CHECK_ARG(bytes > 0 && offset <= parent->bytes_ && bytes <= parent->bytes_ - offset,
                    "window [" << offset << ", " << offset + bytes << ") must be a non-empty "
                               << "range inside the buffer's " << parent->bytes_ << " bytes");
  std::shared_ptr<SymmetricBuffer> root = parent->root_ ? parent->root_ : parent;
  // Not make_shared: the window constructor is private.
  return std::shared_ptr<SymmetricBuffer>(
      new SymmetricBuffer(std::move(root), parent->offset_ + offset, bytes));
}

SymmetricBuffer::~SymmetricBuffer() {
  release();  // no op can be in progress: every op holds a reference to the buffer
}

void SymmetricBuffer::set_timeout_s(double timeout_s) {
  OVERLAP_CHECK(timeout_s > 0 && timeout_s <= kMaxTimeoutS, kConfig,
                "timeout must be > 0 and <= " << kMaxTimeoutS << " s (finite), got " << timeout_s);
  root().timeout_s_ = timeout_s;
}

void SymmetricBuffer::set_put_split(int split) {
  OVERLAP_CHECK(split >= 1 && split <= kMaxPutSplit, kConfig,
                "put_split must be in [1, " << kMaxPutSplit << "], got " << split);
  put_split_ = split;
}

void SymmetricBuffer::set_sm_share(int percent, int blocks) {
  OVERLAP_CHECK(percent >= 0 && percent <= 100, kConfig,
                "sm_percent must be in [0, 100], got " << percent);
  OVERLAP_CHECK(percent == 0 || (blocks >= 1 && blocks <= 1024), kConfig,
                "sm_blocks must be in [1, 1024] when sm_percent > 0, got " << blocks);
  sm_percent_ = percent;
  sm_blocks_ = percent == 0 ? 0 : blocks;
}

std::string SymmetricBuffer::local_handle() const {
  OVERLAP_CHECK(state_ == State::kCreated, kState, "local_handle() is only valid before connect()");
  std::ostringstream oss;
  oss << kEnvelope << ' ' << rank_ << ' ' << size_ << ' ' << bytes_ << ' '
      << local_->export_handle();
  return oss.str();
}

void SymmetricBuffer::connect(const std::vector<std::string>& handles) {
  OVERLAP_CHECK(state_ == State::kCreated, kState, "connect() called twice or after destroy()");
  OVERLAP_CHECK_EQ(static_cast<int>(handles.size()), size_, kBootstrap,
                   "connect() needs one handle per rank");
  // Parse every envelope first, so that every rank detects a mismatch before mapping anything
  // and raises the same error.
  std::vector<std::string> inner(size_);
  std::ostringstream sizes;
  bool sizes_differ = false;
  for (int r = 0; r < size_; ++r) {
    std::istringstream iss(handles[r]);
    std::string envelope;
    int their_rank = -1, their_size = -1;
    std::size_t their_bytes = 0;
    iss >> envelope >> their_rank >> their_size >> their_bytes >> std::ws;
    std::getline(iss, inner[r]);
    OVERLAP_CHECK(envelope == kEnvelope && their_rank == r && their_size == size_, kBootstrap,
                  "rank " << r << " sent an unexpected buffer handle '" << handles[r]
                          << "': do all ranks create their buffers in the same order?");
    sizes << (r ? ", " : "") << their_bytes;
    sizes_differ |= their_bytes != bytes_;
  }
  OVERLAP_CHECK(!sizes_differ, kBootstrap,
                "ranks asked for symmetric buffers of different sizes (bytes by rank: "
                    << sizes.str() << "); every rank must pass the same size");
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) peers_[r] = transport_->map_peer(inner[r]);
  }
  state_ = State::kConnected;
}

void SymmetricBuffer::finish_rendezvous() {
  OVERLAP_CHECK(state_ == State::kConnected, kState, "finish_rendezvous() needs connect() first");
  local_->on_all_peers_mapped();
  // NOTE [poisoned flags]: ours in the peers' regions, and theirs in ours.
  std::vector<std::uint64_t*> outgoing;
  std::vector<std::pair<int, const std::uint64_t*>> incoming;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    for (FlagSlot slot : {FlagSlot::kAck, FlagSlot::kData}) {
      outgoing.push_back(flag(peer, rank_, slot));
      incoming.emplace_back(peer, flag(rank_, peer, slot));
    }
  }
  transport_->flag_registry().add(this, std::move(outgoing), std::move(incoming));
  registered_ = true;
  state_ = State::kReady;
}

// A window's ops count as its root's (NOTE [buffer windows]): the root's destroy waits for them.
SymmetricBuffer::Use::Use(SymmetricBuffer& buf, const char* what) : buf_(buf.root()) {
  SymmetricBuffer& root = buf_;
  std::lock_guard<std::mutex> lock(root.use_mu_);
  OVERLAP_CHECK(!root.closing_, kState, what << ": the symmetric buffer is destroyed");
  root.users_.push_back(std::this_thread::get_id());
}

SymmetricBuffer::Use::~Use() {
  std::lock_guard<std::mutex> lock(buf_.use_mu_);
  const auto me = std::find(buf_.users_.begin(), buf_.users_.end(), std::this_thread::get_id());
  if (me != buf_.users_.end()) buf_.users_.erase(me);
  buf_.use_cv_.notify_all();
}

void SymmetricBuffer::destroy() {
  if (root_) return;  // NOTE [buffer windows]: the root owns the memory
  std::unique_lock<std::mutex> lock(use_mu_);
  const bool mine =
      std::find(users_.begin(), users_.end(), std::this_thread::get_id()) != users_.end();
  OVERLAP_CHECK(
      !mine, kState,
      "destroy() of a symmetric buffer from inside an op on the same buffer and thread "
      "(e.g. a signal handler run while the op waited) would wait for itself; call "
      "the communicator's abort method there instead, and destroy once the op has raised");
  if (closing_) {  // another thread destroys it: wait until it has
    use_cv_.wait(lock, [this] { return state_.load() == State::kDestroyed; });
    return;
  }
  closing_ = true;
  // Ops in progress on other threads leave by their deadline, or at once after an abort.
  use_cv_.wait(lock, [this] { return users_.empty(); });
  lock.unlock();
  release();
  lock.lock();
  use_cv_.notify_all();
}

void SymmetricBuffer::release() noexcept {
  if (state_.load() == State::kDestroyed) return;
  if (root_) {  // NOTE [buffer windows]: nothing of its own to free
    state_ = State::kDestroyed;
    return;
  }
  try {
    // NOTE [destroy while in use]: what the ops queued finishes before the memory goes.
    if (local_ != nullptr) transport_->quiesce();
    if (registered_) {
      // NOTE [poisoned flags]: a failed (or aborted) transport poisons this buffer's flags
      // before they go, even where no thread has looked since (failed() records the fault).
      if (transport_->failed()) transport_->flag_registry().poison_outgoing(this);
      transport_->flag_registry().remove(this);
      registered_ = false;
    }
    transport_->forget_ops(this);
  } catch (const std::exception& e) {
    OVERLAP_WARN("destroying a symmetric buffer: " << e.what());
  }
  state_ = State::kDestroyed;
  // Reverse order of acquisition: peer mappings, then the local region.
  try {
    for (auto it = peers_.rbegin(); it != peers_.rend(); ++it) it->reset();
    local_.reset();
  } catch (const std::exception& e) {
    OVERLAP_WARN("destroying a symmetric buffer failed: " << e.what());
  }
}

void SymmetricBuffer::check_ready(const char* op) const {
  const State state = root().state_.load();
  if (state == State::kReady) return;
  OVERLAP_THROW(kState, op << ": the symmetric buffer is "
                           << (state == State::kDestroyed ? "destroyed"
                                                          : "not connected yet (rendezvous "
                                                            "incomplete)"));
}

void SymmetricBuffer::check_tensor(const TensorRef& t, const char* what) const {
  check_contiguous(t, what);
  const int device = transport_->device();
  OVERLAP_CHECK_ARG(t.device == device,
                    what << " is " << t.describe() << ", but the buffer uses the "
                         << transport_name(transport_->kind()) << " transport on "
                         << (device < 0 ? std::string("the cpu") : "cuda:" + std::to_string(device))
                         << "; move the tensor there");
}

void SymmetricBuffer::check_peer(int peer) const {
  if (root_) {
    root_->check_peer(peer);
    return;
  }
  OVERLAP_CHECK(peer >= 0 && peer < size_, kInvalidArgument,
                "peer " << peer << " is outside a group of size " << size_);
  OVERLAP_CHECK(peer == rank_ ? local_ != nullptr : peers_[peer] != nullptr, kState,
                "peer " << peer << " is not mapped (buffer not connected, or destroyed)");
}

char* SymmetricBuffer::data(int peer) const {
  if (root_) return root_->data(peer) + offset_;
  check_peer(peer);
  return static_cast<char*>(peer == rank_ ? local_->data() : peers_[peer]->data());
}

std::shared_ptr<const void> SymmetricBuffer::keep_alive(int peer) const {
  if (root_) return root_->keep_alive(peer);
  check_peer(peer);
  if (peer == rank_) return local_;
  return peers_[peer];
}

std::uint64_t* SymmetricBuffer::flag(int owner, int src, FlagSlot slot) const {
  if (root_) return root_->flag(owner, src, slot);
  check_peer(owner);
  std::uint64_t* flags = owner == rank_ ? local_->flags() : peers_[owner]->flags();
  return flags + src * kNumSlots + static_cast<int>(slot);
}

std::uint64_t* SymmetricBuffer::local_flag(int index) const {
  if (root_) return root_->local_flag(index);
  constexpr int kCount = static_cast<int>(kLocalFlagBytes / sizeof(std::uint64_t));
  OVERLAP_CHECK(index >= 0 && index < kCount && local_, kInternal,
                "local flag " << index << " of a buffer with " << kCount << " (or no region)");
  return local_->local_flags() + index;
}

bool SymmetricBuffer::owns_flag(const void* p) const {
  if (root_) return root_->owns_flag(p);
  const auto* c = static_cast<const char*>(p);
  for (int owner = 0; owner < size_; ++owner) {
    const std::uint64_t* flags = owner == rank_
                                     ? (local_ ? local_->flags() : nullptr)
                                     : (peers_[owner] ? peers_[owner]->flags() : nullptr);
    const auto* lo = reinterpret_cast<const char*>(flags);
    if (flags != nullptr && c >= lo && c < lo + kFlagBytes) return true;
  }
  return false;
}

}  // namespace overlap::comm

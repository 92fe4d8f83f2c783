// Per-device GEMM resources: the cuBLASLt handle, a stream-ordered scratch pool for
// workspaces, and the algorithm-heuristics cache. CUDA builds only.
//
// NOTE [gemm workspace]: overlap runs GEMMs on several compute streams at once (one per
// chunk of a ring). A single workspace per device would be shared by GEMMs running
// concurrently on different streams, and cuBLASLt's split-K kernels would corrupt each
// other's partial sums. So every GEMM that needs scratch draws it (its algorithm's workspace
// and the block-scale staging of NOTE [cublaslt block scale layout]) from the context's own
// memory pool with cudaMallocAsync on its stream and returns it with cudaFreeAsync right
// after enqueueing: stream order makes the reuse safe, the pool keeps the memory reserved
// (release threshold = max), no call synchronises the host, and concurrent streams get
// distinct blocks. The pool is private, so torch's caching allocator and the device's
// default pool are untouched. The heuristic is offered up to 32 MiB, and a call draws what
// its algorithm needs (the cache keeps the heuristic's workspaceSize beside the algorithm),
// so a GEMM whose algorithm needs none allocates nothing: the pair of pool calls cost the
// host 1.9 us a GEMM on one stream and 2.9-5.8 us on GEMMs alternating over 2-4 streams, as
// an op's lanes do, beside cublasLtMatmul's own 6 us (4xH200, performance log [gemm
// workspace]). Verdict: scratch per call, sized by the algorithm.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "gemm/gemm.h"

namespace overlap::gemm {

// Everything that decides which cuBLASLt algorithm is valid and best (NOTE [gemm cache key]
// in cublaslt_gemm.cpp lists the fields).
constexpr std::size_t kAlgoKeyFields = 32;
using AlgoKey = std::array<std::int64_t, kAlgoKeyFields>;

struct AlgoKeyHash {
  std::size_t operator()(const AlgoKey& key) const noexcept;
};

// RAII owner of a cuBLASLt handle.
class LtHandle {
 public:
  LtHandle();
  ~LtHandle();
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// RAII owner of a private device memory pool. keep_reserved: it keeps what it reserved
// (release threshold = max); otherwise it returns freed memory to the device at the next
// synchronisation (threshold 0).
class MemPool {
 public:
  MemPool(int device, bool keep_reserved);
  ~MemPool();
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;
  cudaMemPool_t get() const { return pool_; }

 private:
  cudaMemPool_t pool_ = nullptr;
};

// RAII owner of a non-blocking stream of the library's own (the tuning stream).
class LtStream {
 public:
  explicit LtStream(int device);
  ~LtStream();
  LtStream(const LtStream&) = delete;
  LtStream& operator=(const LtStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// One cached choice.
struct AlgoEntry {
  cublasLtMatmulAlgo_t algo = {};
  // The workspace the algorithm needs (the heuristic's workspaceSize for it; NOTE [gemm
  // workspace]): a call draws this much, none when it is 0.
  std::size_t workspace = 0;
  // No further tuning for this key: it was tuned, or tuning it is impossible for good (one
  // candidate, no scratch memory). Unsettled entries (heuristic's first, cached while tuning
  // was off or the stream was capturing) are tuned by the next GEMM that may tune.
  bool settled = false;
  GemmTuneRecord record;  // settled entries: what tuning measured
};

// What tuning needs beyond the handle (NOTE [gemm autotune]): a private stream, so that timing
// never waits on (or writes) the caller's work, and a pool that returns its memory.
struct TuneResources {
  explicit TuneResources(int device) : stream(device), pool(device, /*keep_reserved=*/false) {}
  // Destroyed in reverse order: the pool, then the stream.
  LtStream stream;
  MemPool pool;
};

class GemmContext {
 public:
  explicit GemmContext(int device);
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  int device() const { return device_; }
  const GemmTarget& target() const { return target_; }
  cublasLtHandle_t handle() const { return handle_.get(); }
  cudaMemPool_t pool() const { return pool_.get(); }

  // The cached algorithm for `key`, its workspace bytes and whether it is settled. A settled
  // entry found is counted as a hit (the hot path takes the mutex once); anything else counts
  // nothing.
  bool find_algo(const AlgoKey& key, cublasLtMatmulAlgo_t* algo, std::size_t* workspace,
                 bool* settled);
  // The algorithm, workspace bytes and tuning record of a settled key (false: absent or
  // unsettled); counts nothing.
  bool find_settled(const AlgoKey& key, cublasLtMatmulAlgo_t* algo, std::size_t* workspace,
                    GemmTuneRecord* record) const;
  // Inserts or replaces; a settled entry is never replaced by an unsettled one.
  void insert_algo(const AlgoKey& key, AlgoEntry entry);
  void count_lookup(bool hit);
  GemmCacheStats stats() const;
  void clear_cache();

  // NOTE [gemm autotune]: one tuning at a time per device (timings of two tunings running at
  // once would disturb each other). Hold it while using tune_resources().
  std::mutex& tune_mutex() { return tune_mutex_; }
  TuneResources& tune_resources();  // created on first use; caller holds tune_mutex()

 private:
  int device_;
  GemmTarget target_;
  // Destroyed in reverse order: the tuning resources, the pool, then the handle.
  LtHandle handle_;
  MemPool pool_;
  mutable std::mutex mutex_;  // guards the cache and its counters (never held while tuning)
  std::unordered_map<AlgoKey, AlgoEntry, AlgoKeyHash> cache_;
  std::int64_t hits_ = 0;
  std::int64_t misses_ = 0;
  std::mutex tune_mutex_;
  std::unique_ptr<TuneResources> tune_;
};

// The context of `device`, created on first use. Shared ownership: a GEMM in progress keeps
// its context alive even if gemm_release_resources() runs on another thread.
std::shared_ptr<GemmContext> gemm_context(int device);

// Stream-ordered scratch memory from a context's pool, freed (stream-ordered) on destruction.
class ScratchBuffer {
 public:
  ScratchBuffer(cudaMemPool_t pool, std::size_t bytes, cudaStream_t stream);
  // nullptr when the pool cannot provide the memory (cudaErrorMemoryAllocation, cleared);
  // other errors throw.
  static std::unique_ptr<ScratchBuffer> try_create(cudaMemPool_t pool, std::size_t bytes,
                                                   cudaStream_t stream);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  char* data() const { return static_cast<char*>(ptr_); }

 private:
  explicit ScratchBuffer(cudaStream_t stream) : stream_(stream) {}
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace overlap::gemm

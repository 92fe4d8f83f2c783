#include "gemm/cuda/gemm_context.h"

#include <limits>
#include <map>
#include <utility>

#include "common/cuda/cuda_check.h"
#include "common/cuda/device_guard.h"
#include "common/errors.h"
#include "common/lifecycle.h"

namespace overlap::gemm {

std::size_t AlgoKeyHash::operator()(const AlgoKey& key) const noexcept {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
  for (std::int64_t v : key) {
    h ^= static_cast<std::uint64_t>(v);
    h *= 1099511628211ull;
  }
  return static_cast<std::size_t>(h);
}

namespace {

// The target facts of `device`; throws kUnsupported when it lacks memory pools.
GemmTarget device_target(int device) {
  GemmTarget t;
  t.host = false;
  OVERLAP_CHECK_CUDA(
      cudaDeviceGetAttribute(&t.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  OVERLAP_CHECK_CUDA(
      cudaDeviceGetAttribute(&t.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  OVERLAP_CHECK_CUDA(cudaDeviceGetAttribute(&t.sm_count, cudaDevAttrMultiProcessorCount, device));
  int pools_supported = 0;
  OVERLAP_CHECK_CUDA(
      cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device));
  OVERLAP_CHECK(pools_supported != 0, kUnsupported,
                "gemm: device " << device
                                << " has no stream-ordered memory pools, which the GEMM "
                                   "workspaces need (NOTE [gemm workspace])");
  return t;
}

}  // namespace

LtHandle::LtHandle() {
  OVERLAP_CHECK_CUBLAS(cublasLtCreate(&handle_));
}

LtHandle::~LtHandle() {
  // NOTE [finalizing]: after interpreter shutdown the runtime may be gone; the OS reclaims.
  if (handle_ == nullptr || process_finalizing()) return;
  const cublasStatus_t st = cublasLtDestroy(handle_);
  if (st != CUBLAS_STATUS_SUCCESS) {
    OVERLAP_WARN(
        "gemm: cublasLtDestroy failed during cleanup: " << detail::cublas_status_string(st));
  }
}

MemPool::MemPool(int device, bool keep_reserved) {
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  OVERLAP_CHECK_CUDA(cudaMemPoolCreate(&pool_, &props));
  std::uint64_t keep = keep_reserved ? std::numeric_limits<std::uint64_t>::max() : 0;
  const cudaError_t err = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
  if (err != cudaSuccess) {
    OVERLAP_WARN_CUDA(cudaMemPoolDestroy(pool_));  // the destructor will not run
    OVERLAP_CHECK_CUDA(err);
  }
}

MemPool::~MemPool() {
  if (pool_ == nullptr || process_finalizing()) return;
  // Destroying a pool with blocks still in flight is deferred by the driver until they are
  // freed, so this never frees memory that a queued GEMM uses.
  const cudaError_t err = cudaMemPoolDestroy(pool_);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    OVERLAP_WARN(
        "gemm: cudaMemPoolDestroy failed during cleanup: " << detail::cuda_error_string(err));
  }
}

LtStream::LtStream(int device) {
  DeviceGuard guard(device);
  // Non-blocking: never synchronises with the legacy default stream, whatever the caller's
  // stream is.
  OVERLAP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

LtStream::~LtStream() {
  if (stream_ == nullptr || process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaStreamDestroy(stream_));
}

GemmContext::GemmContext(int device)
    : device_(device),
      target_(device_target(device)),
      handle_(),
      pool_(device, /*keep_reserved=*/true) {}

bool GemmContext::find_algo(const AlgoKey& key, cublasLtMatmulAlgo_t* algo, std::size_t* workspace,
                            bool* settled) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it == cache_.end()) return false;
  *algo = it->second.algo;
  *workspace = it->second.workspace;
  *settled = it->second.settled;
  if (*settled) ++hits_;
  return true;
}

bool GemmContext::find_settled(const AlgoKey& key, cublasLtMatmulAlgo_t* algo,
                               std::size_t* workspace, GemmTuneRecord* record) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it == cache_.end() || !it->second.settled) return false;
  *algo = it->second.algo;
  *workspace = it->second.workspace;
  *record = it->second.record;
  return true;
}

void GemmContext::insert_algo(const AlgoKey& key, AlgoEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    cache_.emplace(key, std::move(entry));
  } else if (entry.settled || !it->second.settled) {
    it->second = std::move(entry);
  }
}

void GemmContext::count_lookup(bool hit) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(hit ? hits_ : misses_);
}

GemmCacheStats GemmContext::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::int64_t tuned = 0;
  for (const auto& [key, entry] : cache_) {
    if (entry.settled && entry.record.status == TuneStatus::kTuned) ++tuned;
  }
  return {hits_, misses_, static_cast<std::int64_t>(cache_.size()), tuned};
}

TuneResources& GemmContext::tune_resources() {
  if (!tune_) {
    DeviceGuard guard(device_);
    tune_ = std::make_unique<TuneResources>(device_);
  }
  return *tune_;
}

void GemmContext::clear_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.clear();
  hits_ = 0;
  misses_ = 0;
}

namespace {

struct Registry {
  std::mutex mutex;
  std::map<int, std::shared_ptr<GemmContext>> contexts;
};

Registry& registry() {
  static Registry r;  // destroyed at exit; each context skips driver calls when finalizing
  return r;
}

}  // namespace

GemmTarget gemm_target(int device) {
  if (device < 0) return GemmTarget{};
  return gemm_context(device)->target();
}

std::shared_ptr<GemmContext> gemm_context(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.contexts.find(device);
  if (it != r.contexts.end()) return it->second;
  DeviceGuard guard(device);  // the handle and the pool belong to this device
  auto ctx = std::make_shared<GemmContext>(device);
  r.contexts.emplace(device, ctx);
  return ctx;
}

GemmCacheStats gemm_cache_stats(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.contexts.find(device);
  return it == r.contexts.end() ? GemmCacheStats{} : it->second->stats();
}

void gemm_clear_cache() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& [device, ctx] : r.contexts) ctx->clear_cache();
}

void gemm_release_resources() {
  std::map<int, std::shared_ptr<GemmContext>> released;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    released.swap(r.contexts);
  }
  // Queued GEMMs do not need the handle, but finishing them first makes the release a clean
  // point (memory returned, errors surfaced here rather than later).
  for (auto& [device, ctx] : released) {
    DeviceGuard guard(device);
    OVERLAP_CHECK_CUDA(cudaDeviceSynchronize());
  }
  // Contexts still used by a GEMM on another thread live until that GEMM returns.
}

ScratchBuffer::ScratchBuffer(cudaMemPool_t pool, std::size_t bytes, cudaStream_t stream)
    : stream_(stream) {
  OVERLAP_CHECK_CUDA(cudaMallocFromPoolAsync(&ptr_, bytes, pool, stream));
}

std::unique_ptr<ScratchBuffer> ScratchBuffer::try_create(cudaMemPool_t pool, std::size_t bytes,
                                                         cudaStream_t stream) {
  std::unique_ptr<ScratchBuffer> s(new ScratchBuffer(stream));
  const cudaError_t err = cudaMallocFromPoolAsync(&s->ptr_, bytes, pool, stream);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so that no later check reports it
    s->ptr_ = nullptr;
    return nullptr;
  }
  OVERLAP_CHECK_CUDA(err);
  return s;
}

ScratchBuffer::~ScratchBuffer() {
  if (ptr_ == nullptr || process_finalizing()) return;
  OVERLAP_WARN_CUDA(cudaFreeAsync(ptr_, stream_));
}

}  // namespace overlap::gemm

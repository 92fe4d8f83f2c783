// The transport interface: everything an overlap algorithm needs from the memory system.
//
// NOTE [one algorithm, two transports]: collectives and overlap schedules are written once
// against this interface. The `host` transport (POSIX shared memory, memcpy, atomic flags)
// executes in program order and is what CI runs; the `cuda` transport (CUDA IPC, copy-engine
// puts, stream-ordered flags) is the product. Every call takes a stream; host ignores it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.h"
#include "common/stream.h"

namespace overlap::comm {

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

// Memory this rank allocated and can share with peers. Owned; freed by the destructor.
class LocalRegion {
 public:
  virtual ~LocalRegion() = default;
  virtual void* data() const = 0;
  virtual std::size_t size() const = 0;
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
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;

  // `tag` makes names unique per job, group and buffer (the host transport uses it).
  virtual std::unique_ptr<LocalRegion> allocate(std::size_t bytes, const std::string& tag) = 0;
  virtual std::unique_ptr<PeerMapping> map_peer(const std::string& handle) = 0;

  // Copy `bytes` from src to dst (either may be a peer mapping). Stream-ordered on cuda.
  virtual void put(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) = 0;
  // Publish `value` into a flag (local or a peer's), after all earlier puts on the stream.
  virtual void signal(std::uint64_t* flag, std::uint64_t value, cudaStream_t stream) = 0;
  // Block (host) or make the stream wait (cuda) until *flag >= value; throws kTimeout
  // naming `ctx` once ctx.timeout_s has passed.
  virtual void wait(const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx,
                    cudaStream_t stream) = 0;
  // out[i] = sum_k in[k][i] with fp32 accumulation; in/out of `dtype` (bf16, fp16 or fp32).
  virtual void reduce(void* out, const void* const* inputs, int num_inputs, std::size_t count,
                      DType dtype, cudaStream_t stream) = 0;
  // Make the host wait for everything issued on `stream` (no-op on host).
  virtual void synchronize(cudaStream_t stream) = 0;
};

std::unique_ptr<Transport> make_host_transport();

}  // namespace overlap::comm

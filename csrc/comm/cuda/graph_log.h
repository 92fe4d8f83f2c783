// NOTE [graph capture]: a captured op bakes its epochs into the graph, and an epoch is used once
// (NOTE [buffer reuse]), so capture needs a GraphLog that notes each buffer's epochs and each
// wait's context and placeholder marker. Before every launch prepare_replay() takes fresh epochs,
// shifts the captured signals and waits on those flags by the difference, arms a watchdog ticket
// per wait and orders the launch after each buffer's previous op. Verdict: a replay is
// indistinguishable from issuing the ops again; launches are serialised with prepare_replay().
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/cuda/watchdog.h"
#include "comm/symmetric_buffer.h"
#include "comm/transport.h"

namespace overlap::comm::cuda {

class GraphLog {
 public:
  explicit GraphLog(unsigned long long capture_id) : capture_id_(capture_id) {}
  GraphLog(const GraphLog&) = delete;
  GraphLog& operator=(const GraphLog&) = delete;

  unsigned long long capture_id() const { return capture_id_; }

  // Capture side (called by begin_op and the cuda transport's wait()).
  void note_op(const std::shared_ptr<SymmetricBuffer>& buf, std::uint64_t epoch);
  void note_wait(const std::shared_ptr<Watchdog>& watchdog, const Watchdog::Ticket& placeholder,
                 const std::uint64_t* flag, std::uint64_t value, const WaitContext& ctx);
  // Number of ops noted so far (over all buffers).
  std::size_t ops() const;

  // Before each launch of `exec` (from `graph`); kState if a logged buffer is gone.
  void prepare_replay(CUgraph graph, CUgraphExec exec, cudaStream_t stream);

 private:
  struct Span {  // the epochs [first, last] one buffer's captured ops took
    std::shared_ptr<SymmetricBuffer> buf;
    std::uint64_t first = 0;
    std::uint64_t last = 0;
  };
  struct Wait {
    std::shared_ptr<Watchdog> watchdog;
    Watchdog::Ticket placeholder;
    const std::uint64_t* flag;
    std::uint64_t value;
    WaitContext ctx;  // ctx.op points into `op`
    std::string op;
  };
  // What one memop of a node refers to.
  struct Target {
    enum Kind { kFlag, kMarker } kind;
    std::size_t index;  // into spans_ (kFlag) or waits_ (kMarker)
  };
  struct Node {
    CUgraphNode node;
    CUDA_BATCH_MEM_OP_NODE_PARAMS params;
    std::vector<CUstreamBatchMemOpParams> captured;
    std::vector<std::pair<std::size_t, Target>> targets;  // (memop index, what it refers to)
  };

  std::size_t span_of(const void* flag) const;  // index into spans_, or npos
  void collect_nodes(CUgraph graph);
  // prepare_replay() once every check has passed: takes the epochs and sets the nodes.
  void take_replay_epochs(CUgraphExec exec, cudaStream_t stream);

  unsigned long long capture_id_;
  mutable std::mutex mu_;
  std::vector<Span> spans_;
  std::vector<Wait> waits_;
  std::string broken_;  // why the capture cannot be replayed, if it cannot
  CUgraph collected_for_ = nullptr;
  std::vector<Node> nodes_;
};

// The process-wide registry of open logs, keyed by capture sequence.
// Opens a log for `stream`'s capture (kInvalidArgument if not capturing, kState if open).
std::shared_ptr<GraphLog> begin_graph_log(cudaStream_t stream);
// Closes the log (idempotent); it stays usable for replays.
void end_graph_log(const std::shared_ptr<GraphLog>& log);
// The open log of `stream`'s capture; nullptr when not capturing; kUnsupported without a log.
std::shared_ptr<GraphLog> graph_log_for(cudaStream_t stream);

}  // namespace overlap::comm::cuda

// CUDA-graph capture of communication ops: what a capture records, and how a replay is made
// safe.
//
// NOTE [graph capture]: ops synchronise through flags that carry epochs, and an epoch is used
// once (NOTE [buffer reuse] in collectives.h). A captured op bakes the epochs it was captured
// with into the graph's stream memory operations (its signals and waits), so a plain replay
// would repeat them: a wait for an epoch the flag already holds passes at once, and a fast
// rank overwrites data a slow peer still reads. Capture therefore goes through a GraphLog:
//
//   capture   overlap.CudaGraph.capture() opens a log for the stream's capture sequence
//             (begin_graph_log). While it is open, begin_op notes which epochs each buffer's
//             ops took (contiguous: nothing else may run on a captured buffer meanwhile), and
//             each wait notes its context and the placeholder "reached" marker write that
//             precedes it (NOTE [watchdog]; a reserved, unwatched ticket). Ops on a capturing
//             stream without an open log are refused (check_stream).
//   replay    before every launch, prepare_replay() takes fresh epochs for every buffer the
//             graph uses (as many as the capture took), rewrites the value of every captured
//             signal and wait on those buffers' flags by the difference (the graph's memop nodes
//             are updated in the executable graph: cuGraphExecBatchMemOpNodeSetParams), arms a
//             watchdog ticket for every captured wait and points its marker write at it, and
//             orders the launch stream after each buffer's previous op (NOTE [ops on several
//             streams]). A replay is thus indistinguishable, to peers and to later eager ops, from
//             issuing the captured ops again; every rank must replay (or run) the same ops in
//             the same order, as for eager ops.
//
// The rewrite only touches memops whose address is a flag of a logged buffer or the marker of
// a logged wait; anything else in the graph is left alone. Launches must be serialised with
// prepare_replay() (the Python wrapper does both under one call).
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

  // Before each launch of `exec` (instantiated from `graph`, the captured graph) on `stream`.
  // Throws kState if a logged buffer was destroyed or the capture was not replayable.
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

// The registry of open logs, keyed by capture sequence (NOTE [graph capture]): the only
// process-wide state of the capture support, documented here.
//
// Opens a log for the capture sequence `stream` is capturing into (throws kInvalidArgument if
// it is not capturing, kState if a log is already open for it).
std::shared_ptr<GraphLog> begin_graph_log(cudaStream_t stream);
// Closes the log (idempotent); it stays usable for replays.
void end_graph_log(const std::shared_ptr<GraphLog>& log);
// The open log of the capture `stream` is part of; nullptr when `stream` is not capturing.
// Throws kUnsupported when it is capturing without a log (a capture we would not replay
// safely).
std::shared_ptr<GraphLog> graph_log_for(cudaStream_t stream);

}  // namespace overlap::comm::cuda

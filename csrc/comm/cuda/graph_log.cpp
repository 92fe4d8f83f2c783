#include "comm/cuda/graph_log.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "common/cuda/cuda_check.h"
#include "common/cuda/driver_api.h"
#include "common/errors.h"

namespace overlap::comm::cuda {

namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// NOTE [graph capture]: the registry of open logs. Leaked on purpose, so that it outlives
// every static destructor that could still reach it.
struct Registry {
  std::mutex mu;
  std::unordered_map<unsigned long long, std::shared_ptr<GraphLog>> open;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// The capture sequence `stream` is capturing into, if any.
bool capture_id_of(cudaStream_t stream, unsigned long long* id) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  OVERLAP_CHECK_CUDA(cudaStreamGetCaptureInfo(stream, &status, id));
  OVERLAP_CHECK(status != cudaStreamCaptureStatusInvalidated, kState,
                "the stream's CUDA-graph capture has been invalidated (an earlier call in the "
                "capture failed); end the capture and start again");
  return status == cudaStreamCaptureStatusActive;
}

bool is_value64(const CUstreamBatchMemOpParams& p) {
  return p.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64 ||
         p.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64;
}

// Wait and write share the layout of address and value (cuda.h), read through waitValue.
const void* address_of(const CUstreamBatchMemOpParams& p) {
  return reinterpret_cast<const void*>(p.waitValue.address);
}

}  // namespace

std::shared_ptr<GraphLog> begin_graph_log(cudaStream_t stream) {
  unsigned long long id = 0;
  OVERLAP_CHECK_ARG(capture_id_of(stream, &id),
                    "begin_graph_log: the stream is not capturing a CUDA graph");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.open[id];
  OVERLAP_CHECK(slot == nullptr, kState,
                "a graph log is already open for this capture (capture id " << id << ")");
  slot = std::make_shared<GraphLog>(id);
  return slot;
}

void end_graph_log(const std::shared_ptr<GraphLog>& log) {
  if (!log) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(log->capture_id());
  if (it != r.open.end() && it->second == log) r.open.erase(it);
}

std::shared_ptr<GraphLog> graph_log_for(cudaStream_t stream) {
  unsigned long long id = 0;
  if (!capture_id_of(stream, &id)) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.open.find(id);
  OVERLAP_CHECK(it != r.open.end(), kUnsupported,
                "communication ops are being captured into a CUDA graph without "
                "overlap.CudaGraph: a plain replay would repeat the epochs their flags carry "
                "(NOTE [graph capture]); capture with `with overlap.CudaGraph().capture():` "
                "and replay with its replay()");
  return it->second;
}

void GraphLog::note_op(const std::shared_ptr<SymmetricBuffer>& buf, std::uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Span& s : spans_) {
    if (s.buf != buf) continue;
    if (epoch != s.last + 1 && broken_.empty()) {
      broken_ = "a buffer captured into this graph also ran op #" + std::to_string(s.last + 1) +
                " outside the capture while it was captured; capture every op of a buffer "
                "or none";
    }
    s.last = epoch;
    return;
  }
  spans_.push_back(Span{buf, epoch, epoch});
}

void GraphLog::note_wait(const std::shared_ptr<Watchdog>& watchdog,
                         const Watchdog::Ticket& placeholder, const std::uint64_t* flag,
                         std::uint64_t value, const WaitContext& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  waits_.push_back(Wait{watchdog, placeholder, flag, value, ctx, ctx.op});
}

std::size_t GraphLog::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const Span& s : spans_) n += s.last - s.first + 1;
  return n;
}

std::size_t GraphLog::span_of(const void* flag) const {
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    if (spans_[i].buf->owns_flag(flag)) return i;
  }
  return kNone;
}

// Finds every memop of the captured graph that refers to a logged flag or marker. Done once
// per graph: the captured values are the base every replay is computed from.
void GraphLog::collect_nodes(CUgraph graph) {
  const DriverApi& d = driver();
  std::size_t count = 0;
  OVERLAP_CHECK_CU(d.cuGraphGetNodes(graph, nullptr, &count));
  std::vector<CUgraphNode> all(count);
  OVERLAP_CHECK_CU(d.cuGraphGetNodes(graph, all.data(), &count));
  std::vector<Node> nodes;
  std::vector<bool> marker_found(waits_.size(), false);
  for (CUgraphNode node : all) {
    CUgraphNodeType type;
    OVERLAP_CHECK_CU(d.cuGraphNodeGetType(node, &type));
    if (type != CU_GRAPH_NODE_TYPE_BATCH_MEM_OP) continue;
    Node n{node, {}, {}, {}};
    OVERLAP_CHECK_CU(d.cuGraphBatchMemOpNodeGetParams(node, &n.params));
    n.captured.assign(n.params.paramArray, n.params.paramArray + n.params.count);
    for (std::size_t i = 0; i < n.captured.size(); ++i) {
      const CUstreamBatchMemOpParams& p = n.captured[i];
      if (!is_value64(p)) continue;
      const void* addr = address_of(p);
      const std::size_t span = span_of(addr);
      if (span != kNone) {
        const std::uint64_t v = p.waitValue.value64;
        OVERLAP_CHECK(v >= spans_[span].first && v <= spans_[span].last, kInternal,
                      "a captured flag operation carries value "
                          << v << " outside the captured epochs [" << spans_[span].first << ", "
                          << spans_[span].last << "]");
        n.targets.emplace_back(i, Target{Target::kFlag, span});
        continue;
      }
      for (std::size_t w = 0; w < waits_.size(); ++w) {
        if (waits_[w].placeholder.marker == addr &&
            waits_[w].placeholder.seq == p.writeValue.value64) {
          n.targets.emplace_back(i, Target{Target::kMarker, w});
          marker_found[w] = true;
          break;
        }
      }
    }
    if (!n.targets.empty()) nodes.push_back(std::move(n));
  }
  OVERLAP_CHECK(std::all_of(marker_found.begin(), marker_found.end(), [](bool b) { return b; }),
                kState,
                "the captured graph lacks some of the waits captured into it (was the graph "
                "modified after capture?); capture it again");
  nodes_ = std::move(nodes);
  collected_for_ = graph;
}

void GraphLog::prepare_replay(CUgraph graph, CUgraphExec exec, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  OVERLAP_CHECK(broken_.empty(), kState, "this CUDA graph cannot be replayed: " << broken_);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> reg(r.mu);
    auto it = r.open.find(capture_id_);
    OVERLAP_CHECK(it == r.open.end() || it->second.get() != this, kState,
                  "the graph is still being captured; replay it after the capture ends");
  }
  // ---- checks: nothing below them may leave a buffer's epochs half-advanced -----------------
  for (const Span& s : spans_) {
    s.buf->check_ready("graph replay");
    s.buf->transport().raise_if_failed();
  }
  if (collected_for_ != graph) collect_nodes(graph);

  // ---- the replay's epochs ------------------------------------------------------------------
  // NOTE [failed transport]: from the first epoch taken, an error fails the transports.
  try {
    take_replay_epochs(exec, stream);
  } catch (const Error& e) {
    for (const Span& s : spans_) s.buf->transport().fail(e.kind(), e.what());
    throw;
  } catch (const std::exception& e) {
    for (const Span& s : spans_) s.buf->transport().fail(ErrorKind::kInternal, e.what());
    throw;
  }
}

void GraphLog::take_replay_epochs(CUgraphExec exec, cudaStream_t stream) {
  std::vector<std::uint64_t> delta(spans_.size());
  for (std::size_t i = 0; i < spans_.size(); ++i) {
    Span& s = spans_[i];
    s.buf->transport().order_ops(s.buf.get(), stream);  // NOTE [ops on several streams]
    delta[i] = s.buf->take_epochs(s.last - s.first + 1) + 1 - s.first;
    // Peers may have read our region in the replay (NOTE [deferred acknowledgements]).
    s.buf->set_peers_read_last_op(true);
  }
  std::vector<Watchdog::Ticket> tickets(waits_.size());
  for (std::size_t w = 0; w < waits_.size(); ++w) {
    const Wait& wt = waits_[w];
    const std::size_t span = span_of(wt.flag);
    OVERLAP_CHECK(span != kNone, kInternal, "a captured wait's flag belongs to no logged buffer");
    WaitContext ctx = wt.ctx;
    ctx.op = wt.op.c_str();
    ctx.epoch = wt.value + delta[span];
    tickets[w] = wt.watchdog->arm(wt.flag, wt.value + delta[span], ctx);
  }
  const DriverApi& d = driver();
  for (Node& n : nodes_) {
    std::vector<CUstreamBatchMemOpParams> ops = n.captured;
    for (const auto& [i, target] : n.targets) {
      if (target.kind == Target::kFlag) {
        ops[i].waitValue.value64 = n.captured[i].waitValue.value64 + delta[target.index];
      } else {
        const Watchdog::Ticket& t = tickets[target.index];
        ops[i].writeValue.address = reinterpret_cast<CUdeviceptr>(t.marker);
        ops[i].writeValue.value64 = t.seq;
      }
    }
    CUDA_BATCH_MEM_OP_NODE_PARAMS params = n.params;
    params.paramArray = ops.data();
    OVERLAP_CHECK_CU(d.cuGraphExecBatchMemOpNodeSetParams(exec, n.node, &params));
  }
}

}  // namespace overlap::comm::cuda

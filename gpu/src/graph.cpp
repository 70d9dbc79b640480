#include "dsv32/gpu/graph.hpp"

#include "check.cuh"

namespace dsv32::gpu {

using detail::check;

struct BreakableGraph::Segment {
  cudaGraphExec_t exec = nullptr;  // a graph segment, or
  std::vector<Op> eager;           // the eager ops of an eager segment, in order
  std::string label;
};

BreakableGraph::BreakableGraph(Stream stream, int side_streams) : stream_(stream) {
  if (side_streams < 0) throw GraphError("breakable graph: negative side stream count");
  for (int i = 0; i < side_streams; ++i) {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "side stream");
    sides_.push_back(s);
  }
  make_events();
}

BreakableGraph::BreakableGraph(Stream stream, std::vector<Stream> borrowed_sides)
    : stream_(stream), sides_(std::move(borrowed_sides)), own_sides_(false) {
  for (Stream s : sides_)
    if (s == nullptr || s == stream_)
      throw GraphError("breakable graph: a borrowed side stream must be a stream of its own");
  make_events();
}

void BreakableGraph::make_events() {
  for (std::size_t i = 0; i < sides_.size(); ++i) {
    cudaEvent_t a = nullptr, b = nullptr;
    check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), "fork event");
    fork_events_.push_back(a);
    check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), "join event");
    join_events_.push_back(b);
  }
  forked_.assign(sides_.size(), false);
}

BreakableGraph::~BreakableGraph() {
  abort();
  for (cudaEvent_t e : fork_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : join_events_) cudaEventDestroy(e);
  if (own_sides_)
    for (cudaStream_t s : sides_) cudaStreamDestroy(s);
}

Stream BreakableGraph::side(int i) const {
  if (i < 0 || i >= static_cast<int>(sides_.size()))
    throw GraphError("breakable graph: no side stream " + std::to_string(i) + " (it has " +
                     std::to_string(sides_.size()) + ")");
  return sides_[i];
}

template <class F>
void BreakableGraph::guarded(F&& f) {
  try {
    f();
  } catch (...) {
    abort();
    throw;
  }
}

void BreakableGraph::begin() {
  if (capturing_) throw GraphError("nested capture: this breakable graph is already capturing");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw GraphError("nested capture: the stream is already being captured by another capture");
  abort();  // drops an earlier capture
  capturing_ = true;
}

void BreakableGraph::open_segment() {
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
  open_ = true;
}

void BreakableGraph::close_segment() {
  if (!open_) return;
  join_all();
  cudaGraph_t graph = nullptr;
  open_ = false;
  check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  // Node priorities (a kernel captured on a high-priority stream keeps its priority in the
  // graph, as it has when launched eagerly).
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  segments_.push_back({exec, {}, ""});
  info_.graphs++;
  info_.structure += "G";
  segments_.back().label = std::move(pending_label_);
  pending_label_.clear();
}

void BreakableGraph::graph(const std::string& label, const Op& op) {
  if (!capturing_) throw GraphError("graph op '" + label + "' outside a capture (call begin())");
  guarded([&] {
    if (!open_) open_segment();
    op();
    pending_label_ += (pending_label_.empty() ? "" : ",") + label;
  });
}

void BreakableGraph::eager(const std::string& label, Op op) {
  if (!capturing_) throw GraphError("eager op '" + label + "' outside a capture (call begin())");
  guarded([&] {
    close_segment();
    op();
    if (!segments_.empty() && !segments_.back().exec) {
      segments_.back().eager.push_back(std::move(op));
      segments_.back().label += "," + label;
    } else {
      segments_.push_back({nullptr, {std::move(op)}, label});
      info_.eager_breaks++;
      info_.structure += "E";
    }
  });
}

void BreakableGraph::fork(int i) {
  cudaStream_t s = side(i);
  guarded([&] {
    if (capturing_ && !open_) open_segment();
    check(cudaEventRecord(fork_events_[i], stream_), "fork: cudaEventRecord");
    check(cudaStreamWaitEvent(s, fork_events_[i], 0), "fork: cudaStreamWaitEvent");
    forked_[i] = true;
  });
}

void BreakableGraph::join(int i) {
  cudaStream_t s = side(i);
  guarded([&] {
    check(cudaEventRecord(join_events_[i], s), "join: cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, join_events_[i], 0), "join: cudaStreamWaitEvent");
    forked_[i] = false;
  });
}

void BreakableGraph::join_all() {
  for (std::size_t i = 0; i < sides_.size(); ++i)
    if (forked_[i]) join(static_cast<int>(i));
}

CaptureInfo BreakableGraph::end() {
  if (!capturing_) throw GraphError("end() without begin()");
  guarded([&] {
    close_segment();
    check(cudaStreamSynchronize(stream_), "capture: the eager ops");
  });
  capturing_ = false;
  captured_ = true;
  return info_;
}

std::vector<std::string> BreakableGraph::segment_labels() const {
  std::vector<std::string> out;
  for (const Segment& s : segments_) out.push_back(s.label);
  return out;
}

void BreakableGraph::replay(const Op& before_launch) {
  if (!captured_) throw GraphError("replay before a completed capture");
  for (Segment& seg : segments_) {
    if (seg.exec) {
      if (before_launch) before_launch();
      check(cudaGraphLaunch(seg.exec, stream_), ("replay graph segment " + seg.label).c_str());
    } else {
      for (Op& op : seg.eager) op();
    }
  }
}

void BreakableGraph::abort() noexcept {
  if (open_) {
    // Join the side streams first (their capture must end with the origin's), then end it.
    for (std::size_t i = 0; i < sides_.size(); ++i)
      if (forked_[i]) {
        cudaEventRecord(join_events_[i], sides_[i]);
        cudaStreamWaitEvent(stream_, join_events_[i], 0);
      }
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
  }
  forked_.assign(sides_.size(), false);
  for (Segment& seg : segments_)
    if (seg.exec) cudaGraphExecDestroy(seg.exec);
  segments_.clear();
  pending_label_.clear();
  info_ = {};
  open_ = capturing_ = captured_ = false;
}

}  // namespace dsv32::gpu

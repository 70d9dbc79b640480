// Plans and captures: a step run under a plan, a plan's capture at a capture size, and the
// stack mutants that the captures must be recorded with.
#include "impl.cuh"

namespace dsv32::gpu::stack {

template <class S>
StepTrace StackImpl<S>::run(const boundary::Plan& plan, const StepInput& in, bool replay_only) {
  step(plan, in, replay_only);
  return trace();
}

template <class S>
void StackImpl<S>::step(const boundary::Plan& plan, const StepInput& in, bool replay_only) {
  const int T = in.capture_size;
  if (T > max_tokens_)
    throw std::invalid_argument("gpu stack: capture size " + std::to_string(T) +
                                " exceeds max_tokens " + std::to_string(max_tokens_));
  if (in.hidden.rows() != T || static_cast<int>(in.positions.size()) != T)
    throw ScenarioError("gpu stack: step input is not derived");
  if (static_cast<int>(in.requests.size()) > max_tokens_)
    throw ScenarioError("gpu stack: more requests than max_tokens");
  upload_step(in);
  const boundary::Plan& serving = serving_plan(plan, in);
  BreakableGraph* graph = nullptr;
  if (serving.capture) {
    auto it = captures_.find({serving.record_signature(), T});
    if (it == captures_.end()) {
      if (replay_only)
        throw boundary::PlanError("plan '" + serving.name + "' was not captured at capture size " +
                                  std::to_string(T));
      capture_one(serving, T, false);
      upload_step(in);  // capture ran its eager ops on empty metadata
      it = captures_.find({serving.record_signature(), T});
    }
    graph = it->second.get();
  }
  served.push_back({serving.name,
                    !graph                  ? Served::How::eager
                    : serving.device_driven ? Served::How::full_graph
                                            : Served::How::piecewise_graph,
                    T});
  if (graph && serving.device_driven) note_device_paths();  // its host code ran at capture
  launch(serving, graph);
  check(cudaStreamSynchronize(stream_), ("step under plan " + plan.name).c_str());
  if (side_) check(cudaStreamSynchronize(side_), "side stream");
}

template <class S>
void StackImpl<S>::launch(const boundary::Plan& serving, BreakableGraph* graph) {
  if (!graph) {
    run_layers(serving);
    return;
  }
  device_ops_ = serving.device_driven;  // for its eager ops
  replay(*graph);
}

/// A device-driven plan serves uniform decode steps, its `mixed` plan every other step (mutant
/// full-for-mixed: the full graph serves them all).
template <class S>
const boundary::Plan& StackImpl<S>::serving_plan(const boundary::Plan& plan,
                                                 const StepInput& in) const {
  return mutant_ == Mutant::full_for_mixed && plan.device_driven ? plan : plan.serving(in);
}

/// A dispatch plan's two kinds of graph: its own, then its `mixed` plan's where that captures.
template <class S>
CaptureInfo StackImpl<S>::capture(const boundary::Plan& plan, int T, bool allow_host_capture) {
  const CaptureInfo info = capture_one(plan, T, allow_host_capture);
  if (plan.mixed && plan.mixed->capture) capture_one(*plan.mixed, T, allow_host_capture);
  return info;
}

template <class S>
CaptureInfo StackImpl<S>::capture_one(const boundary::Plan& plan, int T, bool allow_host_capture) {
  boundary::validate(plan, cfg, allow_host_capture);
  if (!plan.capture) throw boundary::PlanError("plan '" + plan.name + "' captures nothing");
  if (T > max_tokens_)
    throw boundary::PlanError("capture size " + std::to_string(T) + " exceeds max_tokens");
  cudaStreamCaptureStatus status;
  check(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw GraphError("nested capture: the stack's stream is already being captured");
  // Empty metadata: every row padded, no real token; eager ops then have no work.
  StepInput empty;
  empty.capture_size = T;
  empty.num_tokens = 0;
  empty.positions.assign(T, 0);
  empty.slots.assign(T, -1);
  empty.hidden = Mat::Ones(T, cfg.hidden_size);
  upload_step(empty);
  const int forks = forks_, leads = leads_;  // the warm-up's are not the plan's
  run_layers(plan);                          // warm-up on the capture stream (device_ops_ set)
  forks_ = forks, leads_ = leads;
  check(cudaStreamSynchronize(stream_), "capture warm-up");
  upload_step(empty);  // ones again: a graph op that ran during capture would change them
  // What a graph would bake if it read host values (mutant stale-positions).
  check(cudaMemcpyAsync(positions_snapshot_->get(), positions_->get(), T * sizeof(int),
                        cudaMemcpyDeviceToDevice, stream_),
        "positions snapshot");
  check(cudaMemcpyAsync(live_capture_->get(), live_->get(), (T + 3) * sizeof(int),
                        cudaMemcpyDeviceToDevice, stream_),
        "device metadata snapshot");
  auto graph = std::make_unique<BreakableGraph>(stream_, std::vector<Stream>{aux_});
  const Recording recording(*this, graph.get(), true);
  struct Reset {
    bool& a;
    ~Reset() { a = false; }
  };
  graph->begin();
  for (int l = 0; l < cfg.num_layers; ++l) {
    lead_ = wq_b_may_lead(plan, l);
    for (const std::string& name : plan.ops(cfg, l)) {
      const boundary::Op op = boundary::op_of(name);
      const std::string where = "layer" + std::to_string(l) + "/" + name;
      if (plan.at(l, name) == boundary::Placement::graph) {
        graph->graph(where, [&] {
          in_graph_ = true;
          Reset g{in_graph_};
          run_op(l, op);
        });
      } else {        // runs now on empty metadata (no real rows), and again at every replay
        join_side();  // into the segment the eager op ends
        graph->eager(where, [this, l, op] {
          eager_segment_ = true;
          Reset g{eager_segment_};
          run_op(l, op);
        });
      }
    }
  }
  join_side();
  const CaptureInfo info = graph->end();
  captures_[{plan.record_signature(), T}] = std::move(graph);
  return info;
}

template <class S>
void StackImpl<S>::set_mutant(const std::string& name) {
  const Mutant m = boundary::stack_mutant(name);
  if (m == Mutant::unjoined_stream && !side_)
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "side stream");
  mutant_ = m;
  captures_.clear();  // captures recorded without the mutant would hide it
  baked_short_.clear();
  block_owner_.clear();
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

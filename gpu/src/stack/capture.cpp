// Plans and captures: a step run under a plan, a plan's capture at a capture size, and what the
// stack reports of them.
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
  store_given(in);  // before anything runs or is captured: the step reads the prefix's entries
  upload_step(in);
  const boundary::Plan& serving = faults_.serving(plan, in);
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
    graph = it->second.graph.get();
  }
  served_.push_back({serving.name,
                     !graph                  ? Served::How::eager
                     : serving.device_driven ? Served::How::full_graph
                                             : Served::How::piecewise_graph,
                     T});
  if (graph && serving.device_driven) note_device_paths();  // its host code ran at capture
  launch(serving, graph);
  check(cudaStreamSynchronize(streams_.main()), ("step under plan " + plan.name).c_str());
  faults_.finish_step();
}

template <class S>
void StackImpl<S>::prepare(const boundary::Plan& plan, const StepInput& in) {
  const boundary::Plan& serving = faults_.serving(plan, in);
  if (serving.capture && !captures_.count({serving.record_signature(), in.capture_size}))
    capture_one(serving, in.capture_size, false);
}

template <class S>
void StackImpl<S>::launch(const boundary::Plan& serving, BreakableGraph* graph) {
  if (graph)
    costs_.replay(*graph);
  else
    run_layers(serving);
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
  check(cudaStreamIsCapturing(streams_.main(), &status), "cudaStreamIsCapturing");
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
  const int forks = streams_.forks(), leads = leads_;  // the warm-up's are not the plan's
  run_layers(plan);                                    // warm-up on the capture stream
  streams_.set_forks(forks), leads_ = leads;
  check(cudaStreamSynchronize(streams_.main()), "capture warm-up");
  upload_step(empty);  // ones again: a graph op that ran during capture would change them
  faults_.at_capture(step_.positions->get(), step_.live->get(), T, streams_.main());
  Capture cap{
      std::make_unique<BreakableGraph>(streams_.main(), std::vector<Stream>{streams_.aux()}),
      std::make_unique<LaunchState>()};
  BreakableGraph& graph = *cap.graph;
  // Graph ops record under `rec`; eager ops run under the capture's own state, now (capturing,
  // on empty metadata) and at every replay (not capturing).
  LaunchState rec;
  rec.where = LaunchState::Where::graph;
  rec.device_driven = plan.device_driven;
  rec.capturing = true;
  rec.graph = &graph;
  LaunchState* eager = cap.eager.get();
  eager->where = LaunchState::Where::eager_segment;
  eager->device_driven = plan.device_driven;
  eager->capturing = true;
  CaptureInfo info;
  try {
    graph.begin();
    for (int l = 0; l < cfg.num_layers; ++l) {
      rec.lead = wq_b_may_lead(plan, l);
      for (const Op op : plan.layer_ops(cfg, l)) {
        const std::string where = "layer" + std::to_string(l) + "/" + op_name(op);
        if (plan.at(l, op) == boundary::Placement::graph) {
          graph.graph(where, [&] { run_op(l, op, rec); });
        } else {               // runs now on empty metadata (no real rows), and again at replays
          streams_.join(rec);  // into the segment the eager op ends
          graph.eager(where, [this, l, op, eager] { run_op(l, op, *eager); });
        }
      }
    }
    streams_.join(rec);
    info = graph.end();
  } catch (...) {
    streams_.drop_fork();  // the graph has joined its side stream and dropped the capture
    throw;
  }
  eager->capturing = false;
  captures_[{plan.record_signature(), T}] = std::move(cap);
  return info;
}

template <class S>
void StackImpl<S>::drop_captures() {
  captures_.clear();
}

template <class S>
StackReport StackImpl<S>::report() {
  StackReport r;
  r.captures = static_cast<int>(captures_.size());
  for (const LayerDev<S>& w : buf_.layers) r.copy_form_bytes += w.olat_static->size() * sizeof(S);
  r.served = served_;
  r.kernel_paths = paths_;
  const std::vector<long> rows = topk_row_paths();
  for (int p = 0; p < k::kTopkRowPaths; ++p)
    if (rows[p] > 0) r.kernel_paths[kTopkRowPathNames[p]] = rows[p];
  r.indexer_forks = streams_.forks();
  r.indexer_leads = leads_;
  return r;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

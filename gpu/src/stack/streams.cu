// Two streams. An F layer's indexer (fused_q's indexer part, indexer_topk) runs on aux_, forked
// from the main stream after norm_rope_cache (which writes everything it reads) and joined
// before sparse_mqa's products (sparse_mqa's gather, which reads only the top-k rows and the
// cache, runs on it after the select), so that it overlaps q_b_proj, uk_absorb and fused_q's
// rotation on the main stream. indexer_wq_b, the indexer's first op, runs on the main stream
// just before the fork, ahead of q_b_proj, where the whole indexer runs forked (wq_b_may_lead;
// else on aux_): alone it streams its weight at full bandwidth and its successors start sooner
// than beside q_b_proj. Bits do not change: the same kernels on the same data, and the two
// branches write disjoint buffers. Inside a graph segment the fork and the join are captured
// (graph_); an eager segment of a captured plan runs on the main stream alone; a sequence of
// ops that ends with the fork open is joined by its caller (run_layers, time_ops, the capture
// before each eager op and at the end). StackOptions::overlap off: one stream.
#include "impl.cuh"

namespace dsv32::gpu::stack {
namespace {

/// `waiter` waits for the work enqueued on `on` so far (through event ev).
void wait_for(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev, const char* what) {
  check(cudaEventRecord(ev, on), what);
  check(cudaStreamWaitEvent(waiter, ev, 0), what);
}

}  // namespace

template <class S>
void StackImpl<S>::fork_side() {
  if (graph_)
    graph_->fork(0);
  else
    wait_for(aux_, stream_, fork_ev_, "fork the indexer's stream");
  forked_ = true;
  ++forks_;
}

template <class S>
void StackImpl<S>::join_side() {
  if (!forked_) return;
  if (graph_)
    graph_->join(0);
  else
    wait_for(stream_, aux_, join_ev_, "join the indexer's stream");
  forked_ = false;
}

/// The stream of an indexer op: aux_ (forked now if it is not), or the main stream.
template <class S>
cudaStream_t StackImpl<S>::indexer_stream() {
  if (!use_side()) return stream_;
  if (!forked_) fork_side();
  return aux_;
}

/// Every layer's ops of `plan`, launched in order (no capture), the indexer stream joined.
template <class S>
void StackImpl<S>::run_layers(const boundary::Plan& plan) {
  device_ops_ = plan.device_driven;
  for (int l = 0; l < cfg.num_layers; ++l) {
    lead_ = wq_b_may_lead(plan, l);
    for (const std::string& op : plan.ops(cfg, l)) run_op(l, boundary::op_of(op));
  }
  join_side();
}

/// Whether layer l's indexer_wq_b may be launched at the fork, on the main stream ahead of
/// q_b_proj and uk_absorb (norm_rope_cache): an F layer whose ops from norm_rope_cache to
/// indexer_topk run in one forked stretch, so that the move changes no segment and the
/// indexer's chain it starts sooner runs on to the join: the eager plan, or a plan that
/// captures all six (indexer_topk is an H op: mutant plans only). Where indexer_topk is an
/// eager op (`narrow`) the chain stops at the segment's end anyway, and leading would only put
/// indexer_wq_b in series with q_b_proj (docs/PERFORMANCE.md).
template <class S>
bool StackImpl<S>::wq_b_may_lead(const boundary::Plan& plan, int l) const {
  if (!cfg.is_full_layer(l)) return false;
  if (!plan.capture) return true;
  for (const char* op :
       {"norm_rope_cache", "q_b_proj", "uk_absorb", "indexer_wq_b", "fused_q", "indexer_topk"})
    if (plan.at(l, op) != boundary::Placement::graph) return false;
  return true;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

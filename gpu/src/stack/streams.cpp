// Two streams. An F layer's indexer (fused_q's indexer part, indexer_topk) runs on aux, forked
// from the main stream after norm_rope_cache (which writes everything it reads) and joined
// before sparse_mqa's products (sparse_mqa's gather, which reads only the top-k rows and the
// cache, runs on it after the select), so that it overlaps q_b_proj, uk_absorb and fused_q's
// rotation on the main stream. indexer_wq_b, the indexer's first op, runs on the main stream
// just before the fork, ahead of q_b_proj, where the whole indexer runs forked (wq_b_may_lead;
// else on aux): alone it streams its weight at full bandwidth and its successors start sooner
// than beside q_b_proj. Bits do not change: the same kernels on the same data, and the two
// branches write disjoint buffers. Inside a graph segment the fork and the join are captured
// (LaunchState::graph); an eager segment of a captured plan runs on the main stream alone; a
// sequence of ops that ends with the fork open is joined by its caller (run_layers, time_ops,
// the capture before each eager op and at the end). StackOptions::overlap off: one stream.
#include <tuple>

#include "blas.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {
namespace {

/// `waiter` waits for the work enqueued on `on` so far (through event ev).
void wait_for(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev, const char* what) {
  check(cudaEventRecord(ev, on), what);
  check(cudaStreamWaitEvent(waiter, ev, 0), what);
}

}  // namespace

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

Streams::Streams() {
  try {
    check(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking), "cudaStreamCreate");
    // The indexer's stream: the highest priority, so that its latency-bound kernels get SMs as
    // the projections on the main stream free them.
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&aux_, cudaStreamNonBlocking, greatest), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming), "cudaEventCreate");
    // A handle and a fixed workspace per stream: cuBLAS allocates nothing while a stream is
    // captured, and two products running at once must not share a workspace.
    for (auto [handle, s, ws] :
         {std::tuple{&blas_, main_, &workspace_}, std::tuple{&blas_aux_, aux_, &workspace_aux_}}) {
      check_blas(blas().create(handle), "cublasCreate");
      check_blas(blas().set_stream(*handle, s), "cublasSetStream");
      check_blas(blas().set_math_mode(*handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
      *ws = detail::zeros<std::uint8_t>(32u << 20);
      check_blas(blas().set_workspace(*handle, (*ws)->get(), 32u << 20), "cublasSetWorkspace");
    }
  } catch (...) {
    release();
    throw;
  }
}

Streams::~Streams() {
  release();
}

void Streams::release() noexcept {
  if (blas_aux_) blas().destroy(blas_aux_);
  if (blas_) blas().destroy(blas_);
  blas_aux_ = blas_ = nullptr;
  if (join_ev_) cudaEventDestroy(join_ev_);
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  join_ev_ = fork_ev_ = nullptr;
  if (aux_) cudaStreamDestroy(aux_);
  if (main_) cudaStreamDestroy(main_);
  aux_ = main_ = nullptr;
}

void Streams::fork(const LaunchState& st) {
  if (st.graph)
    st.graph->fork(0);
  else
    wait_for(aux_, main_, fork_ev_, "fork the indexer's stream");
  forked_ = true;
  ++forks_;
}

void Streams::join(const LaunchState& st) {
  if (!forked_) return;
  if (st.graph)
    st.graph->join(0);
  else
    wait_for(main_, aux_, join_ev_, "join the indexer's stream");
  forked_ = false;
}

void Streams::synchronize(const char* what) const {
  check(cudaStreamSynchronize(main_), what);
  check(cudaStreamSynchronize(aux_), what);
}

/// The stream of an indexer op: aux (forked now if it is not), or the main stream.
template <class S>
cudaStream_t StackImpl<S>::indexer_stream(const LaunchState& st) {
  if (!use_side(st)) return streams_.main();
  if (!streams_.forked()) streams_.fork(st);
  return streams_.aux();
}

/// Every layer's ops of `plan`, launched in order (no capture), the indexer stream joined.
template <class S>
void StackImpl<S>::run_layers(const boundary::Plan& plan) {
  LaunchState st;
  st.device_driven = plan.device_driven;
  for (int l = 0; l < cfg.num_layers; ++l) {
    st.lead = wq_b_may_lead(plan, l);
    for (const Op op : plan.layer_ops(cfg, l)) run_op(l, op, st);
  }
  streams_.join(st);
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
  for (const Op op : {Op::norm_rope_cache, Op::q_b_proj, Op::uk_absorb, Op::indexer_wq_b,
                      Op::fused_q, Op::indexer_topk})
    if (plan.at(l, op) != boundary::Placement::graph) return false;
  return true;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

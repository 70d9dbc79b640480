// The layer's H ops (BOUNDARIES.md): indexer_topk's selection, the sparse_mqa backend and
// uv_proj in both forms, each host-driven (launch shapes from T_a and the longest context) or,
// for a device-driven plan (LaunchState::device_driven), device-driven: launched over the capture
// size's T rows with the live rows, their contexts and the short-prefill decision read on the
// device (k::Meta::live), so that a full graph replays them for any decode step. Both run the same
// kernels on the same shapes, so their rows agree bitwise: the products of sparse_mqa run over
// all T rows in both.
#include <algorithm>

#include "../kernels/dcp.cuh"
#include "../kernels/gemv.cuh"
#include "../kernels/index_scores.cuh"
#include "../kernels/sparse_mqa.cuh"
#include "../kernels/topk_select.cuh"
#include "blas.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {

template <class S>
void StackImpl<S>::indexer_topk(int l, const LaunchState& st) {
  if (st.device_driven) {
    indexer_topk_device(l, st);
    return;
  }
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const k::Meta m = meta(st);
  // Short-prefill shortcut: when every context fits in K the sets are 0..p and the scores are
  // not needed (topk_select then takes its short path on every row, bit for bit).
  const bool shortcut = faults_.short_prefill(l, step_.longest <= d.K, st);
  const k::Launch launch = go("indexer_topk", indexer_stream(st));
  if (step_.Ta == 0) return;
  const k::IndexScoreKernel kernel =
      k::choose_index_scores(d, step_.Ta, step_.longest, sms_, options.index_mma);
  note(shortcut ? "index scores skipped: every row within K" : score_path(kernel));
  note(topk_path());
  if (!shortcut)
    k::launch_index_scores(launch, kernel, d, m, w.q8->get(), w.omega->get(), w.index,
                           buf_.scores->get(), step_.max_len, step_.Ta, step_.longest);
  k::launch_topk_select(launch, options.topk_bins, d, m, buf_.scores->get(), step_.max_len,
                        step_.Ta, buf_.topk->get(), faults_.topk_fault(), buf_.topk_paths->get());
}

/// Device-driven: scores over the whole cache's positions (a block loops over the chunks past
/// the capped grid: about 16 blocks an SM), the live rows and the decision on the device.
template <class S>
void StackImpl<S>::indexer_topk_device(int l, const LaunchState& st) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const k::Meta m = meta(st);
  const k::Launch launch = go("indexer_topk", indexer_stream(st));
  const int cap = std::max(1, 16 * sms_ / step_.T);
  if (!st.capturing && step_.Ta > 0) note_device_paths(1);  // run eagerly (bisect's every-op-eager)
  k::launch_index_scores(launch,
                         k::choose_index_scores(d, step_.T, step_.max_len, sms_, options.index_mma),
                         d, m, w.q8->get(), w.omega->get(), w.index, buf_.scores->get(),
                         step_.max_len, step_.T, step_.max_len, 0, cap);
  k::launch_topk_select(launch, options.topk_bins, d, m, buf_.scores->get(), step_.max_len, step_.T,
                        buf_.topk->get(), faults_.topk_fault(), buf_.topk_paths->get());
}

/// The score kernel's path (StackReport::kernel_paths).
template <class S>
std::string StackImpl<S>::score_path(k::IndexScoreKernel kernel) const {
  return kernel == k::IndexScoreKernel::mma       ? "index scores: tensor cores (mma)"
         : kernel == k::IndexScoreKernel::per_key ? "index scores: a block per 128 keys"
                                                  : "index scores: grouped heads";
}

/// The top-k select's row class for the step's longest row (StackReport::kernel_paths): every row
/// within K, bins in registers (up to 16 keys a thread), or the general select past that.
template <class S>
std::string StackImpl<S>::topk_path() const {
  if (step_.longest <= cfg.index_topk) return "top-k: every row within K";
  if (!options.topk_bins) return "top-k: radix passes alone";
  return step_.longest <= 16 * 1024 ? "top-k: bins in registers (rows up to 16384 keys)"
                                    : "top-k: general select (rows past 16384 keys)";
}

/// A device-driven indexer's paths, for `layers` layers (default: every F layer), the host's
/// decisions made at capture.
template <class S>
void StackImpl<S>::note_device_paths(int layers) {
  if (layers < 0)
    layers = static_cast<int>(
        std::count(cfg.index_topk_pattern.begin(), cfg.index_topk_pattern.end(), 'F'));
  note(step_.longest <= cfg.index_topk ? "index scores skipped: every row within K (on the device)"
                                       : "index scores: device-driven over the capped grid",
       layers);
  note(topk_path(), layers);
}

template <class S>
void StackImpl<S>::sparse_mqa(int l, const LaunchState& st) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const int L = d.L;
  // The rows the kernels launch over: T_a, or device-driven the capture size (the live rows
  // read on the device).
  const int launch_rows = st.device_driven ? step_.T : step_.Ta;
  // The backend returns its output in a buffer it owns; the address rotates call to call. A
  // full graph's backend writes one static buffer (as FlashMLA under a full graph).
  S* olat = buf_.ring[st.device_driven ? 0 : ring_next_]->get();
  if (!st.device_driven) ring_next_ = (ring_next_ + 1) % buf_.ring.size();
  backend_olat_ = olat;
  const k::Meta m = meta(st);
  // The gather copies a key row in 16-byte pieces where both of its parts allow.
  const bool aligned = (L * sizeof(S)) % 16 == 0 && (d.dr * sizeof(S)) % 16 == 0;
  faults_.before_backend(streams_.main(), st);
  if (cfg.dcp_size > 1) return sparse_mqa_dcp(l, st, m, launch_rows, aligned, olat);
  // The gather reads only the top-k rows and the cache (written before the fork): with the
  // indexer's stream still open it runs there, after the select, and the join follows it.
  if (launch_rows > 0)
    k::launch_mqa_gather(go("sparse_mqa", streams_.forked() ? streams_.aux() : streams_.main()), d,
                         m, launch_rows, w.kv, buf_.topk->get(), buf_.mqa_keys->get(), aligned,
                         w.topk_trace->get(), faults_.latent_fault());
  streams_.join(st);  // the gathered keys (a no-op when never forked)
  if (launch_rows == 0) return;
  attend(l, m, launch_rows, buf_.topk->get(), olat, w.olat_trace->get(), w.lse->get());
}

/// Under DCP (MATH.md, "Context-parallel shards"), the ranks one after the other on this GPU:
/// each rank's share of the rows (its owned entries in place as its local positions, -1 holes),
/// its partial attention over them (the same kernels), then the LSE merge into the backend's
/// buffer and the layer's lse. Ranks read this stack's one cache through their view of it
/// (k::DcpView): a rank's cache would hold the same entries.
template <class S>
void StackImpl<S>::sparse_mqa_dcp(int l, const LaunchState& st, const k::Meta& m, int launch_rows,
                                  bool aligned, S* olat) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  streams_.join(st);  // the indexer's stream: every rank reads the sets
  if (launch_rows == 0) return;
  const std::size_t rows = static_cast<std::size_t>(launch_rows) * d.K;
  check(cudaMemcpyAsync(w.topk_trace->get(), buf_.topk->get(), rows * sizeof(int),
                        cudaMemcpyDeviceToDevice, streams_.main()),
        "sparse_mqa: the layer's sets");
  const long long stride = max_tokens_;  // rows of one rank's partials
  const std::size_t olat_stride = static_cast<std::size_t>(stride) * d.H * d.L;
  for (int r = 0; r < cfg.dcp_size; ++r) {
    k::launch_dcp_share(go("sparse_mqa"), d, m, launch_rows, buf_.topk->get(),
                        buf_.dcp_share->get(), cfg.dcp_size, cfg.dcp_interleave, r,
                        faults_.share_fault());
    k::launch_mqa_gather(go("sparse_mqa"), d, m, launch_rows, w.kv, buf_.dcp_share->get(),
                         buf_.mqa_keys->get(), aligned, buf_.dcp_sets->get(),
                         faults_.latent_fault(), {cfg.dcp_size, cfg.dcp_interleave, r});
    S* part = buf_.dcp_olat->get() + r * olat_stride;
    attend(l, m, launch_rows, buf_.dcp_share->get(), part, part,
           buf_.dcp_lse->get() + static_cast<std::size_t>(r) * stride * d.H,
           faults_.finish_fault());
  }
  k::launch_dcp_merge(go("sparse_mqa"), d, m, launch_rows, cfg.dcp_size, stride,
                      static_cast<const S*>(buf_.dcp_olat->get()), buf_.dcp_lse->get(), olat,
                      w.olat_trace->get(), w.lse->get(), faults_.merge_adds_every_rank());
}

/// Step 8 over the gathered keys of `sets` (mqa_keys) for sparse_mqa's launch rows and
/// metadata: the scores, the softmax, P.V and the finish into olat (and olat_trace) and lse.
template <class S>
void StackImpl<S>::attend(int l, const k::Meta& m, int launch_rows, const int* sets, S* olat,
                          S* olat_trace, float* lse, k::FinishFault finish) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const int H = d.H, L = d.L;
  // Per token t: z_t (H x K) = sigma [ql; qR]_t [c; kR]_t^T, one product over L + dr (cuBLAS is
  // column-major: z_t^T = keys_t qpack_t^T with keys_t a W x K column-major view and qpack_t a
  // W x H one).
  const int W = L + d.dr;
  const long long HK = static_cast<long long>(H) * d.K;
  const float sigma = d.sigma, one = 1.f, zero = 0.f;
  const S* keys = buf_.mqa_keys->get();
  const auto batched = [&](cublasOperation_t ta, int rows, int cols, int depth, const float* alpha,
                           const S* a, int lda, long long sa, const S* b, int ldb, long long sb,
                           const float* beta, float* c, int ldc, long long sc, const char* what) {
    if (ablation_.skip_blas("sparse_mqa", what)) return;
    // T batches, whichever rows are live: cuBLAS's choice of kernel may depend on the batch
    // count, and the device-driven variant cannot know T_a.
    check_blas(blas().gemm_strided_batched(streams_.handle(streams_.main()), ta, CUBLAS_OP_N, rows,
                                           cols, depth, alpha, a, cuda_type<S>(), lda, sa, b,
                                           cuda_type<S>(), ldb, sb, beta, c, CUDA_R_32F, ldc, sc,
                                           step_.T, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
               what);
  };
  const long long key_stride = static_cast<long long>(d.K) * W;
  batched(CUBLAS_OP_T, d.K, H, W, &sigma, keys, W, key_stride, w.qpack->get(), W,
          static_cast<long long>(H) * W, &zero, buf_.mqa_z->get(), d.K, HK, "sparse_mqa scores");
  k::launch_mqa_softmax(go("sparse_mqa"), d, m, launch_rows, sets, buf_.mqa_z->get(),
                        buf_.mqa_p->get(), buf_.mqa_ml->get());
  // acc_t (H x L) = P_t c_t: acc_t^T = c_t^T P_t^T, column-major L x K times K x H.
  batched(CUBLAS_OP_N, L, H, d.K, &one, keys, W, key_stride, buf_.mqa_p->get(), d.K, HK, &zero,
          buf_.mqa_acc->get(), L, static_cast<long long>(H) * L, "sparse_mqa P.V");
  // The gather and the finish also write the trace copies (not part of the op's contract):
  // this layer's sets and latent.
  k::launch_mqa_finish(go("sparse_mqa"), d, m, launch_rows, buf_.mqa_acc->get(), buf_.mqa_ml->get(),
                       olat, olat_trace, lse, finish);
}

/// The no-copy form: backend rows [0, T_a) into o.
template <class S>
void StackImpl<S>::uv_proj(int l, const LaunchState& st) {
  LayerDev<S>& w = buf_.layers[l];
  const int Ta = step_.Ta, H = cfg.num_heads, dv = cfg.v_head_dim;
  S* out = w.o->get();
  if (st.device_driven) {  // all T rows into the output: a padded row's values are not read
    o_ptr_[l] = out;
    if (uv_gemv(backend_olat_))
      uv_small(l, step_.T, backend_olat_, out, streams_.main(), "uv_proj");
    else
      uv_gemm(l, backend_olat_, out, streams_.main(), "uv_proj");
    return;
  }
  out = faults_.uv_output(out, static_cast<std::size_t>(max_tokens_) * H * dv);
  o_ptr_[l] = out;  // handed on by pointer
  const cudaStream_t s = faults_.uv_stream(streams_.main(), st);
  if (Ta == 0) return;
  if (uv_gemv(backend_olat_)) {
    uv_small(l, Ta, backend_olat_, out, s, "uv_proj");
    return;
  }
  uv_gemm(l, backend_olat_, buf_.uv_rows->get(), s, "uv_proj");  // all T rows into the scratch
  check(cudaMemcpyAsync(out, buf_.uv_rows->get(), static_cast<std::size_t>(Ta) * H * dv * sizeof(S),
                        cudaMemcpyDeviceToDevice, s),
        "uv_proj");
}

/// The copy form's product: all T rows of the static latent.
template <class S>
void StackImpl<S>::uv_proj_static(int l) {
  LayerDev<S>& w = buf_.layers[l];
  if (uv_gemv(w.olat_static->get()))
    uv_small(l, step_.T, w.olat_static->get(), w.o->get(), streams_.main(), "uv_proj_static");
  else
    uv_gemm(l, w.olat_static->get(), w.o->get(), streams_.main(), "uv_proj_static");
}

/// uv_proj's product o[t, h, :] = olat[t, h, :] W_UV[h]^T. Up to capture size k::kGemvMaxRows
/// (16-byte aligned rows) a batched k::gemv over the heads, over the rows the form needs (a gemv
/// row does not depend on the row count); else one cuBLAS batched GEMM over the heads for all T
/// rows (uv_gemm; the no-copy form then copies rows [0, T_a) on). Chosen by the capture size, so
/// the copy form (T rows) and the no-copy form (T_a rows) run the same kernel on the same shape
/// and their shared rows agree bitwise.
template <class S>
bool StackImpl<S>::uv_gemv(const S* olat) const {
  const k::Dims d = dims();
  return step_.T <= k::kGemvMaxRows &&
         k::gemv_fits<S>(step_.T, d.dv, olat, d.H * d.L, w_uv(0), d.L);
}

/// W_UV[l][0]: rows dn .. dn + dv of head 0's block of w_kv_b.
template <class S>
const S* StackImpl<S>::w_uv(int l) const {
  return buf_.layers[l].w_kv_b->get() +
         static_cast<std::size_t>(cfg.qk_nope_head_dim) * cfg.kv_lora_rank;
}

/// `op`: uv_proj or uv_proj_static (errors and launch labels name it).
template <class S>
void StackImpl<S>::uv_small(int l, int rows, const S* olat, S* out, cudaStream_t s,
                            const char* op) {
  const k::Dims d = dims();
  k::launch_gemv(go(op, s), olat, d.H * d.L, d.L, w_uv(l),
                 static_cast<long long>(d.dn + d.dv) * d.L, out, d.H * d.dv, d.dv, d.H, rows, d.dv,
                 d.L, sms_);
}

template <class S>
void StackImpl<S>::uv_gemm(int l, const S* olat, S* o, cudaStream_t s, const char* op) {
  const int H = cfg.num_heads, L = cfg.kv_lora_rank, dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim;
  if (ablation_.skip_blas(op, "batched GEMM")) return;
  const float one = 1.f, zero = 0.f;
  const cudaStream_t main = streams_.main();
  const cublasHandle_t handle = streams_.handle(main);
  if (s != main) check_blas(blas().set_stream(handle, s), "uv_proj stream");
  // Column-major per head h: o_h (dv x T, ld H dv) = W_h^T-view (L x dv, ld L)^T olat_h (L x T,
  // ld H L); W_UV[h] is rows dn .. dn + dv of head h's (dn + dv) x L block of w_kv_b.
  const cublasStatus_t st = blas().gemm_strided_batched(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, dv, step_.T, L, &one, w_uv(l), cuda_type<S>(), L,
      static_cast<long long>(dn + dv) * L, olat, cuda_type<S>(), H * L, L, &zero, o, cuda_type<S>(),
      H * dv, dv, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT);
  if (s != main) check_blas(blas().set_stream(handle, main), "uv_proj stream");
  check_blas(st, op);
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

// Op dispatch: one op of one layer at the current capture size, each through its kernels
// (gpu/src/kernels) or cuBLAS; the projections and the query side here, attention.cu the
// indexer's selection, the backend and the UV projection.
#include "../kernels/elementwise.cuh"
#include "../kernels/fused_q.cuh"
#include "../kernels/gemv.cuh"
#include "../kernels/norm_rope_cache.cuh"
#include "../kernels/rmsnorm.cuh"
#include "../kernels/uk_absorb.cuh"
#include "blas.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {

template <class S>
k::Launch StackImpl<S>::go(const char* op, cudaStream_t s) {
  return {s ? s : streams_.main(), op, options.pdl, ablation_.filter()};
}

template <class S>
void StackImpl<S>::run_op(int l, Op op, LaunchState& st) {
  costs_.charge_op(st);
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const int T = step_.T, H = d.H, L = d.L, dq = d.dn + d.dr;
  switch (op) {
    case Op::input_norm:
      k::launch_rmsnorm(go("input_norm"), T, buf_.h->get(), d.D, w.g_in->get(), w.x->get(), d.D,
                        d.D, d.eps);
      break;
    case Op::qkv_a_proj:
      gemm(w.x->get(), d.D, w.w_qkv_a->get(), w.qkv->get(), d.Rq + L + d.dr, T, d.Rq + L + d.dr,
           d.D, "qkv_a_proj");
      break;
    case Op::indexer_wk_proj:
      gemm(w.x->get(), d.D, w.iw_kw->get(), w.kw->get(), d.dI + d.HI, T, d.dI + d.HI, d.D,
           "indexer_wk_proj");
      break;
    case Op::norm_rope_cache:
      norm_rope_cache(l, st);
      break;
    case Op::q_b_proj:
      gemm(w.q_c->get(), d.Rq, w.w_q_b->get(), w.q->get(), H * dq, T, H * dq, d.Rq, "q_b_proj");
      break;
    case Op::uk_absorb:
      uk_absorb(l);
      break;
    case Op::indexer_wq_b:
      if (st.wq_b_led == l)  // launched at the fork
        st.wq_b_led = -1;
      else
        indexer_wq_b(l, indexer_stream(st));
      break;
    case Op::fused_q:
      fused_q(l, st);
      break;
    case Op::indexer_topk:
      indexer_topk(l, st);
      break;
    case Op::sparse_mqa:
      sparse_mqa(l, st);
      break;
    case Op::uv_proj:
      uv_proj(l, st);
      break;
    case Op::latent_copy:  // copy form: backend rows [0, T_a) into the static latent
      if (step_.Ta > 0)
        check(cudaMemcpyAsync(w.olat_static->get(), backend_olat_,
                              static_cast<std::size_t>(step_.Ta) * H * L * sizeof(S),
                              cudaMemcpyDeviceToDevice, streams_.main()),
              "latent_copy");
      break;
    case Op::uv_proj_static:
      uv_proj_static(l);
      break;
    case Op::o_proj:
      o_proj(l);
      break;
    case Op::residual_add:
      k::launch_residual_add(go("residual_add"), buf_.h->get(), w.y->get(),
                             static_cast<long long>(T) * d.D);
      break;
  }
  check(cudaGetLastError(), ("layer" + std::to_string(l) + "/" + op_name(op)).c_str());
}

/// Y (rows x n) = X (rows x k, row stride ldx) * W^T, W (n x k) row-major: decode batches of
/// up to k::kGemvMaxRows rows through k::gemv where it serves the shape (the choice depends on
/// the capture size only), the rest through cuBLAS.
template <class S>
void StackImpl<S>::gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
                        const char* op, cudaStream_t s) {
  if (s == nullptr) s = streams_.main();
  if (k::gemv_fits<S>(rows, n, x, ldx, w, kdim)) {
    k::launch_gemv(go(op, s), x, ldx, 0, w, 0, y, ldy, 0, 1, rows, n, kdim, sms_);
    return;
  }
  if (ablation_.skip_blas(op, "GEMM")) return;
  const float one = 1.f, zero = 0.f;
  check_blas(blas().gemm(streams_.handle(s), CUBLAS_OP_T, CUBLAS_OP_N, n, rows, kdim, &one, w,
                         cuda_type<S>(), kdim, x, cuda_type<S>(), ldx, &zero, y, cuda_type<S>(),
                         ldy, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
             op);
}

template <class S>
void StackImpl<S>::norm_rope_cache(int l, LaunchState& st) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  // F layers clear the shared top-k rows.
  const bool full = cfg.is_full_layer(l);
  const bool clear = faults_.clears_topk(full);
  k::launch_norm_rope_cache(go("norm_rope_cache"), d, meta(st), w.qkv->get(), w.g_q->get(),
                            w.q_c->get(), w.g_kv->get(), w.kv, w.kR->get(), full,
                            full ? w.kw->get() : nullptr, full ? w.ig_k->get() : nullptr,
                            full ? w.ib_k->get() : nullptr, w.index, w.k8->get(), w.kscale->get(),
                            clear, buf_.topk->get());
  if (full && use_side(st)) {  // the indexer's inputs are written
    if (st.lead) {             // indexer_wq_b first, at full bandwidth (streams.cu)
      indexer_wq_b(l, streams_.main());
      st.wq_b_led = l;
      ++leads_;
    }
    streams_.fork(st);
  }
}

/// ql_h (T x L) = qN_h (T x dn) W_UK[h] (dn x L), batched over heads, into qpack's ql part:
/// decode batches through k::uk_small (W_UK read once), larger ones through cuBLAS.
template <class S>
void StackImpl<S>::uk_absorb(int l) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const int T = step_.T, H = d.H, L = d.L, dq = d.dn + d.dr, dkv = d.dn + d.dv;
  if (k::uk_small_fits<S>(d, T)) {
    k::launch_uk_small(go("uk_absorb"), d, T, w.q->get(), w.w_kv_b->get(), w.qpack->get());
    return;
  }
  if (ablation_.skip_blas("uk_absorb", "batched GEMM")) return;
  const float one = 1.f, zero = 0.f;
  check_blas(blas().gemm_strided_batched(
                 streams_.handle(streams_.main()), CUBLAS_OP_N, CUBLAS_OP_N, L, T, d.dn, &one,
                 w.w_kv_b->get(), cuda_type<S>(), L, static_cast<long long>(dkv) * L, w.q->get(),
                 cuda_type<S>(), H * dq, dq, &zero, w.qpack->get(), cuda_type<S>(), H * (L + d.dr),
                 L + d.dr, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
             "uk_absorb");
}

/// indexer_wq_b's product qI = q_c W_q^I on stream s.
template <class S>
void StackImpl<S>::indexer_wq_b(int l, cudaStream_t s) {
  const k::Dims d = dims();
  LayerDev<S>& w = buf_.layers[l];
  gemm(w.q_c->get(), d.Rq, w.iw_q_b->get(), w.qI->get(), d.HI * d.dI, step_.T, d.HI * d.dI, d.Rq,
       "indexer_wq_b", s);
}

template <class S>
void StackImpl<S>::fused_q(int l, const LaunchState& st) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  const k::Meta m = meta(st);
  const int L = d.L, dq = d.dn + d.dr, Wq = L + d.dr;  // qpack's per-head stride; qR at L
  const bool full = cfg.is_full_layer(l);
  const int nrope = k::q_rope_blocks(d);
  const auto part = [&](int y0, int blocks, cudaStream_t s) {
    k::launch_fused_q(go("fused_q", s), d, m, y0, blocks, w.q->get(), dq, d.dn, w.qpack->get(), Wq,
                      L, w.qI->get(), w.kw->get(), w.q8->get(), w.qscale->get(), w.omega->get());
  };
  if (full && use_side(st)) {  // the indexer's part on its stream
    part(nrope, d.HI, indexer_stream(st));
    part(0, nrope, streams_.main());
  } else {
    part(0, nrope + (full ? d.HI : 0), streams_.main());
  }
  faults_.after_fused_q(go("fused_q"), d, m, w.qpack->get(), Wq, L);
}

/// Reads the buffer uv_proj handed on (the static `o` unless a mutant changed it); a graph bakes
/// the pointer it had at capture. Tensor-parallel: this rank's partial sum, every rank's
/// gathered, added in rank order.
template <class S>
void StackImpl<S>::o_proj(int l) {
  LayerDev<S>& w = buf_.layers[l];
  const k::Dims d = dims();
  S* y = gather_ ? buf_.ypart->get() : w.y->get();
  gemm(o_ptr_[l], d.H * d.dv, w.w_o->get(), y, d.D, step_.T, d.D, d.H * d.dv, "o_proj");
  if (!gather_) return;
  const long long n = static_cast<long long>(step_.T) * d.D;
  if (!ablation_.skip_label("o_proj:all-gather"))
    gather_->all_gather(y, buf_.parts->get(), static_cast<std::size_t>(n) * sizeof(S),
                        streams_.main());
  k::launch_sum_ranks(go("o_proj"), buf_.parts->get(), gather_->ranks(), n, w.y->get());
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

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
  return {s ? s : stream_, op, options.pdl, record_ || !skip_.empty() ? this : nullptr};
}

template <class S>
void StackImpl<S>::run_op(int l, boundary::Op op) {
  using boundary::Op;
  charge_op();
  LayerDev<S>& w = layers_[l];
  const k::Dims d = dims();
  const int T = T_, H = d.H, L = d.L, dq = d.dn + d.dr;
  switch (op) {
    case Op::input_norm:
      k::launch_rmsnorm(go("input_norm"), T, h_->get(), d.D, w.g_in->get(), w.x->get(), d.D, d.D,
                        d.eps);
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
      norm_rope_cache(l);
      break;
    case Op::q_b_proj:
      gemm(w.q_c->get(), d.Rq, w.w_q_b->get(), w.q->get(), H * dq, T, H * dq, d.Rq, "q_b_proj");
      break;
    case Op::uk_absorb:
      uk_absorb(l);
      break;
    case Op::indexer_wq_b:
      if (wq_b_led_ == l)  // launched at the fork
        wq_b_led_ = -1;
      else
        indexer_wq_b(l, indexer_stream());
      break;
    case Op::fused_q:
      fused_q(l);
      break;
    case Op::indexer_topk:
      indexer_topk(l);
      break;
    case Op::sparse_mqa:
      sparse_mqa(l);
      break;
    case Op::uv_proj:
      uv_proj(l);
      break;
    case Op::latent_copy:  // copy form: backend rows [0, T_a) into the static latent
      if (Ta_ > 0)
        check(cudaMemcpyAsync(w.olat_static->get(), backend_olat_,
                              static_cast<std::size_t>(Ta_) * H * L * sizeof(S),
                              cudaMemcpyDeviceToDevice, stream_),
              "latent_copy");
      break;
    case Op::uv_proj_static:
      uv_proj_static(l);
      break;
    case Op::o_proj:
      o_proj(l);
      break;
    case Op::residual_add:
      k::launch_residual_add(go("residual_add"), h_->get(), w.y->get(),
                             static_cast<long long>(T) * d.D);
      break;
  }
  check(cudaGetLastError(), ("layer" + std::to_string(l) + "/" + boundary::op_name(op)).c_str());
}

/// Y (rows x n) = X (rows x k, row stride ldx) * W^T, W (n x k) row-major: decode batches of
/// up to k::kGemvMaxRows rows through k::gemv where it serves the shape (the choice depends on
/// the capture size only), the rest through cuBLAS.
template <class S>
void StackImpl<S>::gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
                        const char* op, cudaStream_t s) {
  if (s == nullptr) s = stream_;
  if (k::gemv_fits<S>(rows, n, x, ldx, w, kdim)) {
    k::launch_gemv(go(op, s), x, ldx, 0, w, 0, y, ldy, 0, 1, rows, n, kdim, sms_);
    return;
  }
  if (bypass_blas(op, "GEMM")) return;
  const float one = 1.f, zero = 0.f;
  check_blas(blas().gemm(s == aux_ ? blas_aux_ : blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, kdim,
                         &one, w, cuda_type<S>(), kdim, x, cuda_type<S>(), ldx, &zero, y,
                         cuda_type<S>(), ldy, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
             op);
}

template <class S>
void StackImpl<S>::norm_rope_cache(int l) {
  LayerDev<S>& w = layers_[l];
  const k::Dims d = dims();
  // F layers clear the shared top-k rows; the mutants skip it or clear in S layers too.
  const bool full = cfg.is_full_layer(l);
  const bool clear =
      full ? mutant_ != Mutant::no_topk_clear : mutant_ == Mutant::shared_layer_clears;
  k::launch_norm_rope_cache(
      go("norm_rope_cache"), d, meta(), w.qkv->get(), w.g_q->get(), w.q_c->get(), w.g_kv->get(),
      w.kv, w.kR->get(), full, full ? w.kw->get() : nullptr, full ? w.ig_k->get() : nullptr,
      full ? w.ib_k->get() : nullptr, w.index, w.k8->get(), w.kscale->get(), clear, topk_->get());
  if (full && use_side()) {  // the indexer's inputs are written
    if (lead_) {             // indexer_wq_b first, at full bandwidth (streams.cu)
      indexer_wq_b(l, stream_);
      wq_b_led_ = l;
      ++leads_;
    }
    fork_side();
  }
}

/// ql_h (T x L) = qN_h (T x dn) W_UK[h] (dn x L), batched over heads, into qpack's ql part:
/// decode batches through k::uk_small (W_UK read once), larger ones through cuBLAS.
template <class S>
void StackImpl<S>::uk_absorb(int l) {
  LayerDev<S>& w = layers_[l];
  const k::Dims d = dims();
  const int T = T_, H = d.H, L = d.L, dq = d.dn + d.dr, dkv = d.dn + d.dv;
  if (k::uk_small_fits<S>(d, T)) {
    k::launch_uk_small(go("uk_absorb"), d, T, w.q->get(), w.w_kv_b->get(), w.qpack->get());
    return;
  }
  if (bypass_blas("uk_absorb", "batched GEMM")) return;
  const float one = 1.f, zero = 0.f;
  check_blas(blas().gemm_strided_batched(
                 blas_, CUBLAS_OP_N, CUBLAS_OP_N, L, T, d.dn, &one, w.w_kv_b->get(), cuda_type<S>(),
                 L, static_cast<long long>(dkv) * L, w.q->get(), cuda_type<S>(), H * dq, dq, &zero,
                 w.qpack->get(), cuda_type<S>(), H * (L + d.dr), L + d.dr, H, compute_type<S>(),
                 CUBLAS_GEMM_DEFAULT),
             "uk_absorb");
}

/// indexer_wq_b's product qI = q_c W_q^I on stream s.
template <class S>
void StackImpl<S>::indexer_wq_b(int l, cudaStream_t s) {
  const k::Dims d = dims();
  LayerDev<S>& w = layers_[l];
  gemm(w.q_c->get(), d.Rq, w.iw_q_b->get(), w.qI->get(), d.HI * d.dI, T_, d.HI * d.dI, d.Rq,
       "indexer_wq_b", s);
}

template <class S>
void StackImpl<S>::fused_q(int l) {
  LayerDev<S>& w = layers_[l];
  const k::Dims d = dims();
  const k::Meta m = meta();
  const int L = d.L, dq = d.dn + d.dr, Wq = L + d.dr;  // qpack's per-head stride; qR at L
  const bool full = cfg.is_full_layer(l);
  const int nrope = k::q_rope_blocks(d);
  const auto part = [&](int y0, int blocks, cudaStream_t s) {
    k::launch_fused_q(go("fused_q", s), d, m, y0, blocks, w.q->get(), dq, d.dn, w.qpack->get(), Wq,
                      L, w.qI->get(), w.kw->get(), w.q8->get(), w.qscale->get(), w.omega->get());
  };
  if (full && use_side()) {  // the indexer's part on its stream
    part(nrope, d.HI, indexer_stream());
    part(0, nrope, stream_);
  } else {
    part(0, nrope + (full ? d.HI : 0), stream_);
  }
  if (mutant_ == Mutant::double_rope)  // the rotation again, in place on qR
    k::launch_q_rope(go("fused_q"), d, m, w.qpack->get(), Wq, L, w.qpack->get(), Wq, L);
}

/// Reads the buffer uv_proj handed on (the static `o` unless a mutant changed it); a graph bakes
/// the pointer it had at capture. Tensor-parallel: this rank's partial sum, every rank's
/// gathered, added in rank order.
template <class S>
void StackImpl<S>::o_proj(int l) {
  LayerDev<S>& w = layers_[l];
  const k::Dims d = dims();
  S* y = gather_ ? ypart_->get() : w.y->get();
  gemm(o_ptr_[l], d.H * d.dv, w.w_o->get(), y, d.D, T_, d.D, d.H * d.dv, "o_proj");
  if (!gather_) return;
  const long long n = static_cast<long long>(T_) * d.D;
  if (!bypass([] { return std::string("o_proj:all-gather"); }))
    gather_->all_gather(y, parts_->get(), static_cast<std::size_t>(n) * sizeof(S), stream_);
  k::launch_sum_ranks(go("o_proj"), parts_->get(), gather_->ranks(), n, w.y->get());
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

#include "layer_ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "dsv32/oracle/fixed_order.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "parallel.hpp"

namespace dsv32::detail {
namespace {

using Index = Eigen::Index;
using ConstMap = Eigen::Map<const Mat>;
using RowSpan = std::span<double>;

/// y = x * w^T (a projection: w is out x in), in the oracle's fixed summation order.
template <class X, class W>
void project(Mat& y, const X& x, const W& w) {
  y.resize(x.rows(), w.rows());
  fixed::gemm_nt(y, x, w);
}

/// Every element of m rounded to bf16 in place, a row at a time (a loop the compiler vectorizes).
void round_bf16_rows(fixed::MatRef m) {
  for (Index r = 0; r < m.rows(); ++r) {
    double* p = m.data() + r * m.outerStride();
    for (Index c = 0; c < m.cols(); ++c) p[c] = round_bf16(p[c]);
  }
}

void rmsnorm_rows(Mat& out, const Eigen::Ref<const Mat>& x, const Vec& g, double eps) {
  out.resize(x.rows(), x.cols());
  for (Index r = 0; r < x.rows(); ++r) {
    const double ss = fixed::sum_squares(x.row(r).data(), x.cols());
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.cols()) + eps);
    out.row(r) = (x.row(r).array() * inv) * g.transpose().array();
  }
}

RowSpan row_span(Mat& m, Index r, Index c0, Index n) {
  return RowSpan(&m(r, c0), static_cast<std::size_t>(n));
}

/// The indexer's per-row key/query transform: RoPE on the first dr elements, the optional
/// Hadamard rotation, then the fp8 block quantization (v becomes its e4m3 values).
void rotate_quantize(const LayerContext& ctx, RowSpan v, int pos, double& scale) {
  const Config& c = ctx.cfg;
  const RopeLayout layout =
      c.indexer_rope == IndexerRope::neox ? RopeLayout::neox : RopeLayout::interleaved;
  ctx.rope.apply(v.first(c.qk_rope_head_dim), pos, layout);
  if (c.hadamard == Hadamard::on) hadamard_transform(v);
  const Fp8Block b = quantize_ue8m0(v);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = e4m3_value(b.codes[i]);
  scale = b.scale;
}

bool full(const LayerContext& ctx) {
  return ctx.cfg.is_full_layer(ctx.layer);
}

}  // namespace

void LayerContext::store(Mat& m) const {
  if (!round) return;
  double* p = m.data();
  const std::ptrdiff_t n = m.size();
#pragma omp parallel for schedule(static) if (n >= (std::ptrdiff_t{1} << 16))
  for (std::ptrdiff_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
}

void input_norm(const LayerContext& ctx, const Mat& h, LayerTensors& t) {
  rmsnorm_rows(t.x, h, ctx.w.g_in, ctx.cfg.rms_norm_eps);
  ctx.store(t.x);
}

void qkv_a_proj(const LayerContext& ctx, LayerTensors& t) {
  project(t.qkv, t.x, ctx.w.w_qkv_a);
  ctx.store(t.qkv);
}

void indexer_wk_proj(const LayerContext& ctx, LayerTensors& t) {
  if (!full(ctx)) return;
  project(t.kw, t.x, ctx.indexer_kw);  // one GEMM: [kraw | w]
  ctx.store(t.kw);
}

void norm_rope_cache(const LayerContext& ctx, LayerTensors& t, TopkRows& topk) {
  const Config& c = ctx.cfg;
  const StepInput& in = ctx.in;
  const int T = in.capture_size, Ta = in.num_tokens, l = ctx.layer;
  const int Rq = c.q_lora_rank, L = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  // q_c, c, kR and the cache insert (padded rows, slot < 0, skipped)
  rmsnorm_rows(t.q_c, t.qkv.leftCols(Rq), ctx.w.g_q, c.rms_norm_eps);
  ctx.store(t.q_c);
  rmsnorm_rows(t.lat, t.qkv.middleCols(Rq, L), ctx.w.g_kv, c.rms_norm_eps);
  t.kR = t.qkv.rightCols(dr);
  for (int r = 0; r < T; ++r)
    ctx.rope.apply(row_span(t.kR, r, 0, dr), ctx.rope_pos(r), RopeLayout::interleaved);
  ctx.store(t.kR);
  if (c.kv_cache == KvCache::fp8_ds_mla) {
    for (int r = 0; r < T; ++r) {
      if (in.slots[r] < 0) continue;
      const std::vector<double> back = ds_mla_roundtrip(row_span(t.lat, r, 0, L));
      std::copy(back.begin(), back.end(), &t.lat(r, 0));
    }
  }
  ctx.store(t.lat);
  const auto& overrides = ctx.opts.latent_override;
  std::optional<Mat> follow;
  if (static_cast<int>(overrides.size()) > l && overrides[l]) {
    follow = *overrides[l];
    if (follow->rows() != Ta || follow->cols() != L)
      throw ScenarioError("latent override layer " + std::to_string(l) + ": shape " +
                          std::to_string(follow->rows()) + "x" + std::to_string(follow->cols()) +
                          ", expected " + std::to_string(Ta) + "x" + std::to_string(L));
    ctx.store(*follow);  // stored as this mode stores its own read-back latent
  }
  t.c.resize(Ta, L);
  for (int r = 0; r < T; ++r) {
    if (in.slots[r] < 0) continue;
    if (r < Ta) t.c.row(r) = t.lat.row(r);
    if (follow && r < Ta)
      ctx.cache.kv.row(in.slots[r]) << follow->row(r), t.kR.row(r);
    else
      ctx.cache.kv.row(in.slots[r]) << t.lat.row(r), t.kR.row(r);
  }
  if (!full(ctx)) return;
  // F layers: kI's LayerNorm, rotation and fp8 block, the index-cache insert, and the shared
  // top-k rows [0, T) cleared.
  const IndexerWeights& iw = *ctx.w.indexer;
  const int dI = c.index_head_dim;
  const auto kraw = t.kw.leftCols(dI);
  t.kI.resize(T, dI);
  t.kI_scale.resize(T);
  for (int r = 0; r < T; ++r) {
    const double mean = fixed::sum(kraw.row(r).data(), dI) / dI;
    const Eigen::RowVectorXd dev = kraw.row(r).array() - mean;
    const double var = fixed::sum_squares(dev.data(), dI) / dI;
    t.kI.row(r) = (dev.array() / std::sqrt(var + c.indexer_norm_eps)) * iw.g_k.transpose().array() +
                  iw.b_k.transpose().array();
    rotate_quantize(ctx, row_span(t.kI, r, 0, dI), ctx.rope_pos(r), t.kI_scale[r]);
    if (in.slots[r] < 0) continue;
    ctx.cache.index_k.row(in.slots[r]) = t.kI.row(r);
    ctx.cache.index_scale[in.slots[r]] = t.kI_scale[r];
  }
  topk.setConstant(-1);
  if (ctx.dcp)
    for (TopkRows& rows : ctx.dcp->rows) rows.setConstant(-1);
}

void q_b_proj(const LayerContext& ctx, LayerTensors& t) {
  project(t.q, t.q_c, ctx.w.w_q_b);
  ctx.store(t.q);
}

void uk_absorb(const LayerContext& ctx, LayerTensors& t) {
  const Config& c = ctx.cfg;
  const int H = c.num_heads, L = c.kv_lora_rank, dn = c.qk_nope_head_dim;
  const int dq = dn + c.qk_rope_head_dim, dkv = dn + c.v_head_dim;
  t.ql.resize(ctx.in.capture_size, static_cast<Index>(H) * L);
  parallel_for(H, [&](int hh) {  // one small GEMM per head: heads across threads
    const auto w_uk = ctx.w.w_kv_b.middleRows(static_cast<Index>(hh) * dkv, dn);
    auto block = t.ql.middleCols(static_cast<Index>(hh) * L, L);
    fixed::gemm_nn(block, t.q.middleCols(static_cast<Index>(hh) * dq, dn), w_uk);
    // The bf16 store of this head's block while it is still in cache (a store of the whole
    // ql afterwards reads T x H x L doubles back from memory).
    if (ctx.round) round_bf16_rows(block);
  });
}

void indexer_wq_b(const LayerContext& ctx, LayerTensors& t) {
  if (!full(ctx)) return;
  project(t.qI, t.q_c, ctx.w.indexer->w_q_b);
  ctx.store(t.qI);
}

void fused_q(const LayerContext& ctx, LayerTensors& t) {
  const Config& c = ctx.cfg;
  const int T = ctx.in.capture_size, H = c.num_heads, dr = c.qk_rope_head_dim;
  const int dn = c.qk_nope_head_dim, dq = dn + dr;
  t.qR.resize(T, static_cast<Index>(H) * dr);
  for (int hh = 0; hh < H; ++hh) {
    t.qR.middleCols(static_cast<Index>(hh) * dr, dr) =
        t.q.middleCols(static_cast<Index>(hh) * dq + dn, dr);
    for (int r = 0; r < T; ++r)
      ctx.rope.apply(row_span(t.qR, r, static_cast<Index>(hh) * dr, dr), ctx.rope_pos(r),
                     RopeLayout::interleaved);
  }
  ctx.store(t.qR);
  if (!full(ctx)) return;
  // F layers: qI's rotation and fp8 blocks, and omega = w * qI_scale / sqrt(dI * HI)
  const int HI = c.index_n_heads, dI = c.index_head_dim;
  const auto wts = t.kw.rightCols(HI);
  t.qI_scale.resize(T, HI);
  t.omega.resize(T, HI);
  const double head_norm = 1.0 / std::sqrt(static_cast<double>(dI) * HI);
  for (int r = 0; r < T; ++r)
    for (int hh = 0; hh < HI; ++hh) {
      rotate_quantize(ctx, row_span(t.qI, r, static_cast<Index>(hh) * dI, dI), ctx.rope_pos(r),
                      t.qI_scale(r, hh));
      t.omega(r, hh) = wts(r, hh) * t.qI_scale(r, hh) * head_norm;
    }
}

namespace {

/// topk rows [0, Ta) from the caller's override, checked against [-1, p(t)].
/// Refuses imposed rows of the wrong shape or with an index outside [-1, p(t)].
void check_override(const LayerContext& ctx, const TopkRows& o) {
  const int Ta = ctx.in.num_tokens, K = ctx.cfg.index_topk, l = ctx.layer;
  if (o.rows() != Ta || o.cols() != K)
    throw std::invalid_argument("topk override for layer " + std::to_string(l) +
                                " has the wrong shape");
  for (int r = 0; r < Ta; ++r)
    for (int k = 0; k < K; ++k)
      if (o(r, k) < -1 || o(r, k) > ctx.in.positions[r])
        throw std::invalid_argument("topk override layer " + std::to_string(l) + " row " +
                                    std::to_string(r) + ": index " + std::to_string(o(r, k)) +
                                    " outside [-1, p(t)]");
}

void follow_topk(const LayerContext& ctx, const TopkRows& o, TopkRows& topk) {
  const int Ta = ctx.in.num_tokens, l = ctx.layer;
  check_override(ctx, o);
  topk.topRows(Ta) = o;
  if (!ctx.dcp) return;
  if (ctx.cfg.dcp_indexer_mode == DcpIndexerMode::union_)
    throw std::invalid_argument("topk override for layer " + std::to_string(l) +
                                ": one set per row cannot impose dcp_indexer_mode union's "
                                "per-rank sets");
  for (TopkRows& rows : ctx.dcp->rows) rows.topRows(Ta) = o;
}

/// Under DCP, each rank's rows imposed (`union` mode's own sets), each checked as follow_topk
/// checks one; the shared buffer gets rank 0's.
void follow_dcp_topk(const LayerContext& ctx, const std::vector<TopkRows>& rows, TopkRows& topk) {
  if (static_cast<int>(rows.size()) != ctx.dcp->layout.world)
    throw std::invalid_argument("DCP topk override for layer " + std::to_string(ctx.layer) + ": " +
                                std::to_string(rows.size()) + " ranks, dcp_size " +
                                std::to_string(ctx.dcp->layout.world));
  for (std::size_t rank = 0; rank < rows.size(); ++rank) {
    check_override(ctx, rows[rank]);
    ctx.dcp->rows[rank].topRows(ctx.in.num_tokens) = rows[rank];
  }
  topk.topRows(ctx.in.num_tokens) = rows[0];
}

}  // namespace

void indexer_topk(const LayerContext& ctx, const LayerTensors& t, TopkRows& topk) {
  if (!full(ctx)) return;
  const auto& per_rank = ctx.opts.dcp_topk_override;
  if (ctx.dcp && static_cast<int>(per_rank.size()) > ctx.layer && !per_rank[ctx.layer].empty())
    return follow_dcp_topk(ctx, per_rank[ctx.layer], topk);
  const auto& overrides = ctx.opts.topk_override;
  if (static_cast<int>(overrides.size()) > ctx.layer && overrides[ctx.layer])
    return follow_topk(ctx, *overrides[ctx.layer], topk);
  const Config& c = ctx.cfg;
  const StepInput& in = ctx.in;
  const int HI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk, B = c.block_size;
  // I(t, j) = kscale_j * sum_h omega[h] relu(qI8[h] . kI8_j), a cache block of keys at a time
  // (a block's keys are contiguous in the cache), for groups of a request's tokens.
  constexpr int group = 4;
  std::vector<std::pair<int, int>> items;  // (request, first token of the group)
  for (int r = 0; r < static_cast<int>(in.requests.size()); ++r)
    for (int i = 0; i < in.requests[r].q; i += group) items.emplace_back(r, i);
  parallel_for(static_cast<int>(items.size()), [&](int w) {
    const auto [r, i0] = items[w];
    const RequestStep& rq = in.requests[r];
    const int g = std::min(group, rq.q - i0), t0 = in.token_start[r] + i0;
    const int last = rq.ctx + i0 + g - 1;  // the group's last position
    // The group's query heads as columns, so that a block's dots come out a key a row: each
    // dot one chain over the elements, each score a lane dot over the heads.
    thread_local Mat q_t, dots;
    q_t = ConstMap(&t.qI(t0, 0), static_cast<Index>(g) * HI, dI).transpose();
    thread_local std::vector<double> scores[group];
    for (int i = 0; i < g; ++i) scores[i].resize(rq.ctx + i0 + i + 1);
    for (int j0 = 0; j0 <= last; j0 += B) {
      const int nk = std::min(B, last + 1 - j0);
      const std::int64_t s0 = in.slot_of(r, j0, B);
      dots.resize(nk, q_t.cols());
      fixed::gemm_nn(dots, ctx.cache.index_k.middleRows(s0, nk), q_t);
      for (Index e = 0; e < dots.size(); ++e)  // relu; NaN stays NaN
        if (dots.data()[e] < 0.0) dots.data()[e] = 0.0;
      for (int i = 0; i < g; ++i) {
        const int n = std::min(nk, rq.ctx + i0 + i + 1 - j0);
        for (int j = 0; j < n; ++j)
          scores[i][j0 + j] =
              ctx.cache.index_scale[s0 + j] * fixed::dot(&dots(j, i * HI), &t.omega(t0 + i, 0), HI);
      }
    }
    for (int i = 0; i < g; ++i) {
      if (!ctx.dcp) {
        const std::vector<int> sel = select_topk(scores[i], K);
        for (int k = 0; k < K; ++k) topk(t0 + i, k) = sel[k];
        continue;
      }
      // Under DCP each rank scores its owned keys (the same scores); exact mode's merge gives
      // every rank step 7's set, union mode each rank its own. The shared buffer holds rank 0's.
      const DcpState& d = *ctx.dcp;
      for (int rank = 0; rank < d.layout.world; ++rank) {
        const std::vector<int> sel =
            dcp_select_topk(scores[i], K, d.layout, c.dcp_indexer_mode, rank);
        for (int k = 0; k < K; ++k) ctx.dcp->rows[rank](t0 + i, k) = sel[k];
      }
      topk.row(t0 + i) = d.rows[0].row(t0 + i);
    }
  });
}

namespace {

/// Step 8 for row r over the keys at `slots` (in that order): olat (H L) and lse (H); nothing
/// written when `slots` is empty (the caller's zeros and -inf stand).
void attend(const LayerContext& ctx, const LayerTensors& t, int r,
            const std::vector<std::int64_t>& slots, double* olat, double* lse) {
  const Config& c = ctx.cfg;
  const int H = c.num_heads, L = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  if (slots.empty()) return;
  const Index n = static_cast<Index>(slots.size());
  thread_local Mat kc, qt, z, ot;  // reused token to token
  kc.resize(n, L + dr);
  for (Index j = 0; j < n; ++j) kc.row(j) = ctx.cache.kv.row(slots[j]);
  qt.resize(H, L + dr);
  qt.leftCols(L) = ConstMap(&t.ql(r, 0), H, L);
  qt.rightCols(dr) = ConstMap(&t.qR(r, 0), H, dr);
  z.resize(H, n);
  fixed::gemm_nt(z, qt, kc);
  z *= c.softmax_scale();
  Vec denom(H);
  for (int hh = 0; hh < H; ++hh) {
    double* zr = &z(hh, 0);
    const double m = *std::max_element(zr, zr + n);
    for (Index j = 0; j < n; ++j) zr[j] = std::exp(zr[j] - m);
    denom[hh] = fixed::sum(zr, n);
    lse[hh] = m + std::log(denom[hh]);
  }
  if (ctx.round) round_bf16_rows(z);  // P in bf16 before P*V
  ot.resize(H, L);
  fixed::gemm_nn(ot, z, kc.leftCols(L));
  ot.array().colwise() /= denom.array();
  Eigen::Map<Mat>(olat, H, L) = ot;
}

/// Step 8 under DCP: each rank's share of its row (its owned positions as local slots of its
/// tables), its partial over them (read where the rank's cache holds the same entries), and the
/// merge into t.olat / t.lse; the layer's DcpLayerTrace gets rows [0, Ta) of each.
void sparse_mqa_dcp(const LayerContext& ctx, LayerTensors& t) {
  const Config& c = ctx.cfg;
  const StepInput& in = ctx.in;
  DcpState& d = *ctx.dcp;
  const int W = d.layout.world, Ta = in.num_tokens, H = c.num_heads, L = c.kv_lora_rank;
  const int K = c.index_topk, B = c.block_size;
  DcpLayerTrace& tr = *d.trace;
  tr.rows.assign(W, IndexRows::Constant(Ta, K, -1));
  tr.share.assign(W, IndexRows::Constant(Ta, K, -1));
  tr.olat.assign(W, Mat::Zero(Ta, static_cast<Index>(H) * L));
  tr.lse.assign(W, Mat::Constant(Ta, H, -std::numeric_limits<double>::infinity()));
  parallel_for(Ta, [&](int r) {
    const int req = in.request_of_token[r];
    std::vector<const double*> part_olat, part_lse;
    for (int rank = 0; rank < W; ++rank) {
      std::vector<std::int64_t> slots;  // global slots of the same entries, for the read
      int n = 0;
      for (int k = 0; k < K; ++k) {
        const int p = d.rows[rank](r, k);
        tr.rows[rank](r, k) = p;
        if (p < 0 || d.layout.owner(p) != rank) continue;
        const std::int64_t l = d.layout.local(p);
        const std::vector<int>& table = d.tables[rank][req];
        tr.share[rank](r, n++) = std::int64_t{table.at(l / B)} * B + l % B;
        slots.push_back(in.slot_of(req, p, B));
      }
      attend(ctx, t, r, slots, &tr.olat[rank](r, 0), &tr.lse[rank](r, 0));
      if (ctx.round)  // each rank's olat in bf16
        for (double& v : tr.olat[rank].row(r)) v = round_bf16(v);
      part_olat.push_back(&tr.olat[rank](r, 0));
      part_lse.push_back(&tr.lse[rank](r, 0));
    }
    dcp_merge_row(part_olat, part_lse, H, L, ctx.round, &t.olat(r, 0), &t.lse(r, 0));
  });
}

}  // namespace

void sparse_mqa(const LayerContext& ctx, const TopkRows& topk, LayerTensors& t) {
  const Config& c = ctx.cfg;
  const StepInput& in = ctx.in;
  const int T = in.capture_size, H = c.num_heads, L = c.kv_lora_rank;
  const int K = c.index_topk, B = c.block_size;
  t.olat = Mat::Zero(T, static_cast<Index>(H) * L);
  t.lse = Mat::Constant(T, H, -std::numeric_limits<double>::infinity());
  if (ctx.dcp) {
    sparse_mqa_dcp(ctx, t);
  } else {
    parallel_for(in.num_tokens, [&](int r) {
      const int req = in.request_of_token[r];
      std::vector<std::int64_t> slots;
      for (int k = 0; k < K; ++k)
        if (topk(r, k) >= 0) slots.push_back(in.slot_of(req, topk(r, k), B));
      attend(ctx, t, r, slots, &t.olat(r, 0), &t.lse(r, 0));
    });
  }
  ctx.store(t.olat);
}

void uv_proj(const LayerContext& ctx, LayerTensors& t) {
  const Config& c = ctx.cfg;
  const int H = c.num_heads, L = c.kv_lora_rank, dn = c.qk_nope_head_dim, dv = c.v_head_dim;
  t.o.resize(ctx.in.capture_size, static_cast<Index>(H) * dv);
  parallel_for(H, [&](int hh) {
    const auto w_uv = ctx.w.w_kv_b.middleRows(static_cast<Index>(hh) * (dn + dv) + dn, dv);
    fixed::gemm_nt(t.o.middleCols(static_cast<Index>(hh) * dv, dv),
                   t.olat.middleCols(static_cast<Index>(hh) * L, L), w_uv);
  });
  ctx.store(t.o);
}

void o_proj(const LayerContext& ctx, LayerTensors& t) {
  const int R = ctx.opts.o_proj_ranks, H = ctx.cfg.num_heads;
  if (R <= 1) {
    project(t.y, t.o, ctx.w.w_o);
    ctx.store(t.y);
    return;
  }
  // Tensor parallel (MATH.md section 3): each rank's partial product over its heads' columns,
  // stored as that rank's o_proj writes it, then summed in rank order.
  if (H % R != 0)
    throw ConfigError("o_proj_ranks " + std::to_string(R) + " does not divide num_heads " +
                      std::to_string(H));
  const Index cols = static_cast<Index>(H / R) * ctx.cfg.v_head_dim;
  t.y = Mat::Zero(ctx.in.capture_size, ctx.cfg.hidden_size);
  Mat part;
  for (int r = 0; r < R; ++r) {
    project(part, t.o.middleCols(r * cols, cols), ctx.w.w_o.middleCols(r * cols, cols));
    ctx.store(part);
    t.y += part;
  }
  ctx.store(t.y);
}

void residual_add(const LayerContext& ctx, const LayerTensors& t, Mat& h) {
  h += t.y;
  ctx.store(h);
}

void run_op(Op op, const LayerContext& ctx, LayerTensors& t, Mat& h, TopkRows& topk) {
  switch (op) {
    case Op::input_norm:
      return input_norm(ctx, h, t);
    case Op::qkv_a_proj:
      return qkv_a_proj(ctx, t);
    case Op::indexer_wk_proj:
      return indexer_wk_proj(ctx, t);
    case Op::norm_rope_cache:
      return norm_rope_cache(ctx, t, topk);
    case Op::q_b_proj:
      return q_b_proj(ctx, t);
    case Op::uk_absorb:
      return uk_absorb(ctx, t);
    case Op::indexer_wq_b:
      return indexer_wq_b(ctx, t);
    case Op::fused_q:
      return fused_q(ctx, t);
    case Op::indexer_topk:
      return indexer_topk(ctx, t, topk);
    case Op::sparse_mqa:
      return sparse_mqa(ctx, topk, t);
    case Op::uv_proj:
      return uv_proj(ctx, t);
    case Op::o_proj:
      return o_proj(ctx, t);
    case Op::residual_add:
      return residual_add(ctx, t, h);
    case Op::latent_copy:
    case Op::uv_proj_static:
      break;
  }
  throw std::logic_error("oracle: op " + op_name(op) + " is not of the no-copy form");
}

}  // namespace dsv32::detail

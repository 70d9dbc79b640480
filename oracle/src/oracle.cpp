#include "dsv32/oracle/oracle.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "dsv32/oracle/fixed_order.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "parallel.hpp"

namespace dsv32 {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// y = x * w^T (a projection: w is out x in), in the oracle's fixed summation order.
template <class X, class W>
void project(Mat& y, const X& x, const W& w) {
  y.resize(x.rows(), w.rows());
  fixed::gemm_nt(y, x, w);
}

/// Every element of m rounded to bf16 in place, a row at a time (a loop the compiler vectorizes).
void round_bf16_rows(fixed::MatRef m) {
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    double* p = m.data() + r * m.outerStride();
    for (Eigen::Index c = 0; c < m.cols(); ++c) p[c] = round_bf16(p[c]);
  }
}

using ConstMap = Eigen::Map<const Mat>;
using RowSpan = std::span<double>;

void rmsnorm_rows(Mat& out, const Eigen::Ref<const Mat>& x, const Vec& g, double eps) {
  out.resize(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const double ss = fixed::sum_squares(x.row(r).data(), x.cols());
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.cols()) + eps);
    out.row(r) = (x.row(r).array() * inv) * g.transpose().array();
  }
}

/// Rows [0, Ta) of m as a tensor of shape (Ta, tail...).
Tensor stage(const char* name, const Mat& m, int Ta, std::vector<std::int64_t> tail, DType dt) {
  std::vector<std::int64_t> shape{Ta};
  shape.insert(shape.end(), tail.begin(), tail.end());
  std::vector<double> data(m.data(), m.data() + static_cast<std::ptrdiff_t>(Ta) * m.cols());
  return Tensor::from(name, std::move(shape), std::move(data), dt);
}

RowSpan row_span(Mat& m, Eigen::Index r, Eigen::Index c0, Eigen::Index n) {
  return RowSpan(&m(r, c0), static_cast<std::size_t>(n));
}

/// Attributes the wall time since the previous lap to the op just finished.
class Laps {
 public:
  explicit Laps(Profile* p) : p_(p), t_(std::chrono::steady_clock::now()) {}
  /// Charges the time since the last lap, less what went aside, to `op`.
  void operator()(std::string_view op) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    p_->add(op, std::chrono::duration<double>(now - t_).count() - aside_);
    t_ = now;
    aside_ = 0.0;
  }
  /// Runs f and charges its time to `what` instead of the op in progress (the trace's copies
  /// are the oracle's bookkeeping, not the op's arithmetic).
  template <class F>
  void aside(std::string_view what, F&& f) {
    if (!p_) return f();
    const auto a = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    aside_ += s;
    p_->add(what, s);
  }

 private:
  Profile* p_;
  std::chrono::steady_clock::time_point t_;
  double aside_ = 0.0;
};

}  // namespace

void Profile::add(std::string_view op, double s) {
  for (auto& [name, sec] : seconds)
    if (name == op) {
      sec += s;
      return;
    }
  seconds.emplace_back(std::string(op), s);
}

double Profile::get(std::string_view op) const {
  for (const auto& [name, sec] : seconds)
    if (name == op) return sec;
  return 0.0;
}

void Oracle::synthesize_context(const StepInput& in, std::uint64_t seed) {
  const int L = cfg_.kv_lora_rank, E = cfg_.kv_entry_dim(), dI = cfg_.index_head_dim;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    LayerCache& c = caches_[l];
    const rng::Stream s(seed, "context/layer" + std::to_string(l));
    for (std::size_t r = 0; r < in.requests.size(); ++r) {
      const int ctx = in.requests[r].ctx;
#pragma omp parallel for schedule(static)
      for (int p = 0; p < ctx; ++p) {
        const std::int64_t slot = in.slot_of(static_cast<int>(r), p, cfg_.block_size);
        const std::uint64_t base = static_cast<std::uint64_t>(slot) * (E + dI + 1);
        for (int i = 0; i < E; ++i) {
          const double v = 2.0 * s.symmetric(base + i);
          c.kv(slot, i) = rounds_bf16() || i >= L ? round_bf16(v) : v;
        }
        if (!cfg_.is_full_layer(l)) continue;
        for (int i = 0; i < dI; ++i)
          c.index_k(slot, i) = round_e4m3(448.0 * s.symmetric(base + E + i));
        c.index_scale[slot] = ue8m0_scale(4.0 * s.uniform(base + E + dI));
      }
    }
  }
}

std::string_view to_string(Mode m) {
  return m == Mode::exact ? "exact" : "emulated";
}

const std::vector<std::string>& layer_stage_names() {
  static const std::vector<std::string> names{"q_c",  "c",        "kR",  "ql",       "qR",
                                              "qI8",  "qI_scale", "kI8", "kI_scale", "omega",
                                              "topk", "olat",     "lse", "o",        "y"};
  return names;
}

bool is_indexer_stage(std::string_view n) {
  return n == "qI8" || n == "qI_scale" || n == "kI8" || n == "kI_scale" || n == "omega";
}

DType storage_dtype(const Config& cfg, std::string_view s) {
  if (s == "topk") return DType::int32;
  if (s == "qI8" || s == "kI8") return DType::float8_e4m3fn;
  if (s == "qI_scale" || s == "kI_scale" || s == "omega" || s == "lse") return DType::float32;
  return cfg.precision == Precision::bf16 ? DType::bfloat16 : DType::float32;
}

const Tensor* LayerTrace::find(std::string_view name) const {
  for (const Tensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const Tensor& LayerTrace::at(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  throw std::out_of_range("trace has no stage '" + std::string(name) + "'");
}

TopkRows topk_rows(const LayerTrace& lt) {
  const Tensor& t = lt.at("topk");
  TopkRows m(t.shape.at(0), t.shape.at(1));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<int>(t.data[i]);
  return m;
}

StepOptions StepOptions::follow(const Config& cfg, const StepTrace& trace, bool cache_codes) {
  StepOptions o;
  o.topk_override.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_full_layer(l)) o.topk_override[l] = topk_rows(trace.layers.at(l));
  if (cache_codes && cfg.kv_cache == KvCache::fp8_ds_mla) {
    o.latent_override.resize(cfg.num_layers);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const Tensor& c = trace.layers.at(l).at("c");
      const Eigen::Index rows = c.shape.at(0), cols = cfg.kv_lora_rank;
      o.latent_override[l] = Eigen::Map<const Mat>(c.data.data(), rows, cols);
    }
  }
  return o;
}

std::vector<int> select_topk(const std::vector<double>& scores, int K) {
  const int n = static_cast<int>(scores.size());
  std::vector<int> out(K, -1);
  if (n <= K) {
    for (int j = 0; j < n; ++j) out[j] = j;
    return out;
  }
  for (int j = 0; j < n; ++j)
    if (std::isnan(scores[j]))
      throw std::runtime_error("select_topk: NaN index score at position " + std::to_string(j));
  std::vector<int> idx(n);
  for (int j = 0; j < n; ++j) idx[j] = j;
  const auto better = [&](int a, int b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  };
  std::nth_element(idx.begin(), idx.begin() + K, idx.end(), better);
  std::sort(idx.begin(), idx.begin() + K);
  std::copy(idx.begin(), idx.begin() + K, out.begin());
  return out;
}

Oracle::Oracle(Config cfg, std::shared_ptr<const Weights> weights, Mode mode, int num_blocks)
    : cfg_(std::move(cfg)),
      w_(std::move(weights)),
      mode_(mode),
      num_blocks_(num_blocks),
      rope_(cfg_) {
  cfg_.validate();
  if (!w_) throw std::invalid_argument("oracle: no weights");
  w_->check_shapes(cfg_);
  if (num_blocks < 1) throw std::invalid_argument("oracle: num_blocks must be >= 1");
  const Eigen::Index slots = static_cast<Eigen::Index>(num_blocks) * cfg_.block_size;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    LayerCache c;
    c.kv = Mat::Constant(slots, cfg_.kv_entry_dim(), kNaN);  // unreferenced slots stay NaN
    if (cfg_.is_full_layer(l)) {
      c.index_k = Mat::Constant(slots, cfg_.index_head_dim, kNaN);
      c.index_scale = Vec::Constant(slots, kNaN);
    }
    caches_.push_back(std::move(c));
    // indexer_wk_proj is one GEMM over the stacked [w_k; w_w] (BOUNDARIES.md op 3).
    Mat kw;
    if (cfg_.is_full_layer(l)) {
      const IndexerWeights& iw = *w_->layers[l].indexer;
      kw.resize(iw.w_k.rows() + iw.w_w.rows(), iw.w_k.cols());
      kw << iw.w_k, iw.w_w;
    }
    indexer_kw_.push_back(std::move(kw));
  }
}

StepTrace Oracle::step(const StepInput& in, const StepOptions& opts) {
  const Config& c = cfg_;
  const int T = in.capture_size, Ta = in.num_tokens;
  if (static_cast<int>(in.positions.size()) != T || in.hidden.rows() != T)
    throw ScenarioError("step input is not derived: call StepInput::derive() first");
  const int D = c.hidden_size, H = c.num_heads, Rq = c.q_lora_rank, L = c.kv_lora_rank;
  const int dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int dq = dn + dr, HI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk;
  const int B = c.block_size;
  const double sigma = c.softmax_scale();
  const double eps = c.rms_norm_eps;
  const bool round = rounds_bf16();
  const auto store = [round](Mat& m) {  // in place, across the threads for large tensors
    if (!round) return;
    double* p = m.data();
    const std::ptrdiff_t n = m.size();
#pragma omp parallel for schedule(static) if (n >= (std::ptrdiff_t{1} << 16))
    for (std::ptrdiff_t i = 0; i < n; ++i) p[i] = round_bf16(p[i]);
  };
  const auto dtype = [&](const char* s) {
    return mode_ == Mode::exact && std::string_view(s) != "topk" ? DType::float64
                                                                 : storage_dtype(c, s);
  };
  const RopeLayout index_layout =
      c.indexer_rope == IndexerRope::neox ? RopeLayout::neox : RopeLayout::interleaved;

  for (std::int64_t s : in.slots)
    if (s >= static_cast<std::int64_t>(num_blocks_) * B)
      throw ScenarioError("slot " + std::to_string(s) + " outside the cache");

  // RoPE's position (shifted only by the metamorphic-test hook); causality and slots use p(t).
  const auto rope_pos = [&](int t) { return in.positions[t] + opts.rope_position_offset; };
  Mat h = in.hidden;
  TopkRows topk = TopkRows::Constant(T, K, -1);  // the buffer shared by the layers of a forward
  StepTrace trace;
  Laps lap(opts.profile);
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_->layers[l];
    LayerCache& cache = caches_[l];
    LayerTrace lt;
    const auto keep = [&](const char* name, const Mat& m, std::vector<std::int64_t> tail) {
      lap.aside("trace",
                [&] { lt.tensors.push_back(stage(name, m, Ta, std::move(tail), dtype(name))); });
    };

    // input_norm, qkv_a_proj
    Mat x;
    rmsnorm_rows(x, h, lw.g_in, eps);
    store(x);
    lap("input_norm");
    Mat qkv;
    project(qkv, x, lw.w_qkv_a);
    store(qkv);
    lap("qkv_a_proj");

    // norm_rope_cache: q_c, c, kR and the cache insert (padded rows, slot < 0, skipped)
    Mat q_c, lat;
    rmsnorm_rows(q_c, qkv.leftCols(Rq), lw.g_q, eps);
    store(q_c);
    rmsnorm_rows(lat, qkv.middleCols(Rq, L), lw.g_kv, eps);
    Mat kR = qkv.rightCols(dr);
    for (int t = 0; t < T; ++t)
      rope_.apply(row_span(kR, t, 0, dr), rope_pos(t), RopeLayout::interleaved);
    store(kR);
    if (c.kv_cache == KvCache::fp8_ds_mla) {
      for (int t = 0; t < T; ++t) {
        if (in.slots[t] < 0) continue;
        const std::vector<double> back = ds_mla_roundtrip(row_span(lat, t, 0, L));
        std::copy(back.begin(), back.end(), &lat(t, 0));
      }
    }
    store(lat);
    const Mat* follow_lat =
        static_cast<int>(opts.latent_override.size()) > l && opts.latent_override[l]
            ? &*opts.latent_override[l]
            : nullptr;
    if (follow_lat && (follow_lat->rows() != Ta || follow_lat->cols() != L))
      throw ScenarioError("latent override layer " + std::to_string(l) + ": shape " +
                          std::to_string(follow_lat->rows()) + "x" +
                          std::to_string(follow_lat->cols()) + ", expected " + std::to_string(Ta) +
                          "x" + std::to_string(L));
    Mat c_read(Ta, L);  // the trace's c: this run's own cache entries
    for (int t = 0; t < T; ++t) {
      if (in.slots[t] < 0) continue;
      if (t < Ta) c_read.row(t) = lat.row(t);
      if (follow_lat && t < Ta)
        cache.kv.row(in.slots[t]) << follow_lat->row(t), kR.row(t);
      else
        cache.kv.row(in.slots[t]) << lat.row(t), kR.row(t);
    }
    keep("q_c", q_c, {Rq});
    keep("c", c_read, {L});
    keep("kR", kR, {dr});
    lap("norm_rope_cache");

    // q_b_proj, uk_absorb, fused_q (MLA part)
    Mat q;
    project(q, q_c, lw.w_q_b);
    store(q);
    lap("q_b_proj");
    Mat ql(T, static_cast<Eigen::Index>(H) * L), qR(T, static_cast<Eigen::Index>(H) * dr);
    detail::parallel_for(H, [&](int hh) {  // one small GEMM per head: heads across threads
      const auto w_uk = lw.w_kv_b.middleRows(static_cast<Eigen::Index>(hh) * (dn + dv), dn);
      auto block = ql.middleCols(static_cast<Eigen::Index>(hh) * L, L);
      fixed::gemm_nn(block, q.middleCols(static_cast<Eigen::Index>(hh) * dq, dn), w_uk);
      // The bf16 store of this head's block while it is still in cache (a store of the whole
      // ql afterwards reads T x H x L doubles back from memory).
      if (round) round_bf16_rows(block);
    });
    keep("ql", ql, {H, L});
    lap("uk_absorb");
    for (int hh = 0; hh < H; ++hh) {
      qR.middleCols(static_cast<Eigen::Index>(hh) * dr, dr) =
          q.middleCols(static_cast<Eigen::Index>(hh) * dq + dn, dr);
      for (int t = 0; t < T; ++t)
        rope_.apply(row_span(qR, t, static_cast<Eigen::Index>(hh) * dr, dr), rope_pos(t),
                    RopeLayout::interleaved);
    }
    store(qR);
    keep("qR", qR, {H, dr});
    lap("fused_q");

    // Indexer (F layers): indexer_wk_proj, norm_rope_cache's kI part, indexer_wq_b, fused_q's
    // qI part, indexer_topk.
    if (c.is_full_layer(l)) {
      const IndexerWeights& iw = *lw.indexer;
      Mat qI, kw;
      project(kw, x, indexer_kw_[l]);  // one GEMM: [kraw | w]
      store(kw);
      const auto kraw = kw.leftCols(dI);
      const auto wts = kw.rightCols(HI);
      lap("indexer_wk_proj");
      project(qI, q_c, iw.w_q_b);
      store(qI);
      lap("indexer_wq_b");
      const auto rotate_quantize = [&](RowSpan v, int pos, double& scale) {
        rope_.apply(v.first(dr), pos, index_layout);
        if (c.hadamard == Hadamard::on) hadamard_transform(v);
        const Fp8Block b = quantize_ue8m0(v);
        for (int i = 0; i < dI; ++i) v[i] = e4m3_value(b.codes[i]);
        scale = b.scale;
      };
      Mat kI(T, dI);
      Vec kscale(T);
      for (int t = 0; t < T; ++t) {
        const auto r = kraw.row(t).array();
        const double mean = fixed::sum(kraw.row(t).data(), dI) / dI;
        const Eigen::RowVectorXd dev = r - mean;
        const double var = fixed::sum_squares(dev.data(), dI) / dI;
        kI.row(t) =
            (dev.array() / std::sqrt(var + c.indexer_norm_eps)) * iw.g_k.transpose().array() +
            iw.b_k.transpose().array();
        rotate_quantize(row_span(kI, t, 0, dI), rope_pos(t), kscale[t]);
        if (in.slots[t] < 0) continue;
        cache.index_k.row(in.slots[t]) = kI.row(t);
        cache.index_scale[in.slots[t]] = kscale[t];
      }
      lap("norm_rope_cache");
      Mat qscale(T, HI), omega(T, HI);
      const double head_norm = 1.0 / std::sqrt(static_cast<double>(dI) * HI);
      for (int t = 0; t < T; ++t)
        for (int hh = 0; hh < HI; ++hh) {
          rotate_quantize(row_span(qI, t, static_cast<Eigen::Index>(hh) * dI, dI), rope_pos(t),
                          qscale(t, hh));
          omega(t, hh) = wts(t, hh) * qscale(t, hh) * head_norm;
        }
      lap("fused_q");
      keep("qI8", qI, {HI, dI});
      keep("qI_scale", qscale, {HI});
      keep("kI8", kI, {dI});
      keep("kI_scale", Mat(Eigen::Map<const Mat>(kscale.data(), T, 1)), {});
      keep("omega", omega, {HI});

      topk.setConstant(-1);  // clear rows [0, T), then write rows [0, Ta)
      const std::optional<TopkRows>* ov =
          static_cast<int>(opts.topk_override.size()) > l ? &opts.topk_override[l] : nullptr;
      if (ov && ov->has_value()) {
        const TopkRows& o = **ov;
        if (o.rows() != Ta || o.cols() != K)
          throw std::invalid_argument("topk override for layer " + std::to_string(l) +
                                      " has the wrong shape");
        for (int t = 0; t < Ta; ++t)
          for (int k = 0; k < K; ++k)
            if (o(t, k) < -1 || o(t, k) > in.positions[t])
              throw std::invalid_argument("topk override layer " + std::to_string(l) + " row " +
                                          std::to_string(t) + ": index " + std::to_string(o(t, k)) +
                                          " outside [-1, p(t)]");
        topk.topRows(Ta) = o;
      } else {
        // I(t, j) = kscale_j * sum_h omega[h] relu(qI8[h] . kI8_j), a cache block of keys at a
        // time (a block's keys are contiguous in the cache), for groups of a request's tokens.
        constexpr int group = 4;
        std::vector<std::pair<int, int>> items;  // (request, first token of the group)
        for (int r = 0; r < static_cast<int>(in.requests.size()); ++r)
          for (int i = 0; i < in.requests[r].q; i += group) items.emplace_back(r, i);
        detail::parallel_for(static_cast<int>(items.size()), [&](int w) {
          const auto [r, i0] = items[w];
          const RequestStep& rq = in.requests[r];
          const int g = std::min(group, rq.q - i0), t0 = in.token_start[r] + i0;
          const int last = rq.ctx + i0 + g - 1;  // the group's last position
          // The group's query heads as columns, so that a block's dots come out a key a row:
          // each dot one chain over the elements, each score a lane dot over the heads.
          thread_local Mat q_t, dots;
          q_t = ConstMap(&qI(t0, 0), static_cast<Eigen::Index>(g) * HI, dI).transpose();
          thread_local std::vector<double> scores[group];
          for (int i = 0; i < g; ++i) scores[i].resize(rq.ctx + i0 + i + 1);
          for (int j0 = 0; j0 <= last; j0 += B) {
            const int nk = std::min(B, last + 1 - j0);
            const std::int64_t s0 = in.slot_of(r, j0, B);
            dots.resize(nk, q_t.cols());
            fixed::gemm_nn(dots, cache.index_k.middleRows(s0, nk), q_t);
            for (Eigen::Index e = 0; e < dots.size(); ++e)  // relu; NaN stays NaN
              if (dots.data()[e] < 0.0) dots.data()[e] = 0.0;
            for (int i = 0; i < g; ++i) {
              const int n = std::min(nk, rq.ctx + i0 + i + 1 - j0);
              for (int j = 0; j < n; ++j)
                scores[i][j0 + j] =
                    cache.index_scale[s0 + j] * fixed::dot(&dots(j, i * HI), &omega(t0 + i, 0), HI);
            }
          }
          for (int i = 0; i < g; ++i) {
            const std::vector<int> sel = select_topk(scores[i], K);
            for (int k = 0; k < K; ++k) topk(t0 + i, k) = sel[k];
          }
        });
      }
    }
    Mat topk_d = topk.cast<double>();
    keep("topk", topk_d, {K});
    lap("indexer_topk");

    // sparse_mqa over the selected sets, reading the cache
    Mat olat = Mat::Zero(T, static_cast<Eigen::Index>(H) * L);
    Mat lse = Mat::Constant(T, H, -std::numeric_limits<double>::infinity());
    detail::parallel_for(Ta, [&](int t) {
      const int r = in.request_of_token[t];
      std::vector<int> sel;
      for (int k = 0; k < K; ++k)
        if (topk(t, k) >= 0) sel.push_back(topk(t, k));
      if (sel.empty()) return;
      const Eigen::Index n = static_cast<Eigen::Index>(sel.size());
      thread_local Mat kc, qt, z, ot;  // reused token to token (as the indexer's buffers)
      kc.resize(n, L + dr);
      for (Eigen::Index j = 0; j < n; ++j) kc.row(j) = cache.kv.row(in.slot_of(r, sel[j], B));
      qt.resize(H, L + dr);
      qt.leftCols(L) = ConstMap(&ql(t, 0), H, L);
      qt.rightCols(dr) = ConstMap(&qR(t, 0), H, dr);
      z.resize(H, n);
      fixed::gemm_nt(z, qt, kc);
      z *= sigma;
      Vec denom(H);
      for (int hh = 0; hh < H; ++hh) {
        double* zr = &z(hh, 0);
        const double m = *std::max_element(zr, zr + n);
        for (Eigen::Index j = 0; j < n; ++j) zr[j] = std::exp(zr[j] - m);
        denom[hh] = fixed::sum(zr, n);
        lse(t, hh) = m + std::log(denom[hh]);
      }
      if (round) round_bf16_rows(z);  // P in bf16 before P*V
      ot.resize(H, L);
      fixed::gemm_nn(ot, z, kc.leftCols(L));
      ot.array().colwise() /= denom.array();
      Eigen::Map<Mat>(&olat(t, 0), H, L) = ot;
    });
    store(olat);
    keep("olat", olat, {H, L});
    keep("lse", lse, {H});
    lap("sparse_mqa");

    // uv_proj, o_proj, residual_add
    Mat o(T, static_cast<Eigen::Index>(H) * dv);
    detail::parallel_for(H, [&](int hh) {
      const auto w_uv = lw.w_kv_b.middleRows(static_cast<Eigen::Index>(hh) * (dn + dv) + dn, dv);
      fixed::gemm_nt(o.middleCols(static_cast<Eigen::Index>(hh) * dv, dv),
                     olat.middleCols(static_cast<Eigen::Index>(hh) * L, L), w_uv);
    });
    store(o);
    lap("uv_proj");
    Mat y;
    if (opts.o_proj_ranks > 1) {
      // Tensor parallel (MATH.md section 3): each rank's partial product over its heads'
      // columns, stored as that rank's o_proj writes it, then summed in rank order.
      const int R = opts.o_proj_ranks;
      if (H % R != 0)
        throw ConfigError("o_proj_ranks " + std::to_string(R) + " does not divide num_heads " +
                          std::to_string(H));
      const Eigen::Index cols = static_cast<Eigen::Index>(H / R) * dv;
      y = Mat::Zero(T, D);
      Mat part;
      for (int r = 0; r < R; ++r) {
        project(part, o.middleCols(r * cols, cols), lw.w_o.middleCols(r * cols, cols));
        store(part);
        y += part;
      }
    } else {
      project(y, o, lw.w_o);
    }
    store(y);
    lap("o_proj");
    keep("o", o, {static_cast<std::int64_t>(H) * dv});
    keep("y", y, {D});
    h += y;
    store(h);
    lap("residual_add");
    trace.layers.push_back(std::move(lt));
  }
  trace.output = stage("output", h, Ta, {D}, dtype("output"));
  return trace;
}

IndexScores index_score_row(const double* q8, const double* omega, int HI, int dI,
                            const std::vector<const double*>& keys,
                            const std::vector<double>& kscale) {
  IndexScores out;
  out.score.assign(keys.size(), 0.0);
  out.abs_terms.assign(keys.size(), 0.0);
  for (std::size_t j = 0; j < keys.size(); ++j) {
    double acc = 0.0, abs_acc = 0.0;
    for (int hh = 0; hh < HI; ++hh) {
      double dot = 0.0, abs_dot = 0.0;
      for (int i = 0; i < dI; ++i) {
        const double term = q8[static_cast<std::size_t>(hh) * dI + i] * keys[j][i];
        dot += term;
        abs_dot += std::fabs(term);
      }
      acc += omega[hh] * std::max(dot, 0.0);
      abs_acc += std::fabs(omega[hh]) * abs_dot;
    }
    out.score[j] = kscale[j] * acc;
    out.abs_terms[j] = kscale[j] * abs_acc;
  }
  return out;
}

IndexScores Oracle::index_scores(int layer, const StepInput& in, const LayerTrace& lt,
                                 int t) const {
  const LayerCache& cache = caches_.at(layer);
  if (!cfg_.is_full_layer(layer)) throw std::invalid_argument("index_scores: layer is not F");
  const int HI = cfg_.index_n_heads, dI = cfg_.index_head_dim;
  const int r = in.request_of_token.at(t), p = in.positions[t];
  std::vector<const double*> keys;
  std::vector<double> kscale;
  for (int j = 0; j <= p; ++j) {
    const std::int64_t s = in.slot_of(r, j, cfg_.block_size);
    keys.push_back(&cache.index_k(s, 0));
    kscale.push_back(cache.index_scale[s]);
  }
  return index_score_row(&lt.at("qI8").data[static_cast<std::size_t>(t) * HI * dI],
                         &lt.at("omega").data[static_cast<std::size_t>(t) * HI], HI, dI, keys,
                         kscale);
}

}  // namespace dsv32

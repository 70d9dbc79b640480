#include "dsv32/oracle/oracle.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "dsv32/oracle/fixed_order.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "layer_ops.hpp"
#include "parallel.hpp"

namespace dsv32 {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Rows [0, Ta) of m as a tensor of shape (Ta, tail...).
Tensor stage(std::string_view name, const Mat& m, int Ta, std::vector<std::int64_t> tail,
             DType dt) {
  std::vector<std::int64_t> shape{Ta};
  shape.insert(shape.end(), tail.begin(), tail.end());
  std::vector<double> data(m.data(), m.data() + static_cast<std::ptrdiff_t>(Ta) * m.cols());
  return Tensor::from(std::string(name), std::move(shape), std::move(data), dt);
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
  // A trace without a layer's sets (a candidate that does not provide them) leaves that layer
  // to select its own; one without its latent, to quantize its own.
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_full_layer(l) && trace.layers.at(l).find("topk"))
      o.topk_override[l] = topk_rows(trace.layers.at(l));
  if (cache_codes && cfg.kv_cache == KvCache::fp8_ds_mla) {
    o.latent_override.resize(cfg.num_layers);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const Tensor* c = trace.layers.at(l).find("c");
      if (!c) continue;
      const Eigen::Index rows = c->shape.at(0), cols = cfg.kv_lora_rank;
      for (Eigen::Index r = 0; r < rows; ++r)
        if (const DsMlaGrid g = ds_mla_grid({c->data.data() + r * cols, std::size_t(cols)});
            g.off_grid >= 0)
          throw ScenarioError("latent to follow, layer " + std::to_string(l) + " row " +
                              std::to_string(r) + " column " + std::to_string(g.off_grid) +
                              ": not an fp8_ds_mla code times its tile's scale");
      o.latent_override[l] = Eigen::Map<const Mat>(c->data.data(), rows, cols);
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
  for (std::int64_t s : in.slots)
    if (s >= static_cast<std::int64_t>(num_blocks_) * c.block_size)
      throw ScenarioError("slot " + std::to_string(s) + " outside the cache");
  const auto dtype = [&](std::string_view s) {
    return mode_ == Mode::exact && s != "topk" ? DType::float64 : storage_dtype(c, s);
  };
  Mat h = in.hidden;
  TopkRows topk = TopkRows::Constant(T, c.index_topk, -1);  // shared by the layers of a forward
  StepTrace trace;
  Laps lap(opts.profile);
  for (int l = 0; l < c.num_layers; ++l) {
    const detail::LayerContext ctx{c, w_->layers[l], indexer_kw_[l], caches_[l], in, opts, rope_,
                                   l, rounds_bf16()};
    detail::LayerTensors t;
    // BOUNDARIES.md section 1, in order (the F-only ops return at once on S layers).
    detail::input_norm(ctx, h, t);
    lap("input_norm");
    detail::qkv_a_proj(ctx, t);
    lap("qkv_a_proj");
    detail::indexer_wk_proj(ctx, t);
    lap("indexer_wk_proj");
    detail::norm_rope_cache(ctx, t, topk);
    lap("norm_rope_cache");
    detail::q_b_proj(ctx, t);
    lap("q_b_proj");
    detail::uk_absorb(ctx, t);
    lap("uk_absorb");
    detail::indexer_wq_b(ctx, t);
    lap("indexer_wq_b");
    detail::fused_q(ctx, t);
    lap("fused_q");
    detail::indexer_topk(ctx, t, topk);
    lap("indexer_topk");
    detail::sparse_mqa(ctx, topk, t);
    lap("sparse_mqa");
    detail::uv_proj(ctx, t);
    lap("uv_proj");
    detail::o_proj(ctx, t);
    lap("o_proj");
    detail::residual_add(ctx, t, h);
    lap("residual_add");

    // The layer's stages, in the stage table's order, rows [0, Ta).
    LayerTrace lt;
    lap.aside("trace", [&] {
      const Mat kI_scale = Eigen::Map<const Mat>(t.kI_scale.data(), t.kI_scale.size(), 1);
      const Mat topk_values = topk.cast<double>();
      const std::pair<const char*, const Mat*> mats[] = {{"q_c", &t.q_c},
                                                         {"c", &t.c},
                                                         {"kR", &t.kR},
                                                         {"ql", &t.ql},
                                                         {"qR", &t.qR},
                                                         {"qI8", &t.qI},
                                                         {"qI_scale", &t.qI_scale},
                                                         {"kI8", &t.kI},
                                                         {"kI_scale", &kI_scale},
                                                         {"omega", &t.omega},
                                                         {"topk", &topk_values},
                                                         {"olat", &t.olat},
                                                         {"lse", &t.lse},
                                                         {"o", &t.o},
                                                         {"y", &t.y}};
      for (const std::string& name : layer_stage_names()) {
        if (is_indexer_stage(name) && !c.is_full_layer(l)) continue;
        const Mat* m = nullptr;
        for (const auto& [n, p] : mats)
          if (name == n) m = p;
        if (!m) throw std::logic_error("oracle: no tensor for stage '" + name + "'");
        lt.tensors.push_back(stage(name, *m, Ta, stage_tail(c, name), dtype(name)));
      }
    });
    trace.layers.push_back(std::move(lt));
  }
  trace.output = stage("output", h, Ta, stage_tail(c, "output"), dtype("output"));
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

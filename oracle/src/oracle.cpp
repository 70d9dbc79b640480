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
Tensor stage(Stage s, const Mat& m, int Ta, std::vector<std::int64_t> tail, DType dt) {
  std::vector<std::int64_t> shape{Ta};
  shape.insert(shape.end(), tail.begin(), tail.end());
  std::vector<double> data(m.data(), m.data() + static_cast<std::ptrdiff_t>(Ta) * m.cols());
  return Tensor::from(stage_name(s), std::move(shape), std::move(data), dt);
}

/// Attributes the wall time since the previous lap to the op just finished.
class Laps {
 public:
  explicit Laps(Profile* p) : p_(p), t_(std::chrono::steady_clock::now()) {}
  /// Charges the time since the last lap, less what went aside, to `op`.
  void operator()(Op op) {
    if (!p_) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[op] += std::chrono::duration<double>(now - t_).count() - aside_;
    t_ = now;
    aside_ = 0.0;
  }
  /// Runs f and charges its time to the trace instead of the op in progress (the trace's copies
  /// are the oracle's bookkeeping, not the op's arithmetic).
  template <class F>
  void trace(F&& f) {
    if (!p_) return f();
    const auto a = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    aside_ += s;
    p_->trace += s;
  }

 private:
  Profile* p_;
  std::chrono::steady_clock::time_point t_;
  double aside_ = 0.0;
};

}  // namespace

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

const Tensor* LayerTrace::find(Stage stage) const {
  return find(stage_info(stage).name);
}

const Tensor& LayerTrace::at(Stage stage) const {
  return at(stage_info(stage).name);
}

TopkRows topk_rows(const LayerTrace& lt) {
  const Tensor& t = lt.at(Stage::topk);
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
    if (cfg.is_full_layer(l) && trace.layers.at(l).find(Stage::topk) &&
        !(cfg.dcp_size > 1 && cfg.dcp_indexer_mode == DcpIndexerMode::union_))
      o.topk_override[l] = topk_rows(trace.layers.at(l));  // under union: each rank's, below
  o.dcp_topk_override.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l)
    if (const LayerTrace& lt = trace.layers.at(l); cfg.is_full_layer(l) && lt.dcp)
      for (const IndexRows& rows : lt.dcp->rows) o.dcp_topk_override[l].push_back(rows.cast<int>());
  if (cache_codes && cfg.kv_cache == KvCache::fp8_ds_mla) {
    o.latent_override.resize(cfg.num_layers);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const Tensor* c = trace.layers.at(l).find(Stage::c);
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
  const auto dtype = [&](Stage s) {
    return mode_ == Mode::exact && stage_info(s).storage != Storage::int32 ? DType::float64
                                                                           : storage_dtype(c, s);
  };
  load_given(in);
  Mat h = in.hidden;
  TopkRows topk = TopkRows::Constant(T, c.index_topk, -1);  // shared by the layers of a forward
  std::optional<detail::DcpState> dcp;
  if (c.dcp_size > 1 || opts.dcp_path) {
    dcp.emplace();
    dcp->layout = DcpLayout::of(c);
    dcp->rows.assign(c.dcp_size, topk);
    dcp->tables =
        in.dcp_tables.empty() ? dcp_tables(in, c, opts.dcp_tables, num_blocks_) : in.dcp_tables;
    check_dcp_tables(in, c, dcp->tables, num_blocks_);
  }
  StepTrace trace;
  Laps lap(opts.profile);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerTrace lt;
    if (dcp) dcp->trace = &lt.dcp.emplace();
    const detail::LayerContext ctx{
        c, w_->layers[l], indexer_kw_[l],       caches_[l], in, opts, rope_,
        l, rounds_bf16(), dcp ? &*dcp : nullptr};
    detail::LayerTensors t;
    for (const Op op : layer_ops(c, l)) {
      detail::run_op(op, ctx, t, h, topk);
      lap(op);
    }

    // The layer's stages, in the stage table's order, rows [0, Ta).
    lap.trace([&] {
      const Mat kI_scale = Eigen::Map<const Mat>(t.kI_scale.data(), t.kI_scale.size(), 1);
      const Mat topk_values = topk.cast<double>();
      const auto mat = [&](Stage s) -> const Mat& {
        switch (s) {
          case Stage::q_c:
            return t.q_c;
          case Stage::c:
            return t.c;
          case Stage::kR:
            return t.kR;
          case Stage::ql:
            return t.ql;
          case Stage::qR:
            return t.qR;
          case Stage::qI8:
            return t.qI;
          case Stage::qI_scale:
            return t.qI_scale;
          case Stage::kI8:
            return t.kI;
          case Stage::kI_scale:
            return kI_scale;
          case Stage::omega:
            return t.omega;
          case Stage::topk:
            return topk_values;
          case Stage::olat:
            return t.olat;
          case Stage::lse:
            return t.lse;
          case Stage::o:
            return t.o;
          case Stage::y:
            return t.y;
          case Stage::output:
            break;
        }
        throw std::logic_error("oracle: no tensor for stage " + stage_name(s));
      };
      for (const Stage s : layer_stages()) {
        if (stage_info(s).indexer && !c.is_full_layer(l)) continue;
        lt.tensors.push_back(stage(s, mat(s), Ta, stage_tail(c, s), dtype(s)));
      }
    });
    trace.layers.push_back(std::move(lt));
  }
  trace.output = stage(Stage::output, h, Ta, stage_tail(c, Stage::output), dtype(Stage::output));
  return trace;
}

void Oracle::load_given(const StepInput& in) {
  const int B = cfg_.block_size, E = cfg_.kv_entry_dim(), L = cfg_.kv_lora_rank;
  for (const auto& g : in.given) {
    int r = 0;
    while (in.requests.at(r).id != g->request_id) ++r;
    for (int l = 0; l < cfg_.num_layers; ++l) {
      LayerCache& c = caches_[l];
      const PrefixLayer& pl = g->layers.at(l);
#pragma omp parallel for schedule(static)
      for (int p = 0; p < g->length; ++p) {
        const std::int64_t slot = in.slot_of(r, p, B);
        g->latent_row(cfg_, l, p, &c.kv(slot, 0));
        for (int i = L; i < E; ++i) c.kv(slot, i) = pl.k_rope(p, i - L);
        if (!cfg_.is_full_layer(l)) continue;
        c.index_k.row(slot) = pl.index_k.row(p);
        c.index_scale[slot] = pl.index_scale[p];
      }
    }
  }
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
  return index_score_row(&lt.at(Stage::qI8).data[static_cast<std::size_t>(t) * HI * dI],
                         &lt.at(Stage::omega).data[static_cast<std::size_t>(t) * HI], HI, dI, keys,
                         kscale);
}

}  // namespace dsv32

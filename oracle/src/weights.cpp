#include "dsv32/oracle/weights.hpp"

#include <cmath>
#include <string>

#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32 {
namespace {

std::string stream_name(int layer, const char* name) {
  return "layer" + std::to_string(layer) + "/" + name;
}

Mat random_matrix(std::uint64_t seed, int layer, const char* name, int rows, int cols) {
  const rng::Stream s(seed, stream_name(layer, name));
  const double scale = std::sqrt(3.0 / cols);
  Mat m(rows, cols);
  double* d = m.data();
  const std::int64_t n = m.size();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) d[i] = round_bf16(s.symmetric(i) * scale);
  return m;
}

Vec random_vector(std::uint64_t seed, int layer, const char* name, int n, double center,
                  double spread) {
  const rng::Stream s(seed, stream_name(layer, name));
  Vec v(n);
  for (int i = 0; i < n; ++i) v[i] = round_bf16(center + spread * s.symmetric(i));
  return v;
}

void expect_shape(const Mat& m, int rows, int cols, int layer, const char* name) {
  if (m.rows() != rows || m.cols() != cols)
    throw ConfigError("weight layer" + std::to_string(layer) + "/" + name + ": shape (" +
                      std::to_string(m.rows()) + ", " + std::to_string(m.cols()) + "), expected (" +
                      std::to_string(rows) + ", " + std::to_string(cols) + ")");
}

void expect_shape(const Vec& v, int n, int layer, const char* name) {
  if (v.size() != n)
    throw ConfigError("weight layer" + std::to_string(layer) + "/" + name + ": length " +
                      std::to_string(v.size()) + ", expected " + std::to_string(n));
}

}  // namespace

Weights Weights::generate(const Config& cfg, std::uint64_t seed) {
  cfg.validate();
  const int D = cfg.hidden_size, H = cfg.num_heads, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank;
  const int dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim;
  const int HI = cfg.index_n_heads, dI = cfg.index_head_dim;
  Weights w;
  for (int l = 0; l < cfg.num_layers; ++l) {
    LayerWeights lw;
    lw.w_qkv_a = random_matrix(seed, l, "w_qkv_a", cfg.qkv_a_rows(), D);
    lw.g_q = random_vector(seed, l, "g_q", Rq, 1.0, 0.25);
    lw.g_kv = random_vector(seed, l, "g_kv", L, 1.0, 0.25);
    lw.w_q_b = random_matrix(seed, l, "w_q_b", H * (dn + dr), Rq);
    lw.w_kv_b = random_matrix(seed, l, "w_kv_b", H * (dn + dv), L);
    lw.w_o = random_matrix(seed, l, "w_o", D, H * dv);
    lw.g_in = random_vector(seed, l, "g_in", D, 1.0, 0.25);
    if (cfg.is_full_layer(l)) {
      IndexerWeights iw;
      iw.w_q_b = random_matrix(seed, l, "indexer/w_q_b", HI * dI, Rq);
      iw.w_k = random_matrix(seed, l, "indexer/w_k", dI, D);
      iw.w_w = random_matrix(seed, l, "indexer/w_w", HI, D);
      iw.g_k = random_vector(seed, l, "indexer/g_k", dI, 1.0, 0.25);
      iw.b_k = random_vector(seed, l, "indexer/b_k", dI, 0.0, 0.1);
      lw.indexer = std::move(iw);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

void Weights::check_shapes(const Config& cfg) const {
  const int D = cfg.hidden_size, H = cfg.num_heads, Rq = cfg.q_lora_rank, L = cfg.kv_lora_rank;
  const int dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim;
  const int HI = cfg.index_n_heads, dI = cfg.index_head_dim;
  if (static_cast<int>(layers.size()) != cfg.num_layers)
    throw ConfigError("weights: " + std::to_string(layers.size()) + " layers, config has " +
                      std::to_string(cfg.num_layers));
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerWeights& lw = layers[l];
    expect_shape(lw.w_qkv_a, cfg.qkv_a_rows(), D, l, "w_qkv_a");
    expect_shape(lw.g_q, Rq, l, "g_q");
    expect_shape(lw.g_kv, L, l, "g_kv");
    expect_shape(lw.w_q_b, H * (dn + dr), Rq, l, "w_q_b");
    expect_shape(lw.w_kv_b, H * (dn + dv), L, l, "w_kv_b");
    expect_shape(lw.w_o, D, H * dv, l, "w_o");
    expect_shape(lw.g_in, D, l, "g_in");
    if (cfg.is_full_layer(l) != lw.indexer.has_value())
      throw ConfigError("weights layer" + std::to_string(l) + ": indexer weights " +
                        (lw.indexer ? "present on an S layer" : "missing on an F layer"));
    if (!lw.indexer) continue;
    expect_shape(lw.indexer->w_q_b, HI * dI, Rq, l, "indexer/w_q_b");
    expect_shape(lw.indexer->w_k, dI, D, l, "indexer/w_k");
    expect_shape(lw.indexer->w_w, HI, D, l, "indexer/w_w");
    expect_shape(lw.indexer->g_k, dI, l, "indexer/g_k");
    expect_shape(lw.indexer->b_k, dI, l, "indexer/b_k");
  }
}

LayerWeights Weights::head_shard(const Config& cfg, int layer, int h0, int h1) const {
  const LayerWeights& src = layers.at(layer);
  const int dq = cfg.qk_head_dim(), dkv = cfg.qk_nope_head_dim + cfg.v_head_dim;
  const int dv = cfg.v_head_dim, n = h1 - h0;
  LayerWeights s = src;
  s.w_q_b = src.w_q_b.middleRows(static_cast<Eigen::Index>(h0) * dq, n * dq);
  s.w_kv_b = src.w_kv_b.middleRows(static_cast<Eigen::Index>(h0) * dkv, n * dkv);
  s.w_o = src.w_o.middleCols(static_cast<Eigen::Index>(h0) * dv, n * dv);
  return s;
}

}  // namespace dsv32

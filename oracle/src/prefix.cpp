#include "dsv32/oracle/prefix.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "dsv32/oracle/scenario.hpp"

namespace dsv32 {
namespace {

/// A value as the cache stores an activation of this precision.
double stored(const Config& cfg, double v) {
  return cfg.precision == Precision::bf16 ? round_bf16(v)
                                          : static_cast<double>(static_cast<float>(v));
}

/// Unit-variance draws (the spread of a normalized row, of a rotated k_pe, of a LayerNorm'd key).
double unit(const rng::Stream& s, std::uint64_t i) {
  return std::sqrt(3.0) * s.symmetric(i);
}

[[noreturn]] void refuse(const GivenPrefix& g, int l, const std::string& what) {
  throw ScenarioError("given prefix of request " + std::to_string(g.request_id) + ", layer " +
                      std::to_string(l) + ": " + what);
}

void expect_shape(const GivenPrefix& g, int l, const char* name, const Mat& m, Eigen::Index rows,
                  Eigen::Index cols) {
  if (m.rows() != rows || m.cols() != cols)
    refuse(g, l,
           std::string(name) + " has shape (" + std::to_string(m.rows()) + ", " +
               std::to_string(m.cols()) + "), expected (" + std::to_string(rows) + ", " +
               std::to_string(cols) + ")");
}

bool is_e4m3(double v) {
  return std::isfinite(v) && round_e4m3(v) == v;
}

}  // namespace

void GivenPrefix::check(const Config& cfg) const {
  if (length < 1)
    throw ScenarioError("given prefix of request " + std::to_string(request_id) + ": length " +
                        std::to_string(length) + " must be >= 1");
  if (static_cast<int>(layers.size()) != cfg.num_layers)
    throw ScenarioError("given prefix of request " + std::to_string(request_id) + ": " +
                        std::to_string(layers.size()) + " layers, the config has " +
                        std::to_string(cfg.num_layers));
  const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, dI = cfg.index_head_dim;
  const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const PrefixLayer& pl = layers[l];
    expect_shape(*this, l, "latent", pl.latent, length, L);
    expect_shape(*this, l, "latent_scale", pl.latent_scale, fp8 ? length : 0,
                 fp8 ? (L + kDsMlaTile - 1) / kDsMlaTile : 0);
    expect_shape(*this, l, "k_rope", pl.k_rope, length, dr);
    const bool full = cfg.is_full_layer(l);
    expect_shape(*this, l, "index_k", pl.index_k, full ? length : 0, full ? dI : 0);
    if (pl.index_scale.size() != (full ? length : 0))
      refuse(*this, l,
             "index_scale has " + std::to_string(pl.index_scale.size()) + " values, expected " +
                 std::to_string(full ? length : 0));
    const auto first_bad = [&](const Mat& m, auto ok) -> Eigen::Index {
      for (Eigen::Index i = 0; i < m.size(); ++i)
        if (!ok(m.data()[i])) return i;
      return -1;
    };
    const auto where = [](const Mat& m, Eigen::Index i) {
      return " at row " + std::to_string(i / m.cols()) + " column " + std::to_string(i % m.cols());
    };
    if (const auto i = first_bad(
            pl.latent, fp8 ? is_e4m3 : [](double v) { return std::isfinite(v); });
        i >= 0)
      refuse(*this, l,
             std::string("latent") + where(pl.latent, i) +
                 (fp8 ? " is no finite e4m3 code" : " is not finite"));
    if (const auto i = first_bad(
            pl.latent_scale,
            [](double v) { return std::isfinite(v) && v > 0 && static_cast<float>(v) == v; });
        i >= 0)
      refuse(*this, l, "latent_scale" + where(pl.latent_scale, i) + " is no positive fp32 value");
    if (const auto i = first_bad(pl.k_rope, [](double v) { return std::isfinite(v); }); i >= 0)
      refuse(*this, l, "k_rope" + where(pl.k_rope, i) + " is not finite");
    if (const auto i = first_bad(pl.index_k, is_e4m3); i >= 0)
      refuse(*this, l, "index_k" + where(pl.index_k, i) + " is no finite e4m3 code");
    for (Eigen::Index p = 0; p < pl.index_scale.size(); ++p) {
      const double s = pl.index_scale[p];
      int e = 0;
      if (!(std::isfinite(s) && s > 0 && std::frexp(s, &e) == 0.5))
        refuse(*this, l, "index_scale at row " + std::to_string(p) + " is no power of two");
    }
  }
}

void GivenPrefix::latent_row(const Config& cfg, int layer, int p, double* out) const {
  const PrefixLayer& pl = layers.at(layer);
  const int L = cfg.kv_lora_rank;
  if (cfg.kv_cache != KvCache::fp8_ds_mla) {
    for (int i = 0; i < L; ++i) out[i] = pl.latent(p, i);
    return;
  }
  // As the model's quantizer reads a tile back: the code's value times the scale, in fp32.
  for (int i = 0; i < L; ++i) {
    const float s = static_cast<float>(pl.latent_scale(p, i / kDsMlaTile));
    out[i] = static_cast<float>(pl.latent(p, i)) * s;
  }
}

GivenPrefix draw_prefix(const Config& cfg, std::uint64_t seed, int request_id, int length,
                        const HiddenShape& shape) {
  GivenPrefix g;
  g.request_id = request_id;
  g.length = length;
  const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, dI = cfg.index_head_dim;
  const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
  const int tiles = (L + kDsMlaTile - 1) / kDsMlaTile;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::string key =
        "prefix/request" + std::to_string(request_id) + "/layer" + std::to_string(l);
    // A distinct position of a shaped prefix draws from streams of its own.
    const rng::Stream streams[2][3] = {
        {{seed, key + "/latent"}, {seed, key + "/k_rope"}, {seed, key + "/index_k"}},
        {{seed, key + "/distinct/latent"},
         {seed, key + "/distinct/k_rope"},
         {seed, key + "/distinct/index_k"}}};
    PrefixLayer pl;
    pl.latent.resize(length, L);
    pl.k_rope.resize(length, dr);
    if (fp8) pl.latent_scale.resize(length, tiles);
    const bool full = cfg.is_full_layer(l);
    if (full) {
      pl.index_k.resize(length, dI);
      pl.index_scale.resize(length);
    }
#pragma omp parallel for schedule(static)
    for (int p = 0; p < length; ++p) {
      const bool own =
          std::find(shape.distinct.begin(), shape.distinct.end(), p) != shape.distinct.end();
      const std::uint64_t row =
          static_cast<std::uint64_t>(own || shape.repeat <= 0 ? p : p % shape.repeat);
      const rng::Stream &lat = streams[own][0], &rope = streams[own][1], &idx = streams[own][2];
      std::vector<double> v(L);
      for (int i = 0; i < L; ++i) v[i] = stored(cfg, unit(lat, row * L + i));
      if (fp8) {
        // The model's quantizer, tile by tile: the codes and scale the cache would hold for v.
        for (int t = 0; t < tiles; ++t) {
          const int i0 = t * kDsMlaTile, i1 = std::min(L, i0 + kDsMlaTile);
          double amax = 0.0;
          for (int i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(v[i]));
          const float s = ds_mla_tile_scale(amax);
          pl.latent_scale(p, t) = s;
          for (int i = i0; i < i1; ++i)
            pl.latent(p, i) = e4m3_value(e4m3_bits(static_cast<float>(v[i]) / s));
        }
      } else {
        for (int i = 0; i < L; ++i) pl.latent(p, i) = v[i];
      }
      for (int i = 0; i < dr; ++i) pl.k_rope(p, i) = stored(cfg, unit(rope, row * dr + i));
      if (!full) continue;
      std::vector<double> k(dI);
      for (int i = 0; i < dI; ++i) k[i] = unit(idx, row * dI + i);
      const Fp8Block b = quantize_ue8m0(k);
      for (int i = 0; i < dI; ++i) pl.index_k(p, i) = e4m3_value(b.codes[i]);
      pl.index_scale[p] = b.scale;
    }
    g.layers.push_back(std::move(pl));
  }
  return g;
}

}  // namespace dsv32

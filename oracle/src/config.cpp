#include "dsv32/oracle/config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace dsv32 {
namespace {

template <class E, std::size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

constexpr Names<IndexerRope, 2> kIndexerRope{
    {{IndexerRope::neox, "neox"}, {IndexerRope::interleaved, "interleaved"}}};
constexpr Names<Hadamard, 2> kHadamard{{{Hadamard::off, "off"}, {Hadamard::on, "on"}}};
constexpr Names<KvCache, 2> kKvCache{
    {{KvCache::bf16, "bf16"}, {KvCache::fp8_ds_mla, "fp8_ds_mla"}}};
constexpr Names<RopeTable, 2> kRopeTable{{{RopeTable::fp32, "fp32"}, {RopeTable::bf16, "bf16"}}};
constexpr Names<Precision, 2> kPrecision{{{Precision::bf16, "bf16"}, {Precision::fp32, "fp32"}}};
constexpr Names<DcpIndexerMode, 2> kDcpIndexerMode{
    {{DcpIndexerMode::exact, "exact"}, {DcpIndexerMode::union_, "union"}}};

template <class E, std::size_t N>
std::string_view name_of(const Names<E, N>& names, E v) {
  for (const auto& [e, s] : names)
    if (e == v) return s;
  return "?";
}

template <class E, std::size_t N>
E parse_in(const Names<E, N>& names, std::string_view field, std::string_view text) {
  std::string known;
  for (const auto& [e, s] : names) {
    if (s == text) return e;
    known += (known.empty() ? "" : "|") + std::string(s);
  }
  throw ConfigError("config field '" + std::string(field) + "': unknown value '" +
                    std::string(text) + "' (expected " + known + ")");
}

void require(bool ok, std::string_view field, const std::string& why) {
  if (!ok) throw ConfigError("config field '" + std::string(field) + "': " + why);
}

Config small(std::string name, int layers, std::string pattern) {
  Config c;
  c.name = std::move(name);
  c.num_layers = layers;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 8;
  c.block_size = 5;
  c.index_topk_pattern = std::move(pattern);
  return c;
}

}  // namespace

std::string_view to_string(IndexerRope v) {
  return name_of(kIndexerRope, v);
}
std::string_view to_string(Hadamard v) {
  return name_of(kHadamard, v);
}
std::string_view to_string(KvCache v) {
  return name_of(kKvCache, v);
}
std::string_view to_string(RopeTable v) {
  return name_of(kRopeTable, v);
}
std::string_view to_string(Precision v) {
  return name_of(kPrecision, v);
}
std::string_view to_string(DcpIndexerMode v) {
  return name_of(kDcpIndexerMode, v);
}

template <>
IndexerRope parse_enum<IndexerRope>(std::string_view f, std::string_view t) {
  return parse_in(kIndexerRope, f, t);
}
template <>
Hadamard parse_enum<Hadamard>(std::string_view f, std::string_view t) {
  return parse_in(kHadamard, f, t);
}
template <>
KvCache parse_enum<KvCache>(std::string_view f, std::string_view t) {
  return parse_in(kKvCache, f, t);
}
template <>
RopeTable parse_enum<RopeTable>(std::string_view f, std::string_view t) {
  return parse_in(kRopeTable, f, t);
}
template <>
Precision parse_enum<Precision>(std::string_view f, std::string_view t) {
  return parse_in(kPrecision, f, t);
}
template <>
DcpIndexerMode parse_enum<DcpIndexerMode>(std::string_view f, std::string_view t) {
  return parse_in(kDcpIndexerMode, f, t);
}

void Config::validate() const {
  require(num_layers >= 1 && num_layers <= kMaxConfigLayers, "num_layers",
          "must be in [1, " + std::to_string(kMaxConfigLayers) + "], got " +
              std::to_string(num_layers));
  const std::pair<const char*, int> sizes[] = {{"hidden_size", hidden_size},
                                               {"num_heads", num_heads},
                                               {"q_lora_rank", q_lora_rank},
                                               {"kv_lora_rank", kv_lora_rank},
                                               {"qk_nope_head_dim", qk_nope_head_dim},
                                               {"qk_rope_head_dim", qk_rope_head_dim},
                                               {"v_head_dim", v_head_dim},
                                               {"index_n_heads", index_n_heads},
                                               {"index_head_dim", index_head_dim},
                                               {"index_topk", index_topk},
                                               {"block_size", block_size}};
  for (const auto& [field, v] : sizes)
    require(v >= 1 && v <= kMaxConfigSize, field,
            "must be in [1, " + std::to_string(kMaxConfigSize) + "], got " + std::to_string(v));
  require(qk_rope_head_dim >= 2 && qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
          "must be even and >= 2, got " + std::to_string(qk_rope_head_dim));
  require(index_head_dim == 128, "index_head_dim",
          "must be 128 (one fp8 block), got " + std::to_string(index_head_dim));
  require(qk_rope_head_dim <= index_head_dim, "qk_rope_head_dim", "must be <= index_head_dim");
  require(std::isfinite(rms_norm_eps) && rms_norm_eps > 0, "rms_norm_eps",
          "must be finite and > 0");
  require(std::isfinite(indexer_norm_eps) && indexer_norm_eps > 0, "indexer_norm_eps",
          "must be finite and > 0");
  require(std::isfinite(rope_theta) && rope_theta > 1, "rope_theta", "must be finite and > 1");
  if (rope_scaling) {
    const Yarn& y = *rope_scaling;
    require(std::isfinite(y.factor) && y.factor >= 1, "rope_scaling.factor",
            "must be finite and >= 1");
    require(y.original_max_position_embeddings >= 1,
            "rope_scaling.original_max_position_embeddings", "must be >= 1");
    require(std::isfinite(y.beta_fast) && std::isfinite(y.beta_slow), "rope_scaling.beta_fast",
            "beta_fast and beta_slow must be finite");
    require(y.beta_fast > y.beta_slow, "rope_scaling.beta_fast", "must exceed beta_slow");
    require(std::isfinite(y.mscale) && std::isfinite(y.mscale_all_dim), "rope_scaling.mscale",
            "mscale and mscale_all_dim must be finite");
  }
  require(static_cast<int>(index_topk_pattern.size()) == num_layers, "index_topk_pattern",
          "needs one letter per layer (" + std::to_string(num_layers) + "), got '" +
              index_topk_pattern + "'");
  require(std::all_of(index_topk_pattern.begin(), index_topk_pattern.end(),
                      [](char ch) { return ch == 'F' || ch == 'S'; }),
          "index_topk_pattern", "letters must be F or S, got '" + index_topk_pattern + "'");
  require(index_topk_pattern.front() == 'F', "index_topk_pattern",
          "layer 0 must be F (it owns the first indexer), got '" + index_topk_pattern + "'");
  require(dcp_size >= 1 && dcp_size <= kMaxDcpSize, "dcp_size",
          "must be in [1, " + std::to_string(kMaxDcpSize) + "], got " + std::to_string(dcp_size));
  require(dcp_interleave >= 1 && dcp_interleave <= kMaxConfigSize, "dcp_interleave",
          "must be in [1, " + std::to_string(kMaxConfigSize) + "], got " +
              std::to_string(dcp_interleave));
  require(block_size % dcp_interleave == 0, "dcp_interleave",
          "must divide block_size (vLLM refuses other layouts), got I = " +
              std::to_string(dcp_interleave) + " with B = " + std::to_string(block_size));
}

double Config::softmax_scale() const {
  double m = 1.0;
  if (rope_scaling && rope_scaling->factor > 1.0)
    m = 0.1 * rope_scaling->mscale_all_dim * std::log(rope_scaling->factor) + 1.0;
  return m * m / std::sqrt(static_cast<double>(qk_head_dim()));
}

Config Config::tp_shard(int tp) const {
  if (tp < 1 || num_heads % tp != 0)
    throw ConfigError("tp: " + std::to_string(tp) + " does not divide num_heads " +
                      std::to_string(num_heads));
  if (tp > 1 && tp % dcp_size != 0)  // tp 1: no group; the DCP ranks are emulated, unsharded
    throw ConfigError("tp: " + std::to_string(tp) + " is not a multiple of dcp_size " +
                      std::to_string(dcp_size) +
                      " (a DCP group is dcp_size ranks of the tensor-parallel group)");
  Config c = *this;
  c.num_heads = num_heads / tp;
  return c;
}

namespace {

Config dsv32_like(std::string_view name, int num_heads) {
  Config c;
  c.name = std::string(name);
  c.hidden_size = 7168;
  c.num_heads = num_heads;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.index_n_heads = 64;
  c.index_topk = 2048;
  c.block_size = 64;
  return c;
}

Config glm52() {
  Config c;
  c.name = "glm52";
  c.hidden_size = 6144;
  c.num_heads = 64;
  c.q_lora_rank = 2048;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 192;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 256;
  c.index_n_heads = 32;
  c.index_topk = 2048;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 8e6;
  c.rope_scaling.reset();
  c.indexer_rope = IndexerRope::interleaved;
  return c;
}

Config tiny_deep() {
  Config c = small("tiny-deep", 4, "FSSF");
  c.index_topk = 4;
  c.block_size = 3;
  return c;
}

Config tiny_wide() {
  Config c = small("tiny-wide", 2, "FS");
  c.hidden_size = 128;
  c.num_heads = 8;
  c.q_lora_rank = 96;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.index_n_heads = 8;
  c.index_topk = 32;
  c.block_size = 16;
  return c;
}

struct PresetMaker {
  std::string_view name;
  Config (*make)();
};

// The presets, in preset_names() order.
constexpr PresetMaker kPresets[] = {
    {"dsv32", [] { return dsv32_like("dsv32", 128); }},
    {"dsv32-tp4", [] { return dsv32_like("dsv32-tp4", 32); }},
    {"glm52", glm52},
    {"tiny", [] { return small("tiny", 1, "F"); }},
    {"tiny-fs", [] { return small("tiny-fs", 3, "FSF"); }},
    {"tiny-deep", tiny_deep},
    {"tiny-wide", tiny_wide},
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetMaker& p : kPresets) names.emplace_back(p.name);
  return names;
}

Config preset(std::string_view name) {
  for (const PresetMaker& p : kPresets)
    if (p.name == name) {
      Config c = p.make();
      c.validate();
      return c;
    }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

std::string topk_pattern_from_vllm(int num_layers, int freq, int offset) {
  if (freq < 1) throw ConfigError("index_topk_freq must be >= 1");
  std::string p;
  for (int l = 0; l < num_layers; ++l) p += (std::max(l - offset + 1, 0) % freq != 0) ? 'S' : 'F';
  return p;
}

double Config::layer_weight_count() const {
  const double D = hidden_size, H = num_heads, Rq = q_lora_rank, L = kv_lora_rank,
               dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim, HI = index_n_heads,
               dI = index_head_dim;
  return qkv_a_rows() * D + H * (dn + dr) * Rq + H * (dn + dv) * L + D * H * dv + HI * dI * Rq +
         (dI + HI) * D;
}

}  // namespace dsv32

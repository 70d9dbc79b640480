// Config <-> GOLDEN.md's config JSON: strict keys, every field named when it is wrong.
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "dsv32/golden/golden.hpp"
#include "dsv32/golden/json_text.hpp"

namespace dsv32::golden {
namespace {

using nlohmann::json;

const json& member(const json& j, const char* key, const char* where) {
  if (!j.contains(key))
    throw h5::GoldenError(std::string("config JSON: missing key '") + where + key + "'");
  return j.at(key);
}

std::string shown(const json& v) {
  return quote_json(v);
}

/// An integer key: a JSON integer (not a float, not a boolean) that fits in int32 (the
/// config's own bounds are Config::validate's).
int required_int(const json& j, const char* key, const char* where = "") {
  const json& v = member(j, key, where);
  const auto fail = [&](const char* what) {
    throw h5::GoldenError(std::string("config JSON: key '") + where + key + "': expected " + what +
                          ", got " + shown(v));
  };
  if (!v.is_number_integer()) fail("an integer");
  if (v.is_number_unsigned()
          ? v.get<std::uint64_t>() > INT32_MAX
          : v.get<std::int64_t>() < INT32_MIN || v.get<std::int64_t>() > INT32_MAX)
    fail("an integer that fits in int32");
  return static_cast<int>(v.get<std::int64_t>());
}

/// A real key: a finite JSON number (not a boolean).
double required_real(const json& j, const char* key, const char* where = "") {
  const json& v = member(j, key, where);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw h5::GoldenError(std::string("config JSON: key '") + where + key +
                          "': expected a finite number, got " + shown(v));
  return v.get<double>();
}

std::string required_string(const json& j, const char* key, const char* where = "") {
  const json& v = member(j, key, where);
  if (!v.is_string())
    throw h5::GoldenError(std::string("config JSON: key '") + where + key +
                          "': expected a string, got " + shown(v));
  return v.get<std::string>();
}

}  // namespace

std::string config_to_json(const Config& c) {
  json j;
  j["num_layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["num_heads"] = c.num_heads;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["indexer_norm_eps"] = c.indexer_norm_eps;
  j["block_size"] = c.block_size;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    const Yarn& y = *c.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", y.factor},
                         {"original_max_position_embeddings", y.original_max_position_embeddings},
                         {"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"mscale", y.mscale},
                         {"mscale_all_dim", y.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["index_topk_pattern"] = c.index_topk_pattern;
  j["indexer_rope"] = to_string(c.indexer_rope);
  j["hadamard"] = to_string(c.hadamard);
  j["kv_cache"] = to_string(c.kv_cache);
  j["rope_table"] = to_string(c.rope_table);
  j["precision"] = to_string(c.precision);
  // Written only under DCP, so that every golden without it keeps its bytes.
  if (c.dcp_size != 1 || c.dcp_interleave != 1 || c.dcp_indexer_mode != DcpIndexerMode::exact) {
    j["dcp_size"] = c.dcp_size;
    j["dcp_interleave"] = c.dcp_interleave;
    j["dcp_indexer_mode"] = to_string(c.dcp_indexer_mode);
  }
  j["name"] = c.name;
  return j.dump();
}

Config config_from_json(const std::string& text) {
  json j;
  try {
    j = parse_json_strict(text, "config JSON");
  } catch (const JsonError& e) {
    throw h5::GoldenError(e.what());
  }
  if (!j.is_object())
    throw h5::GoldenError("config JSON: expected an object of GOLDEN.md's keys, got " +
                          std::string(j.type_name()) + " " + shown(j));
  Config c;
  c.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : "custom";
  c.num_layers = required_int(j, "num_layers");
  c.hidden_size = required_int(j, "hidden_size");
  c.num_heads = required_int(j, "num_heads");
  c.q_lora_rank = required_int(j, "q_lora_rank");
  c.kv_lora_rank = required_int(j, "kv_lora_rank");
  c.qk_nope_head_dim = required_int(j, "qk_nope_head_dim");
  c.qk_rope_head_dim = required_int(j, "qk_rope_head_dim");
  c.v_head_dim = required_int(j, "v_head_dim");
  c.index_n_heads = required_int(j, "index_n_heads");
  c.index_head_dim = required_int(j, "index_head_dim");
  c.index_topk = required_int(j, "index_topk");
  c.rms_norm_eps = required_real(j, "rms_norm_eps");
  c.indexer_norm_eps = required_real(j, "indexer_norm_eps");
  c.block_size = required_int(j, "block_size");
  c.rope_theta = required_real(j, "rope_theta");
  const json& rs = member(j, "rope_scaling", "");
  if (rs.is_null()) {
    c.rope_scaling.reset();
  } else {
    if (!rs.is_object())
      throw h5::GoldenError("config JSON: key 'rope_scaling': expected null or an object, got " +
                            shown(rs));
    const char* in = "rope_scaling.";
    if (required_string(rs, "type", in) != "yarn")
      throw h5::GoldenError("config JSON: rope_scaling.type must be 'yarn'");
    c.rope_scaling = Yarn{required_real(rs, "factor", in),
                          required_int(rs, "original_max_position_embeddings", in),
                          required_real(rs, "beta_fast", in),
                          required_real(rs, "beta_slow", in),
                          required_real(rs, "mscale", in),
                          required_real(rs, "mscale_all_dim", in)};
  }
  c.index_topk_pattern = required_string(j, "index_topk_pattern");
  try {
    c.indexer_rope = parse_enum<IndexerRope>("indexer_rope", required_string(j, "indexer_rope"));
    c.hadamard = parse_enum<Hadamard>("hadamard", required_string(j, "hadamard"));
    c.kv_cache = parse_enum<KvCache>("kv_cache", required_string(j, "kv_cache"));
    c.rope_table = parse_enum<RopeTable>("rope_table", required_string(j, "rope_table"));
    c.precision = parse_enum<Precision>("precision", required_string(j, "precision"));
    if (j.contains("dcp_size")) c.dcp_size = required_int(j, "dcp_size");
    if (j.contains("dcp_interleave")) c.dcp_interleave = required_int(j, "dcp_interleave");
    if (j.contains("dcp_indexer_mode"))
      c.dcp_indexer_mode =
          parse_enum<DcpIndexerMode>("dcp_indexer_mode", required_string(j, "dcp_indexer_mode"));
    c.validate();
  } catch (const ConfigError& e) {
    throw h5::GoldenError(std::string("config JSON: ") + e.what());
  }
  return c;
}

std::string config_difference(const Config& a, const Config& b) {
  const json ja = json::parse(config_to_json(a)), jb = json::parse(config_to_json(b));
  for (const auto& [key, va] : ja.items()) {
    const json vb = jb.value(key, json());
    if (va != vb) return key + " " + va.dump() + " vs " + vb.dump();
  }
  return "";
}

}  // namespace dsv32::golden

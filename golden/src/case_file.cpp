#include "dsv32/golden/case_file.hpp"

#include "dsv32/golden/files.hpp"
#include "dsv32/golden/json_text.hpp"
#include "dsv32/oracle/coverage.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace dsv32::golden {
namespace {

using json = nlohmann::json;

/// A JSON value with its path for messages ("steps[1].requests[0]").
struct At {
  const json& v;
  std::string path;
  const std::string& file;

  [[noreturn]] void fail(const std::string& what) const {
    throw CaseFileError(file + ": " + (path.empty() ? "" : path + ": ") + what);
  }
  At operator[](const std::string& key) const {
    return {v.at(key), path.empty() ? key : path + "." + key, file};
  }
  At operator[](std::size_t i) const {
    return {v.at(i), path + "[" + std::to_string(i) + "]", file};
  }
  bool has(const std::string& key) const { return v.contains(key); }
  std::string got() const { return quote_json(v); }
  void object(const std::set<std::string>& keys) const {
    if (!v.is_object()) fail("expected an object, got " + got());
    for (const auto& [k, _] : v.items())
      if (!keys.count(k)) {
        std::string known;
        for (const std::string& n : keys) known += (known.empty() ? "" : ", ") + n;
        fail("unknown key '" + k + "' (known: " + known + ")");
      }
  }
  void require(const std::string& key) const {
    if (!has(key)) fail("missing key '" + key + "'");
  }
  long long integer(long long lo, long long hi) const {
    if (!v.is_number_integer() &&
        !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
      fail("expected an integer, got " + got());
    // The range is checked in the value's own type: 1e19 or 2^64 - 1 converted first would
    // wrap and be reported as a negative number.
    const bool in_range =
        v.is_number_unsigned()
            ? v.get<unsigned long long>() <= static_cast<unsigned long long>(hi) &&
                  (lo <= 0 || v.get<unsigned long long>() >= static_cast<unsigned long long>(lo))
        : v.is_number_float() ? v.get<double>() >= static_cast<double>(lo) &&
                                    v.get<double>() <= static_cast<double>(hi)
                              : v.get<long long>() >= lo && v.get<long long>() <= hi;
    if (!in_range)
      fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
           got());
    return v.is_number_float() ? static_cast<long long>(v.get<double>()) : v.get<long long>();
  }
  double number() const {
    if (!v.is_number()) fail("expected a number, got " + got());
    return v.get<double>();
  }
  std::string text() const {
    if (!v.is_string()) fail("expected a string, got " + got());
    return v.get<std::string>();
  }
  const json& array() const {
    if (!v.is_array()) fail("expected an array, got " + got());
    return v;
  }
};

const std::set<std::string>& config_keys() {
  static const std::set<std::string> keys{"num_layers",
                                          "hidden_size",
                                          "num_heads",
                                          "q_lora_rank",
                                          "kv_lora_rank",
                                          "qk_nope_head_dim",
                                          "qk_rope_head_dim",
                                          "v_head_dim",
                                          "index_n_heads",
                                          "index_head_dim",
                                          "index_topk",
                                          "rms_norm_eps",
                                          "indexer_norm_eps",
                                          "block_size",
                                          "rope_theta",
                                          "rope_scaling",
                                          "index_topk_pattern",
                                          "indexer_rope",
                                          "hadamard",
                                          "kv_cache",
                                          "rope_table",
                                          "precision",
                                          "index_topk_freq",
                                          "index_skip_topk_offset",
                                          "preset",
                                          "hf_config",
                                          "name",
                                          "dcp_size",
                                          "dcp_interleave",
                                          "dcp_indexer_mode",
                                          "decode_context_parallel_size",
                                          "cp_kv_cache_interleave_size"};
  return keys;
}

std::optional<Yarn> yarn_of(const At& a) {
  if (a.v.is_null()) return std::nullopt;
  a.object({"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast",
            "beta_slow", "mscale", "mscale_all_dim"});
  const std::string type = a.has("type")        ? a["type"].text()
                           : a.has("rope_type") ? a["rope_type"].text()
                                                : "";
  if (type != "yarn")
    a.fail("only type 'yarn' (or null: plain RoPE) is supported, got '" + type + "'");
  Yarn y;
  if (a.has("factor")) y.factor = a["factor"].number();
  if (a.has("original_max_position_embeddings"))
    y.original_max_position_embeddings =
        static_cast<int>(a["original_max_position_embeddings"].integer(1, 1 << 30));
  if (a.has("beta_fast")) y.beta_fast = a["beta_fast"].number();
  if (a.has("beta_slow")) y.beta_slow = a["beta_slow"].number();
  if (a.has("mscale")) y.mscale = a["mscale"].number();
  if (a.has("mscale_all_dim")) y.mscale_all_dim = a["mscale_all_dim"].number();
  return y;
}

/// The layer's sizes of `c` by their config names; `heads` names num_heads (GOLDEN.md's
/// `num_heads`, Hugging Face's `num_attention_heads`).
std::vector<std::pair<std::string, int*>> size_fields(Config& c, const std::string& heads) {
  return {{"hidden_size", &c.hidden_size},
          {heads, &c.num_heads},
          {"q_lora_rank", &c.q_lora_rank},
          {"kv_lora_rank", &c.kv_lora_rank},
          {"qk_nope_head_dim", &c.qk_nope_head_dim},
          {"qk_rope_head_dim", &c.qk_rope_head_dim},
          {"v_head_dim", &c.v_head_dim},
          {"index_n_heads", &c.index_n_heads},
          {"index_head_dim", &c.index_head_dim},
          {"index_topk", &c.index_topk}};
}

/// vLLM's index_topk_freq / index_skip_topk_offset in `a` as an F/S pattern of `num_layers`
/// letters; call only where index_topk_freq is given.
std::string pattern_from_freq(const At& a, int num_layers) {
  const int freq = static_cast<int>(a["index_topk_freq"].integer(1, 1 << 20));
  const int offset = a.has("index_skip_topk_offset")
                         ? static_cast<int>(a["index_skip_topk_offset"].integer(0, 1 << 20))
                         : 0;
  return topk_pattern_from_vllm(num_layers, freq, offset);
}

/// A request's `hidden`: {"repeat": N, "distinct": [positions]} (docs/CASES.md).
HiddenShape hidden_shape(const At& a) {
  a.object({"repeat", "distinct"});
  HiddenShape h;
  if (a.has("repeat")) h.repeat = static_cast<int>(a["repeat"].integer(1, 1 << 30));
  if (a.has("distinct")) {
    const At d = a["distinct"];
    if (d.array().size() > 4096) d.fail("at most 4096 positions");
    for (std::size_t i = 0; i < d.v.size(); ++i)
      h.distinct.push_back(static_cast<int>(d[i].integer(0, 1 << 30)));
  }
  return h;
}

/// `text` parsed as JSON, or a CaseFileError naming `where`.
json parse_json(const std::string& text, const std::string& where) {
  try {
    return parse_json_strict(text, where);
  } catch (const JsonError& e) {
    throw CaseFileError(e.what());
  }
}

/// GOLDEN.md's config keys present in `a` applied to `c` (each type-checked); the F/S pattern
/// from index_topk_freq / index_skip_topk_offset where given.
void apply_keys(Config& c, const At& a, const CaseLimits& lim) {
  if (a.has("name")) a["name"].text();  // the case's name is the config's: a string, or refused
  std::vector<std::pair<std::string, int*>> ints = size_fields(c, "num_heads");
  ints.emplace_back("block_size", &c.block_size);
  for (const auto& [k, p] : ints)
    if (a.has(k)) *p = static_cast<int>(a[k].integer(1, kMaxConfigSize));
  if (a.has("num_layers")) {
    c.num_layers = static_cast<int>(a["num_layers"].integer(1, lim.max_layers));
    if (!a.has("index_topk_pattern") && !a.has("index_topk_freq"))
      c.index_topk_pattern = std::string(static_cast<std::size_t>(c.num_layers), 'F');
  }
  for (const auto& [k, p] :
       std::map<std::string, double*>{{"rms_norm_eps", &c.rms_norm_eps},
                                      {"indexer_norm_eps", &c.indexer_norm_eps},
                                      {"rope_theta", &c.rope_theta}})
    if (a.has(k)) *p = a[k].number();
  if (a.has("rope_scaling")) c.rope_scaling = yarn_of(a["rope_scaling"]);
  if (a.has("index_topk_pattern")) c.index_topk_pattern = a["index_topk_pattern"].text();
  if (a.has("index_topk_freq")) c.index_topk_pattern = pattern_from_freq(a, c.num_layers);
  const auto set_enum = [&](const char* key, auto& field) {
    if (!a.has(key)) return;
    try {
      field = parse_enum<std::decay_t<decltype(field)>>(key, a[key].text());
    } catch (const ConfigError& e) {
      a[key].fail(e.what());
    }
  };
  set_enum("indexer_rope", c.indexer_rope);
  set_enum("hadamard", c.hadamard);
  set_enum("kv_cache", c.kv_cache);
  set_enum("rope_table", c.rope_table);
  set_enum("precision", c.precision);
  // Decode context parallelism, by our names or vLLM's engine arguments (not both).
  for (const auto& [ours, vllms, field, max] :
       {std::tuple{"dcp_size", "decode_context_parallel_size", &c.dcp_size, kMaxDcpSize},
        std::tuple{"dcp_interleave", "cp_kv_cache_interleave_size", &c.dcp_interleave,
                   kMaxConfigSize}}) {
    if (a.has(ours) && a.has(vllms))
      a[vllms].fail(std::string("give ") + ours + " or " + vllms + ", not both");
    if (const char* key = a.has(ours) ? ours : vllms; a.has(key))
      *field = static_cast<int>(a[key].integer(1, max));
  }
  set_enum("dcp_indexer_mode", c.dcp_indexer_mode);
}

/// A case file or a Hugging Face config: a regular file (a FIFO would block) of at most 16 MiB.
std::string read_text(const std::string& path, const std::string& what) {
  if (const std::string why = files::not_regular_file_reason(path); !why.empty())
    throw CaseFileError(what + ": " + path + ": " + why);
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) > (std::uintmax_t{16} << 20) && !ec)
    throw CaseFileError(what + ": " + path + ": larger than 16 MiB, not a case or config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CaseFileError(what + ": cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Config config_from_hf(const std::string& json_text, int num_layers, const std::string& where) {
  const json hf = parse_json(json_text, where);
  const At a{hf, "", where};
  if (!hf.is_object()) a.fail("expected a JSON object");
  Config c;
  c.num_layers = num_layers;
  const std::vector<std::pair<std::string, int*>> ints = size_fields(c, "num_attention_heads");
  for (const auto& [k, p] : ints) {
    a.require(k);
    *p = static_cast<int>(a[k].integer(1, kMaxConfigSize));
  }
  if (a.has("rms_norm_eps")) c.rms_norm_eps = a["rms_norm_eps"].number();
  // RoPE: rope_theta and rope_scaling (DeepSeek), or rope_parameters (newer Transformers).
  // A null rope_parameters is one not given (the legacy keys then hold RoPE); any other
  // non-object is refused rather than read as "no keys".
  if (a.has("rope_parameters") && !a["rope_parameters"].v.is_null()) {
    const At rp = a["rope_parameters"];
    if (!rp.v.is_object()) rp.fail("expected an object or null, got " + rp.got());
    if (rp.has("rope_theta")) c.rope_theta = rp["rope_theta"].number();
    const std::string type = rp.has("rope_type") ? rp["rope_type"].text() : "default";
    if (type == "default") {
      c.rope_scaling.reset();
    } else if (type == "yarn") {
      json y = rp.v;
      y.erase("rope_theta");
      c.rope_scaling = yarn_of(At{y, rp.path, where});
    } else {
      rp.fail("rope_type '" + type + "' is not supported (default or yarn)");
    }
  } else {
    if (a.has("rope_theta")) c.rope_theta = a["rope_theta"].number();
    c.rope_scaling = a.has("rope_scaling") ? yarn_of(a["rope_scaling"]) : std::nullopt;
  }
  if (a.has("indexer_rope_interleave")) {
    const At v = a["indexer_rope_interleave"];
    if (!v.v.is_boolean()) v.fail("expected true or false, got " + v.got());
    c.indexer_rope = v.v.get<bool>() ? IndexerRope::interleaved : IndexerRope::neox;
  }
  c.index_topk_pattern = std::string(static_cast<std::size_t>(num_layers), 'F');
  if (a.has("index_topk_freq")) c.index_topk_pattern = pattern_from_freq(a, num_layers);
  return c;
}

CaseSpec case_from_json(const std::string& text, const std::string& where, const std::string& dir,
                        const CaseLimits& lim) {
  const json j = parse_json(text, where);
  const At root{j, "", where};
  root.object({"name", "description", "seed", "config", "cache", "steps", "committed", "weights",
               "require"});
  root.require("name");
  root.require("config");
  root.require("steps");
  CaseSpec spec;
  spec.name = root["name"].text();
  // The name becomes file names (NAME.h5, NAME.candidate.json): a NUL, a separator or a
  // control character in it would write somewhere else than the message says.
  const bool safe =
      !spec.name.empty() && spec.name.size() <= 128 &&
      std::isalnum(static_cast<unsigned char>(spec.name[0])) &&
      std::all_of(spec.name.begin(), spec.name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      });
  if (!safe)
    root["name"].fail(
        "expected a file-name-safe name (a letter or digit, then letters, digits, '.', '_' or "
        "'-'; at most 128), got " +
        root["name"].got());
  if (root.has("description")) spec.description = root["description"].text();
  if (root.has("seed")) spec.seed = static_cast<std::uint64_t>(root["seed"].integer(0, 1LL << 62));
  if (root.has("committed")) {
    if (!j["committed"].is_boolean()) root["committed"].fail("expected true or false");
    spec.committed = j["committed"].get<bool>();
  }
  // The config: a preset, a Hugging Face config.json, or GOLDEN.md's keys; then overrides.
  const At cfg = root["config"];
  cfg.object(config_keys());
  if (cfg.has("preset") && cfg.has("hf_config")) cfg.fail("give 'preset' or 'hf_config', not both");
  Config c;
  try {
    if (cfg.has("preset")) {
      c = preset(cfg["preset"].text());
    } else if (cfg.has("hf_config")) {
      std::filesystem::path p = cfg["hf_config"].text();
      if (p.is_relative()) p = std::filesystem::path(dir) / p;
      const int layers = cfg.has("num_layers")
                             ? static_cast<int>(cfg["num_layers"].integer(1, lim.max_layers))
                             : 1;
      c = config_from_hf(read_text(p.string(), where + ": config.hf_config"), layers, p.string());
    } else {
      for (const char* k :
           {"num_layers", "hidden_size", "num_heads", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_topk"})
        cfg.require(k);
    }
  } catch (const ConfigError& e) {
    cfg.fail(e.what());
  }
  apply_keys(c, cfg, lim);
  c.name = spec.name;
  try {
    c.validate();
  } catch (const ConfigError& e) {
    cfg.fail(e.what());
  }
  spec.cfg = c;
  if (root.has("require")) {
    const At req = root["require"];
    for (std::size_t i = 0; i < req.array().size(); ++i) {
      const std::string claim = req[i].text();
      try {
        Requirement::parse(claim);
      } catch (const std::invalid_argument& e) {
        req[i].fail(e.what());
      }
      spec.require.push_back(claim);
    }
  }
  if (root.has("weights")) {
    const At w = root["weights"];
    w.object({"zero_index_key_rope"});
    if (w.has("zero_index_key_rope")) {
      const At layers = w["zero_index_key_rope"];
      for (std::size_t i = 0; i < layers.array().size(); ++i) {
        const int l = static_cast<int>(layers[i].integer(0, c.num_layers - 1));
        if (!c.is_full_layer(l))
          layers[i].fail("layer " + std::to_string(l) + " is an S layer (no index keys)");
        spec.zero_index_key_rope.push_back(l);
      }
    }
  }
  if (root.has("cache")) {
    const At cache = root["cache"];
    cache.object({"num_blocks", "allocation", "dcp_tables"});
    if (cache.has("num_blocks"))
      spec.num_blocks = static_cast<int>(cache["num_blocks"].integer(1, lim.max_blocks));
    if (cache.has("allocation") && cache["allocation"].text() != "permuted")
      cache["allocation"].fail("only 'permuted' (blocks in a seeded random order) is supported");
    if (cache.has("dcp_tables")) {
      // Under DCP: vLLM's layout (every rank the same block ids) or different ids per rank.
      const std::string t = cache["dcp_tables"].text();
      if (t != "shared" && t != "distinct")
        cache["dcp_tables"].fail(
            "expected 'shared' (vLLM's: every rank the same block ids) or "
            "'distinct', got '" +
            t + "'");
      spec.dcp_tables = t == "shared" ? DcpTables::shared : DcpTables::distinct;
    }
  }
  // The steps, simulated: who is live, their contexts, the blocks they hold.
  const At steps = root["steps"];
  if (steps.array().empty()) steps.fail("expected at least one step");
  if (static_cast<int>(steps.v.size()) > lim.max_steps)
    steps.fail("at most " + std::to_string(lim.max_steps) + " steps");
  std::map<int, long long> live;  // id -> context
  std::set<int> finished;
  const long long B = c.block_size;
  for (std::size_t s = 0; s < steps.v.size(); ++s) {
    const At st = steps[s];
    st.object({"requests", "capture_size", "finish_after"});
    st.require("requests");
    StepPlan plan;
    const At reqs = st["requests"];
    if (reqs.array().empty()) reqs.fail("expected at least one request");
    long long tokens = 0;
    std::set<int> seen;
    for (std::size_t r = 0; r < reqs.v.size(); ++r) {
      const At rq = reqs[r];
      rq.object({"id", "new_tokens", "hidden", "given_prefix"});
      rq.require("id");
      rq.require("new_tokens");
      const int id = static_cast<int>(rq["id"].integer(0, 1 << 30));
      if (rq.has("hidden")) {
        if (live.count(id))
          rq["hidden"].fail("request " + std::to_string(id) +
                            " is already running: give 'hidden' at its first step");
        spec.hidden[id] = hidden_shape(rq["hidden"]);
      }
      const int q = static_cast<int>(rq["new_tokens"].integer(1, lim.max_tokens_per_step));
      if (!seen.insert(id).second)
        rq["id"].fail("request " + std::to_string(id) + " twice in one step");
      if (finished.count(id))
        rq["id"].fail("request " + std::to_string(id) + " finished in an earlier step");
      int given = 0;
      if (rq.has("given_prefix")) {
        if (live.count(id))
          rq["given_prefix"].fail("request " + std::to_string(id) +
                                  " is already running: a given prefix only at its first step");
        given = static_cast<int>(rq["given_prefix"].integer(1, lim.max_given_prefix));
      }
      live[id] += static_cast<long long>(given) + q;
      tokens += q;
      plan.requests.push_back({id, q, given});
    }
    if (tokens > lim.max_tokens_per_step)
      reqs.fail(std::to_string(tokens) + " new tokens in one step, at most " +
                std::to_string(lim.max_tokens_per_step));
    if (st.has("capture_size")) {
      plan.capture_size = static_cast<int>(st["capture_size"].integer(0, lim.max_tokens_per_step));
      if (plan.capture_size != 0 && plan.capture_size < tokens)
        st["capture_size"].fail(std::to_string(plan.capture_size) + " is less than the step's " +
                                std::to_string(tokens) + " new tokens");
    }
    long long blocks = 0;
    for (const auto& [id, ctx] : live) blocks += (ctx + B - 1) / B;
    if (blocks > spec.num_blocks)
      st.fail("the live requests need " + std::to_string(blocks) + " cache blocks of " +
              std::to_string(B) + " tokens, cache.num_blocks is " +
              std::to_string(spec.num_blocks));
    if (st.has("finish_after")) {
      const At fin = st["finish_after"];
      for (std::size_t i = 0; i < fin.array().size(); ++i) {
        const int id = static_cast<int>(fin[i].integer(0, 1 << 30));
        if (!live.count(id)) fin[i].fail("request " + std::to_string(id) + " is not live");
        live.erase(id);
        finished.insert(id);
        plan.finish_after.push_back(id);
      }
    }
    spec.steps.push_back(std::move(plan));
  }
  return spec;
}

CaseSpec read_case_file(const std::string& path, const CaseLimits& limits) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return case_from_json(read_text(path, path), path, dir.empty() ? "." : dir, limits);
}

}  // namespace dsv32::golden

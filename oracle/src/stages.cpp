#include "dsv32/oracle/stages.hpp"

#include <stdexcept>

namespace dsv32 {
namespace {

using Tail = std::vector<std::int64_t>;

}  // namespace

const std::vector<StageInfo>& stage_table() {
  using S = Storage;
  static const std::vector<StageInfo> table{
      {"q_c", "norm_rope_cache", false, false, S::activation,
       [](const Config& c) -> Tail { return {c.q_lora_rank}; }},
      {"c", "norm_rope_cache", false, false, S::activation,
       [](const Config& c) -> Tail { return {c.kv_lora_rank}; }},
      {"kR", "norm_rope_cache", false, false, S::activation,
       [](const Config& c) -> Tail { return {c.qk_rope_head_dim}; }},
      {"ql", "uk_absorb", false, true, S::activation,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.kv_lora_rank};
       }},
      {"qR", "fused_q", false, true, S::activation,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.qk_rope_head_dim};
       }},
      {"qI8", "fused_q", true, false, S::fp8,
       [](const Config& c) -> Tail {
         return {c.index_n_heads, c.index_head_dim};
       }},
      {"qI_scale", "fused_q", true, false, S::fp32,
       [](const Config& c) -> Tail { return {c.index_n_heads}; }},
      {"kI8", "norm_rope_cache", true, false, S::fp8,
       [](const Config& c) -> Tail { return {c.index_head_dim}; }},
      {"kI_scale", "norm_rope_cache", true, false, S::fp32,
       [](const Config&) -> Tail { return {}; }},
      {"omega", "fused_q", true, false, S::fp32,
       [](const Config& c) -> Tail { return {c.index_n_heads}; }},
      {"topk", "indexer_topk", false, false, S::int32,
       [](const Config& c) -> Tail { return {c.index_topk}; }},
      {"olat", "sparse_mqa", false, true, S::activation,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.kv_lora_rank};
       }},
      {"lse", "sparse_mqa", false, true, S::fp32,
       [](const Config& c) -> Tail { return {c.num_heads}; }},
      {"o", "uv_proj", false, true, S::activation,
       [](const Config& c) -> Tail {
         return {static_cast<std::int64_t>(c.num_heads) * c.v_head_dim};
       }},
      {"y", "o_proj", false, false, S::activation,
       [](const Config& c) -> Tail { return {c.hidden_size}; }},
      {"output", "residual_add", false, false, S::activation,
       [](const Config& c) -> Tail { return {c.hidden_size}; }},
  };
  return table;
}

const StageInfo& stage_info(std::string_view name) {
  for (const StageInfo& s : stage_table())
    if (s.name == name) return s;
  throw std::out_of_range("no trace stage named '" + std::string(name) + "'");
}

const std::vector<std::string>& layer_stage_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const StageInfo& s : stage_table())
      if (s.name != "output") n.emplace_back(s.name);
    return n;
  }();
  return names;
}

bool is_head_split_stage(std::string_view name) {
  for (const StageInfo& s : stage_table())
    if (s.name == name) return s.heads;
  return false;
}

bool is_indexer_stage(std::string_view name) {
  for (const StageInfo& s : stage_table())
    if (s.name == name) return s.indexer;
  return false;
}

DType storage_dtype(const Config& cfg, std::string_view stage) {
  switch (stage_info(stage).storage) {
    case Storage::int32:
      return DType::int32;
    case Storage::fp8:
      return DType::float8_e4m3fn;
    case Storage::fp32:
      return DType::float32;
    case Storage::activation:
      break;
  }
  return cfg.precision == Precision::bf16 ? DType::bfloat16 : DType::float32;
}

std::string_view stage_op(std::string_view stage) {
  for (const StageInfo& s : stage_table())
    if (s.name == stage) return s.op;
  return "?";
}

std::vector<std::int64_t> stage_tail(const Config& cfg, std::string_view stage) {
  return stage_info(stage).tail(cfg);
}

}  // namespace dsv32

#include "dsv32/oracle/stages.hpp"

#include <stdexcept>

namespace dsv32 {
namespace {

using Tail = std::vector<std::int64_t>;

}  // namespace

const std::array<StageInfo, kNumStages>& stage_table() {
  using S = Storage;
  using R = Rule;
  constexpr std::optional<Stage> none;
  // name, stage, op, indexer, heads, after_attention, storage, rule, scale, tail
  static const std::array<StageInfo, kNumStages> table{{
      {"q_c", Stage::q_c, Op::norm_rope_cache, false, false, false, S::activation, R::gate, none,
       [](const Config& c) -> Tail { return {c.q_lora_rank}; }},
      {"c", Stage::c, Op::norm_rope_cache, false, false, false, S::activation, R::cache, none,
       [](const Config& c) -> Tail { return {c.kv_lora_rank}; }},
      {"kR", Stage::kR, Op::norm_rope_cache, false, false, false, S::activation, R::gate, none,
       [](const Config& c) -> Tail { return {c.qk_rope_head_dim}; }},
      {"ql", Stage::ql, Op::uk_absorb, false, true, false, S::activation, R::gate, none,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.kv_lora_rank};
       }},
      {"qR", Stage::qR, Op::fused_q, false, true, false, S::activation, R::gate, none,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.qk_rope_head_dim};
       }},
      {"qI8", Stage::qI8, Op::fused_q, true, false, false, S::fp8, R::quantized, Stage::qI_scale,
       [](const Config& c) -> Tail {
         return {c.index_n_heads, c.index_head_dim};
       }},
      {"qI_scale", Stage::qI_scale, Op::fused_q, true, false, false, S::fp32, R::scale, none,
       [](const Config& c) -> Tail { return {c.index_n_heads}; }},
      {"kI8", Stage::kI8, Op::norm_rope_cache, true, false, false, S::fp8, R::quantized,
       Stage::kI_scale, [](const Config& c) -> Tail { return {c.index_head_dim}; }},
      {"kI_scale", Stage::kI_scale, Op::norm_rope_cache, true, false, false, S::fp32, R::scale,
       none, [](const Config&) -> Tail { return {}; }},
      {"omega", Stage::omega, Op::fused_q, true, false, false, S::fp32, R::per_scale,
       Stage::qI_scale, [](const Config& c) -> Tail { return {c.index_n_heads}; }},
      {"topk", Stage::topk, Op::indexer_topk, false, false, false, S::int32, R::sets, none,
       [](const Config& c) -> Tail { return {c.index_topk}; }},
      {"olat", Stage::olat, Op::sparse_mqa, false, true, true, S::activation, R::gate, none,
       [](const Config& c) -> Tail {
         return {c.num_heads, c.kv_lora_rank};
       }},
      {"lse", Stage::lse, Op::sparse_mqa, false, true, true, S::fp32, R::gate, none,
       [](const Config& c) -> Tail { return {c.num_heads}; }},
      {"o", Stage::o, Op::uv_proj, false, true, true, S::activation, R::gate, none,
       [](const Config& c) -> Tail {
         return {static_cast<std::int64_t>(c.num_heads) * c.v_head_dim};
       }},
      {"y", Stage::y, Op::o_proj, false, false, true, S::activation, R::gate, none,
       [](const Config& c) -> Tail { return {c.hidden_size}; }},
      {"output", Stage::output, Op::residual_add, false, false, true, S::activation, R::gate, none,
       [](const Config& c) -> Tail { return {c.hidden_size}; }},
  }};
  return table;
}

const std::array<Stage, kNumLayerStages>& layer_stages() {
  static const std::array<Stage, kNumLayerStages> stages = [] {
    std::array<Stage, kNumLayerStages> s{};
    for (std::size_t i = 0; i < kNumLayerStages; ++i) s[i] = static_cast<Stage>(i);
    return s;
  }();
  return stages;
}

std::optional<Stage> find_stage(std::string_view name) {
  for (const StageInfo& s : stage_table())
    if (s.name == name) return s.stage;
  return std::nullopt;
}

const std::string& stage_name(Stage s) {
  static const std::array<std::string, kNumStages> names = [] {
    std::array<std::string, kNumStages> n;
    for (const StageInfo& e : stage_table()) n[index(e.stage)] = std::string(e.name);
    return n;
  }();
  return names[index(s)];
}

DType storage_dtype(const Config& cfg, Stage stage) {
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

const StageInfo& stage_info(std::string_view name) {
  if (const std::optional<Stage> s = find_stage(name)) return stage_info(*s);
  throw std::out_of_range("no trace stage named '" + std::string(name) + "'");
}

const std::vector<std::string>& layer_stage_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Stage s : layer_stages()) n.push_back(stage_name(s));
    return n;
  }();
  return names;
}

bool is_head_split_stage(std::string_view name) {
  const std::optional<Stage> s = find_stage(name);
  return s && stage_info(*s).heads;
}

bool is_indexer_stage(std::string_view name) {
  const std::optional<Stage> s = find_stage(name);
  return s && stage_info(*s).indexer;
}

DType storage_dtype(const Config& cfg, std::string_view stage) {
  return storage_dtype(cfg, stage_info(stage).stage);
}

std::string_view stage_op(std::string_view stage) {
  // A DCP rank's stages (`rank{r}/olat`) are its op's; its share and the merge, attention's.
  if (stage.starts_with("rank") && stage.find('/') != std::string_view::npos)
    stage.remove_prefix(stage.find('/') + 1);
  if (stage == "share" || stage == "merge") return op_name(Op::sparse_mqa);
  const std::optional<Stage> s = find_stage(stage);
  return s ? std::string_view(op_name(stage_info(*s).op)) : std::string_view("?");
}

std::vector<std::int64_t> stage_tail(const Config& cfg, std::string_view stage) {
  return stage_info(stage).tail(cfg);
}

}  // namespace dsv32

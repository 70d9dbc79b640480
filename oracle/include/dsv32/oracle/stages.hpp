// The stage table: every trace tensor of a layer (MATH.md's names, GOLDEN.md's order), the op
// that writes it, how the deployed implementation stores it, how a candidate's is compared with
// the oracle's and its shape. One table, read by the oracle, the golden files, the trace diff,
// the judge and the GPU stack. Names are for files and messages: code asks the table by Stage.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/ops.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// A layer's stages in trace order (GOLDEN.md), then the step's output.
enum class Stage : std::uint8_t {
  q_c,
  c,
  kR,
  ql,
  qR,
  qI8,
  qI_scale,
  kI8,
  kI_scale,
  omega,
  topk,
  olat,
  lse,
  o,
  y,
  output,
};
inline constexpr std::size_t kNumStages = 16;
inline constexpr std::size_t kNumLayerStages = 15;  // every stage but `output`

/// How a stage is stored where it is deployed.
enum class Storage {
  activation,  // bf16, or fp32 under `precision = fp32`
  fp8,         // e4m3fn codes
  fp32,
  int32,
};

/// How a candidate's stage is compared with the oracle's (TESTING.md, diff_traces).
enum class Rule : std::uint8_t {
  gate,       // the bf16 gate (T1 - T0 spread) or the fp32 gate (gamma_n)
  sets,       // top-k rows as index sets, exact
  quantized,  // e4m3 values dequantized with their scale (`scale`), within a quantum
  per_scale,  // the gate after dividing out the power-of-two scale (`scale`), judged with qI8
  scale,      // a scale: judged only through the stages quantized with it
  cache,      // the latent as the cache reads it: the quantized rule under fp8_ds_mla, else gate
};

struct StageInfo {
  std::string_view name;
  Stage stage;
  Op op;         // the BOUNDARIES.md op that writes it
  bool indexer;  // F layers only
  bool heads;    // split by head under tensor parallelism (dimension 1 is the heads')
  /// Computed from attention's read of the latent cache within its layer (under an fp8 cache
  /// its gate resolves to e4m3 quanta even in layer 0).
  bool after_attention;
  Storage storage;
  Rule rule;
  std::optional<Stage> scale;  // the scale a `quantized` or `per_scale` stage is judged with
  /// The shape after the token dimension.
  std::vector<std::int64_t> (*tail)(const Config& cfg);
};

/// Every stage in trace order, `output` last; stage_table()[i].stage == Stage(i).
const std::array<StageInfo, kNumStages>& stage_table();
constexpr std::size_t index(Stage s) {
  return static_cast<std::size_t>(s);
}
inline const StageInfo& stage_info(Stage s) {
  return stage_table()[index(s)];
}
/// The stages of a layer in trace order (`output` excluded).
const std::array<Stage, kNumLayerStages>& layer_stages();
/// The stage named `name` ("output" included), or nullopt (the parse point of stage names).
std::optional<Stage> find_stage(std::string_view name);
/// The name of `s` (a std::string, for messages built with +).
const std::string& stage_name(Stage s);
/// The DType the deployed implementation stores a stage in (bf16/fp32 precision).
DType storage_dtype(const Config& cfg, Stage s);
/// A stage's shape after the token dimension (e.g. ql: {H, Lkv}).
inline std::vector<std::int64_t> stage_tail(const Config& cfg, Stage s) {
  return stage_info(s).tail(cfg);
}

// By name: the parse and print points (a golden's dataset names, a candidate's, messages).

/// The entry of `name` ("output" included); throws std::out_of_range for an unknown name.
const StageInfo& stage_info(std::string_view name);
/// Trace tensor names of one layer, in op order (GOLDEN.md).
const std::vector<std::string>& layer_stage_names();
/// Stages that only F layers produce.
bool is_indexer_stage(std::string_view name);
/// Stages whose dimension 1 runs over the attention heads, split across tensor-parallel ranks
/// (ql, qR, olat, lse, o); the rest are replicated on every rank.
bool is_head_split_stage(std::string_view name);
/// storage_dtype of the stage named `stage`.
DType storage_dtype(const Config& cfg, std::string_view stage);
/// The BOUNDARIES.md op that produces a trace stage (e.g. "olat" -> "sparse_mqa"); "?" if none.
std::string_view stage_op(std::string_view stage);
/// stage_tail of the stage named `stage`.
std::vector<std::int64_t> stage_tail(const Config& cfg, std::string_view stage);

}  // namespace dsv32

// The stage table: every trace tensor of a layer (MATH.md's names, GOLDEN.md's order), the op
// that writes it, how the deployed implementation stores it and its shape. One table, read by the
// oracle, the golden files, the trace diff and the GPU stack.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// How a stage is stored where it is deployed.
enum class Storage {
  activation,  // bf16, or fp32 under `precision = fp32`
  fp8,         // e4m3fn codes
  fp32,
  int32,
};

struct StageInfo {
  std::string_view name;
  std::string_view op;  // the BOUNDARIES.md op that writes it
  bool indexer;         // F layers only
  bool heads;           // split by head under tensor parallelism (dimension 1 is the heads')
  Storage storage;
  /// The shape after the token dimension.
  std::vector<std::int64_t> (*tail)(const Config& cfg);
};

/// A layer's stages in trace order (GOLDEN.md), then the stack's "output".
const std::vector<StageInfo>& stage_table();
/// The entry of `name` ("output" included); throws std::out_of_range for an unknown name.
const StageInfo& stage_info(std::string_view name);

/// Trace tensor names of one layer, in op order (GOLDEN.md).
const std::vector<std::string>& layer_stage_names();
/// Stages that only F layers produce.
bool is_indexer_stage(std::string_view name);
/// Stages whose dimension 1 runs over the attention heads, split across tensor-parallel ranks
/// (ql, qR, olat, lse, o); the rest are replicated on every rank.
bool is_head_split_stage(std::string_view name);
/// The dtype the deployed implementation stores a stage in (bf16/fp32 precision).
DType storage_dtype(const Config& cfg, std::string_view stage);
/// The BOUNDARIES.md op that produces a trace stage (e.g. "olat" -> "sparse_mqa"); "?" if none.
std::string_view stage_op(std::string_view stage);
/// A stage's shape after the token dimension (e.g. "ql": {H, Lkv}).
std::vector<std::int64_t> stage_tail(const Config& cfg, std::string_view stage);

}  // namespace dsv32

// Helpers the golden writer and reader share: a stage's shape and its dtype in each trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv32/golden/h5.hpp"
#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/dcp.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "dsv32/oracle/stages.hpp"
#include "dsv32/oracle/tensor.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32::golden::detail {

using Shape = std::vector<std::int64_t>;

/// (T_a, the stage's tail).
inline Shape stage_shape(const Config& c, Stage s, std::int64_t Ta) {
  Shape shape{Ta};
  for (std::int64_t d : stage_tail(c, s)) shape.push_back(d);
  return shape;
}

/// A stage's dtype in `expected` (T0: float64, but int32 for an int32 stage, topk) or `emulated`
/// (T1: its storage dtype).
inline DType trace_dtype(const Config& c, Stage s, bool exact) {
  if (stage_info(s).storage == Storage::int32) return DType::int32;
  return exact ? DType::float64 : storage_dtype(c, s);
}

}  // namespace dsv32::golden::detail

namespace dsv32::golden {
struct GoldenCase;
namespace detail {
/// Whether any step of `c` starts a request from a given prefix (schema_version 2).
bool has_prefixes(const GoldenCase& c);
/// Writes the given prefixes of `c`'s steps under /prefix (prefix_io.cpp).
void write_prefixes(const h5::Group& root, const GoldenCase& c);
/// Under DCP (dcp_io.cpp): each rank's block tables of a step as `inputs/rank{r}/block_table`
/// (R, max blocks, -1 padded), and each rank's stages of a layer as `layer{l}/rank{r}/` `topk`,
/// `share` (T_a, K) int32, `olat` (T_a, H, Lkv), `lse` (T_a, H).
void write_dcp_tables(const h5::Group& inputs, const StepInput& in);
/// Reads and checks (check_dcp_tables) every rank's tables into in.dcp_tables.
void read_dcp_tables(const h5::Group& inputs, const Config& cfg, StepInput& in, int num_blocks);
void write_dcp_layer(const h5::Group& layer, const Config& cfg, const DcpLayerTrace& d, bool exact);
/// Every rank's stages; finite but for -inf in the lse of a row whose share is empty.
DcpLayerTrace read_dcp_layer(const h5::Group& layer, const Config& cfg, std::int64_t Ta,
                             bool exact);
/// A candidate's ranks of a layer (all of them, or none: nullopt), values as given: NaN and
/// infinities are the judge's to name.
std::optional<DcpLayerTrace> read_candidate_dcp_layer(const h5::Group& layer, const Config& cfg,
                                                      std::int64_t Ta);
/// A candidate's root attribute `lse_base`: "e" (also when absent) or "2".
LseBase read_lse_base(const h5::Group& root);
/// Reads /prefix (when present) and attaches each given prefix to the step where its request
/// first appears; refuses a request that first appears with a context and no prefix of that
/// length, and a prefix that no step starts, naming the dataset.
void read_prefixes(const h5::Group& root, const Config& cfg, std::vector<StepInput>& steps,
                   int num_blocks);
}  // namespace detail
}  // namespace dsv32::golden

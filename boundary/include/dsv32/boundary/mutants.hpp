// The boundary bugs of BOUNDARIES.md section 4 as a type, and the mutant table: one row per
// mutant with its name, the switch of the GPU stack that plants it (none for a plan mutant,
// which captures an H op instead), whether it is a bug of the full graphs and the registry case
// whose steps expose it (docs/CASES.md). Names are for the command line and messages.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv32::boundary {

/// The switches of the GPU stack that plant a mutant; `none` runs the stack as it should.
enum class StackMutant {
  none,
  fresh_output,
  baked_short_prefill,
  shared_layer_clears,
  no_topk_clear,
  double_rope,
  padded_cache_write,
  stale_positions,
  unjoined_stream,
  full_for_mixed,
  stale_full_metadata,
  stale_short_prefill,
  verify_stride,
  topk_bin_overflow,
  topk_edge,
  reused_block_skip,
  int32_offset,
  fp8_tile_scale,
  topk_long_row,
  dcp_lse_base2,
  dcp_empty_rank_nan,
  dcp_global_as_local,
  dcp_share_prefix,
};

/// Every mutant, in the table's (and mutant_names()') order.
enum class Mutant : std::uint8_t {
  fresh_output,
  capture_host_op,
  baked_short_prefill,
  uv_captured_nocopy,
  shared_layer_clears,
  no_topk_clear,
  double_rope,
  padded_cache_write,
  stale_positions,
  unjoined_stream,
  full_for_mixed,
  stale_full_metadata,
  stale_short_prefill,
  verify_stride,
  topk_bin_overflow,
  topk_edge,
  reused_block_skip,
  int32_offset,
  fp8_tile_scale,
  topk_long_row,
  dcp_lse_base2,
  dcp_empty_rank_nan,
  dcp_global_as_local,
  dcp_share_prefix,
};
inline constexpr std::size_t kNumMutants = 24;

struct MutantInfo {
  Mutant mutant;
  std::string_view name;
  /// The stack's switch; none for a plan mutant (capture-host-op: sparse_mqa captured in every
  /// layer; uv-captured-nocopy: uv_proj captured, no-copy form; mutate_plan applies them).
  StackMutant stack;
  /// A bug of the full graphs: it needs a device-driven plan to show (full-and-piecewise).
  bool full_graph;
  std::string_view bait;  // the registry case whose steps expose it
};

inline constexpr std::array<MutantInfo, kNumMutants> kMutantTable{{
    {Mutant::fresh_output, "fresh-output", StackMutant::fresh_output, false, "mutant-bait"},
    {Mutant::capture_host_op, "capture-host-op", StackMutant::none, false, "mutant-bait"},
    {Mutant::baked_short_prefill, "baked-short-prefill", StackMutant::baked_short_prefill, false,
     "mutant-bait"},
    {Mutant::uv_captured_nocopy, "uv-captured-nocopy", StackMutant::none, false, "mutant-bait"},
    {Mutant::shared_layer_clears, "shared-layer-clears", StackMutant::shared_layer_clears, false,
     "mutant-bait"},
    {Mutant::no_topk_clear, "no-topk-clear", StackMutant::no_topk_clear, false, "mutant-bait"},
    {Mutant::double_rope, "double-rope", StackMutant::double_rope, false, "mutant-bait"},
    {Mutant::padded_cache_write, "padded-cache-write", StackMutant::padded_cache_write, false,
     "mutant-bait"},
    {Mutant::stale_positions, "stale-positions", StackMutant::stale_positions, false,
     "mutant-bait"},
    {Mutant::unjoined_stream, "unjoined-stream", StackMutant::unjoined_stream, false,
     "mutant-bait"},
    {Mutant::full_for_mixed, "full-for-mixed", StackMutant::full_for_mixed, true, "mutant-bait"},
    {Mutant::stale_full_metadata, "stale-full-metadata", StackMutant::stale_full_metadata, true,
     "mutant-bait"},
    {Mutant::stale_short_prefill, "stale-short-prefill", StackMutant::stale_short_prefill, true,
     "mutant-bait"},
    {Mutant::verify_stride, "verify-stride", StackMutant::verify_stride, true, "spec-verify"},
    {Mutant::topk_bin_overflow, "topk-bin-overflow", StackMutant::topk_bin_overflow, false,
     "topk-stress"},
    {Mutant::topk_edge, "topk-edge", StackMutant::topk_edge, false, "chunk-edges"},
    {Mutant::reused_block_skip, "reused-block-skip", StackMutant::reused_block_skip, false,
     "block-reuse"},
    // Any case shows it: it runs on far blocks.
    {Mutant::int32_offset, "int32-offset", StackMutant::int32_offset, false, "spec-verify"},
    // The size map's own (docs/GPU.md): each on a path only a size past its switch takes, on a
    // case that is past it at little cost.
    {Mutant::fp8_tile_scale, "fp8-tile-scale", StackMutant::fp8_tile_scale, false, "fp8-tiles"},
    {Mutant::topk_long_row, "topk-long-row", StackMutant::topk_long_row, false, "rows-past-16384"},
    // Decode context parallelism's (issue 56), each a fault the field shipped, on vLLM's layout
    // with rows some ranks own nothing of.
    {Mutant::dcp_lse_base2, "dcp-lse-base2", StackMutant::dcp_lse_base2, false, "dcp-bait"},
    {Mutant::dcp_empty_rank_nan, "dcp-empty-rank-nan", StackMutant::dcp_empty_rank_nan, false,
     "dcp-bait"},
    {Mutant::dcp_global_as_local, "dcp-global-as-local", StackMutant::dcp_global_as_local, false,
     "dcp-bait"},
    {Mutant::dcp_share_prefix, "dcp-share-prefix", StackMutant::dcp_share_prefix, false,
     "dcp-bait"},
}};

constexpr const MutantInfo& mutant_info(Mutant m) {
  return kMutantTable[static_cast<std::size_t>(m)];
}
static_assert(
    [] {
      for (std::size_t i = 0; i < kNumMutants; ++i)
        if (static_cast<std::size_t>(kMutantTable[i].mutant) != i) return false;
      return true;
    }(),
    "the mutant table is in Mutant's order");

/// A plan mutant: mutate_plan captures an H op; the stack runs as it should.
constexpr bool is_plan_mutant(Mutant m) {
  return mutant_info(m).stack == StackMutant::none;
}
constexpr bool is_full_graph_mutant(Mutant m) {
  return mutant_info(m).full_graph;
}
/// The stack's switch for `m` (none for a plan mutant).
constexpr StackMutant stack_mutant(Mutant m) {
  return mutant_info(m).stack;
}
/// The registry case whose steps expose `m`: a family's case for the bugs of issue 41's classes
/// (topk-stress, spec-verify, chunk-edges, block-reuse), a case past its switch for the size
/// map's (fp8-tiles, rows-past-16384), else mutant-bait.
constexpr std::string_view mutant_bait(Mutant m) {
  return mutant_info(m).bait;
}
/// The name of `m` (a std::string, for messages built with +).
const std::string& mutant_name(Mutant m);
/// The mutant named `name`, or nullopt (the parse point of mutant names).
std::optional<Mutant> find_mutant(std::string_view name);
/// The mutant named `name`; throws PlanError "unknown mutant 'NAME' (known: ...)".
Mutant parse_mutant(std::string_view name);

// By name: the command line's and the GPU code's. gpu/ and tools/gpu_cmd.cpp still call these;
// each parses the name once and asks the table.

/// The names of kMutantTable, in order.
const std::vector<std::string>& mutant_names();
bool is_plan_mutant(std::string_view mutant);
/// What `Stack::set_mutant` takes for `mutant`: "" for a plan mutant (mutate_plan carries it),
/// else the name itself.
std::string stack_switch(std::string_view mutant);
/// True for the mutants of the full graphs (full-for-mixed, stale-full-metadata,
/// stale-short-prefill, verify-stride): they need a device-driven plan to show.
bool is_full_graph_mutant(std::string_view mutant);
/// The preset under which `mutant` shows: full-and-piecewise for the full graphs' mutants,
/// else narrow.
std::string mutant_plan(std::string_view mutant);
/// mutant_bait of the mutant named `mutant` ("mutant-bait" for a name that is none).
std::string mutant_bait(std::string_view mutant);
/// The stack mutant named `name` ("": none); throws PlanError for a plan mutant or a name that
/// is no mutant.
StackMutant stack_mutant(std::string_view name);

}  // namespace dsv32::boundary

// Boundary plans (BOUNDARIES.md section 2): which op of which layer is captured into a CUDA
// graph segment and which runs eagerly between segments at replay. Plans are data.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/boundary/error.hpp"
#include "dsv32/boundary/mutants.hpp"
#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/ops.hpp"
#include "dsv32/oracle/scenario.hpp"

namespace dsv32::boundary {

enum class Placement { graph, eager };

/// One layer's placement of every op, indexed by Op (graph unless set). Iterating gives each
/// op with its placement, in table order (`for (auto& [op, where] : layer)`).
class LayerPlacement {
 public:
  struct Entry {
    Op op;
    Placement where;
  };
  constexpr LayerPlacement() {
    for (std::size_t i = 0; i < kNumOps; ++i) entries_[i] = {kOpTable[i].op, Placement::graph};
  }
  constexpr Placement& operator[](Op op) { return entries_[index(op)].where; }
  constexpr Placement operator[](Op op) const { return entries_[index(op)].where; }
  constexpr auto begin() { return entries_.begin(); }
  constexpr auto end() { return entries_.end(); }
  constexpr auto begin() const { return entries_.begin(); }
  constexpr auto end() const { return entries_.end(); }

 private:
  std::array<Entry, kNumOps> entries_{};
};

// The ops are the oracle's (Op, kOpTable: dsv32/oracle/ops.hpp); F-only ops are skipped on S
// layers, and a plan runs either `uv_proj` (no-copy form) or `latent_copy` + `uv_proj_static`.

/// The most new tokens a request of a uniform decode step brings: a token and up to seven
/// drafts (vLLM captures its uniform batches at 1 + num_speculative_tokens; a longer run of one
/// request's tokens is a prefill chunk, not a verify).
inline constexpr int kMaxUniformDecodeTokens = 8;
/// True when every request of the step brings the same number q of new tokens, q <=
/// kMaxUniformDecodeTokens, none of them a prefill of several (vLLM's uniform decode batch: one
/// token each, or 1 + the drafts each in speculative decoding's verify): the steps a
/// device-driven plan's graphs serve.
bool uniform_decode(const StepInput& in);

struct Plan {
  std::string name;
  bool capture = true;              // false: the `eager` baseline, no capture machinery at all
  bool copy_form = false;           // latent_copy + uv_proj_static instead of uv_proj
  bool allow_host_capture = false;  // captures H ops on purpose (plan mutants); skips validate
  /// The H ops run their device-driven variants (docs/GPU.md, "Full graphs"): launch shapes
  /// fixed by the capture size, T_a, the lengths, the block tables and the short-prefill
  /// decision read from device buffers. They are decode kernels (token t is request t's one new
  /// token), so such a plan serves uniform decode steps, and `mixed` every other step. Capturing
  /// indexer_topk, sparse_mqa and uv_proj is then legal.
  bool device_driven = false;
  /// A device-driven plan's plan for steps that are not a uniform decode: `eager` for `full`
  /// (vLLM's FULL_DECODE_ONLY), the piecewise plan for `full-and-piecewise`. Not device-driven
  /// itself.
  std::shared_ptr<const Plan> mixed;
  std::vector<LayerPlacement> placement;  // per layer

  /// The ops layer l runs, in order (dsv32::layer_ops in this plan's form).
  OpList layer_ops(const Config& cfg, int layer) const;
  /// Where `op` of `layer` runs: eager for a plan without capture, else its placement.
  Placement at(int layer, Op op) const;
  /// What the plan records, whatever its name: the capture and copy-form switches and each
  /// layer's placement of every op ("G"/"E" in the op table's order). Two plans with one signature
  /// capture the same graphs; a stack keys its captures by (signature, capture size), so a
  /// plan renamed or a placement changed under a known name never replays another's graph.
  /// A dispatch plan's signature also names its `mixed` plan's.
  std::string signature() const;
  /// The signature of what this plan's own captures record (signature() without `mixed`): the
  /// key of its graphs on a stack, shared by `full` and `full-and-piecewise`.
  std::string record_signature() const;
  /// The plan that runs step `in`: this one, or `mixed` for a device-driven plan's step that is
  /// not a uniform decode.
  const Plan& serving(const StepInput& in) const;
};

/// The presets, in plan_names() order: eager, breakable-eager, wide, narrow, narrow-copy, full
/// (every op captured with the device-driven H ops; uniform decode steps replay it, other steps
/// run eagerly) and full-and-piecewise (vLLM's default mode: uniform decode steps replay
/// `full`'s graph, other steps the piecewise plan's, `narrow`).
enum class PlanPreset : std::uint8_t {
  eager,
  breakable_eager,
  wide,
  narrow,
  narrow_copy,
  full,
  full_and_piecewise,
};
/// The name of a preset ("narrow-copy").
const std::string& plan_preset_name(PlanPreset p);
/// The preset named `name` (no "full-and-piecewise:P" form), or nullopt.
std::optional<PlanPreset> find_plan_preset(std::string_view name);
/// The preset for cfg's layers.
Plan plan_preset(PlanPreset p, const Config& cfg);
/// `full-and-piecewise` with `piecewise` (a preset that is not device-driven) serving the steps
/// that are not a uniform decode; named "full-and-piecewise" for `narrow`, else
/// "full-and-piecewise:PIECEWISE". Throws PlanError for a preset that cannot serve them.
Plan full_and_piecewise(const Config& cfg, PlanPreset piecewise);
/// The preset under which `m` shows: full-and-piecewise for the full graphs' mutants, else
/// narrow.
constexpr PlanPreset mutant_plan(Mutant m) {
  return is_full_graph_mutant(m) ? PlanPreset::full_and_piecewise : PlanPreset::narrow;
}
/// `plan` with mutant `m` applied (capture-host-op: sparse_mqa captured in every layer;
/// uv-captured-nocopy: uv_proj captured, no-copy form); a stack mutant returns it unchanged.
/// Throws PlanError for a plan mutant on a plan that captures nothing, or a full graphs'
/// mutant with a plan that is not device-driven (it could not show).
Plan mutate_plan(const Plan& plan, Mutant m);

// By name: the parse points of the command line and the tests.

/// Names of the presets, in PlanPreset's order.
std::vector<std::string> plan_names();
/// A preset for cfg's layers, or "full-and-piecewise:P" (full_and_piecewise with P); throws
/// PlanError for an unknown name.
Plan plan_preset(std::string_view name, const Config& cfg);
/// full_and_piecewise with the plan named `piecewise` ("full-and-piecewise:P" included, which
/// is refused as device-driven); throws PlanError for a name that cannot serve them.
Plan full_and_piecewise(const Config& cfg, std::string_view piecewise);
/// mutate_plan with the mutant named `mutant`; throws PlanError for an unknown name.
Plan mutate_plan(const Plan& plan, std::string_view mutant);

/// The capture sizes up to `max_size` (vLLM's list): 1, 2, 4, multiples of 8 up to 256, then
/// multiples of 16; `max_size` itself is always included. Throws for max_size < 1.
std::vector<int> capture_sizes(int max_size);
/// The capture size a step of `num_tokens` real tokens pads to: the smallest of `sizes` (sorted
/// ascending) that is >= num_tokens; 0 when none is (the step then runs without a graph, as
/// vLLM runs batches above the largest capture size eagerly). Throws for num_tokens < 1.
int capture_size_for(const std::vector<int>& sizes, int num_tokens);

/// Rejects a plan that captures an H op unless it is device-driven (BOUNDARIES.md: only legal
/// with a device-driven variant; latent_copy has none, so a device-driven plan is no-copy) and
/// a device-driven plan without a `mixed` plan, or whose `mixed` is device-driven or invalid;
/// `allow_host_capture` bypasses the H-op rule on purpose (mutants, bisect).
void validate(const Plan& plan, const Config& cfg, bool allow_host_capture = false);

}  // namespace dsv32::boundary

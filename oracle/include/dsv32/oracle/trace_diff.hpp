// Stage-by-stage comparison of whole traces, in op order, with the TESTING.md gates.
#pragma once

#include <string>
#include <vector>

#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/oracle.hpp"

namespace dsv32 {

/// One compared stage.
struct StageDiff {
  int step = 0;
  int layer = -1;  // -1: the stack output
  std::string stage;
  CompareResult result;
  /// False when the candidate lacks the stage (or the scale it is judged with): then `result`
  /// is a refusal that says so.
  bool provided = true;
  /// "step2/layer1/olat"
  std::string where() const;
};

/// Compares a candidate's traces with T0 (and T1 for the bf16 gate) stage by stage, in op
/// order: topk rows as sets (exact), quantized stages dequantized with their scales, the rest
/// with compare_bf16 (bf16 precision) or compare_fp32 (fp32 precision).
std::vector<StageDiff> diff_traces(const Config& cfg, const std::vector<StepTrace>& candidate,
                                   const std::vector<StepTrace>& t0,
                                   const std::vector<StepTrace>& t1);

/// The base of a candidate's LSEs (goldens: natural log; MATH.md).
enum class LseBase { e, two };

/// A DCP candidate's ranks (MATH.md, context-parallel shards), for every layer where both the
/// candidate and T0 have them: `rank{r}/topk` and `rank{r}/share` as sets per row, `rank{r}/lse`
/// and `rank{r}/olat` through the stage gates over the rows where T0's share is not empty (there
/// the lse may be -inf or +inf, never NaN, and the olat is not judged), and `merge`: no NaN in
/// the merged olat of a row some rank owns none of. A failure of a known class says so in its
/// note: union where exact was asked, ranks that disagree, global positions read as local
/// slots, an LSE in the other base, a NaN from an empty rank, a failing partial beside an
/// in-place share (-1 holes: a kernel that read the valid count as a prefix). `steps` give the
/// ranks' tables.
std::vector<StageDiff> diff_dcp(const Config& cfg, const std::vector<StepInput>& steps,
                                const std::vector<StepTrace>& candidate,
                                const std::vector<StepTrace>& t0, const std::vector<StepTrace>& t1,
                                LseBase base = LseBase::e);

/// A stage that is judged only together with another (TESTING.md): `qI8` and `omega` with
/// `qI_scale`, `kI8` with `kI_scale`; a scale only through its codes (`qI_scale` through `qI8`
/// or `omega`, `kI_scale` through `kI8`). Why one of `layer`'s stages, given alone, could not be
/// judged ("kI_scale: provided without kI8; a scale is judged with its codes: provide kI8, or
/// leave out kI_scale"), naming the first such stage in trace order, or "" when every stage
/// given can be judged. A judge that skipped such a stage would pass it unseen (all-zero scales
/// once passed), so a candidate with one is refused.
std::string unjudgeable_stage(const LayerTrace& layer);

/// The n of gamma_n in the fp32 gate of a stage of layer `layer` (-1: the step's output): the
/// dot lengths along one layer's chain of products (input norm, qkv_a, q_b, uk, index scores,
/// attention scores, P.V, uv, o_proj), once per layer up to and including this one. To first
/// order the rounding errors of composed products add, so their gamma's add.
std::int64_t fp32_chain_dot(const Config& cfg, int layer);

}  // namespace dsv32

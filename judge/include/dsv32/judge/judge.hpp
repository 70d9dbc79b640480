// Judging a candidate's traces against the oracle (TESTING.md sections 1-2): any
// implementation's, read from a file or run here. CUDA-free; shared by the GPU tests, `dsv32 gpu`,
// `dsv32 judge` and the main job's verdict table.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsv32/oracle/coverage.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {

/// What judging one run found.
struct Judgement {
  std::vector<std::string> failures;  // one line each: where, what, both values
  // Where the first failure is: step, layer (-1: the output), stage ("topk" for a set).
  int first_step = -1, first_layer = -1;
  std::string first_stage;
  /// The largest gate ratio (CompareResult::gate_ratio) over every judged stage, failing or
  /// not: +inf where a failure has no finite ratio (a set that differs, a malformed row, a
  /// refused gate). 0 when every judged stage is exact or ungated.
  double worst = 0.0;
  std::string worst_where;  // "step1/layer0/o"; empty when worst is 0
  /// "worst 0.123 of its gate at step1/layer0/o", or "every judged stage exact".
  std::string worst_text() const;
  int stages = 0;  // stages compared
  // Failures that are refusals of a vacuous gate: the oracle's own T1 - T0 spread is too wide
  // to judge that stage by (a property of the scenario, whatever the GPU computed).
  int vacuous = 0;
  int topk_rows = 0;
  /// Judging with `partial`: the stages the candidate lacks, "layer0/qI8" or "output", each
  /// once. Never counted as a pass.
  std::vector<std::string> not_provided;
  /// Every stage judged or found missing, in trace order (a step's top-k validity first).
  struct Row {
    int step = 0, layer = -1;  // layer -1: the output
    std::string stage;
    bool provided = true, pass = true;
    double ratio = 0.0;  // CompareResult::gate_ratio, +inf for a failed row check; 0 if missing
    std::string summary;
    /// "layer0/q_c", or "output".
    std::string stage_path() const;
  };
  std::vector<Row> rows;
  /// What the steps judged exercised (T0's own scores; steps after a stop are not counted).
  Coverage coverage;
};

/// Judges a candidate's run of `steps` (`gpu`: its traces): each F layer's top-k row is valid
/// for the candidate's own quantized q, k and omega (fp64 scores, eps the fp32 accumulation
/// bound), and every stage matches the oracle (T0 exact, T1 emulated) recomputed on the
/// candidate's own index sets. A run of a tensor-parallel group of `tp` ranks (merged traces)
/// is judged against the unsharded T0, with T1 rounding each rank's o_proj partial before
/// their sum (StepOptions::o_proj_ranks).
///
/// `partial`: the candidate may provide any subset of the stages (each layer's `output` and
/// the steps in order from the first). A missing stage is "not provided", not a failure; a top-k
/// row without the candidate's own qI8, omega and kI8 is judged against T0's scores; missing
/// steps fail, naming the first. Without `partial` a missing stage fails. Either way every stage
/// given is judged: a candidate with a stage that is judged only with another it lacks (a scale
/// without its codes, codes without their scale: unjudgeable_stage) is refused with
/// std::invalid_argument naming the step, layer and stage.
///
/// Under DCP (cfg.dcp_size > 1) a candidate that gives its ranks' stages has them judged too
/// (diff_dcp: rows, shares, partials, the merge), its LSEs read in `lse_base`. Under `union`
/// each rank's rows (its `topk` alone: rank 0's) must be a valid top-k of the scores of the keys
/// that rank owns (the candidate's own q, omega and keys where it gives them, else T0's), and
/// are followed rank by rank.
Judgement judge(const Config& cfg, std::shared_ptr<const Weights> weights, int num_blocks,
                const std::vector<StepInput>& steps, const std::vector<StepTrace>& gpu, int tp = 1,
                bool partial = false, LseBase lse_base = LseBase::e);

/// Where two runs first differ bitwise: step, layer (-1: the output) and stage, in trace order.
struct Divergence {
  int step = -1;
  int layer = -1;
  std::string stage;
  std::string detail;  // the comparison's one-line summary
  bool found() const { return step >= 0; }
  std::string where() const;  // "step1/layer0/o"
};
Divergence first_divergence(const Config& cfg, const std::vector<StepTrace>& a,
                            const std::vector<StepTrace>& b);

/// Bitwise comparison of two runs' traces; "" when equal, else the first difference.
std::string first_difference(const Config& cfg, const std::vector<StepTrace>& a,
                             const std::vector<StepTrace>& b);

}  // namespace dsv32

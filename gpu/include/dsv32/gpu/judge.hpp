// Judging GPU traces against the oracle (TESTING.md sections 1-2), shared by the tests and the
// main job's verdict table.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsv32/oracle/oracle.hpp"

namespace dsv32::gpu {

/// What judging one run found.
struct Judgement {
  std::vector<std::string> failures;  // one line each: where, what, both values
  // Where the first failure is: step, layer (-1: the output), stage ("topk" for a set).
  int first_step = -1, first_layer = -1;
  std::string first_stage;
  double worst = 0.0;  // max over gated stages of max_err / tol
  std::string worst_where;
  int stages = 0;  // stages compared
  // Failures that are refusals of a vacuous gate: the oracle's own T1 - T0 spread is too wide
  // to judge that stage by (a property of the scenario, whatever the GPU computed).
  int vacuous = 0;
  int topk_rows = 0;
};

/// Judges a GPU run of `steps`: each F layer's top-k row is valid for the GPU's own quantized
/// q, k and omega (fp64 scores, eps the fp32 accumulation bound), and every stage matches the
/// oracle (T0 exact, T1 emulated) recomputed on the GPU's own index sets. A run of a
/// tensor-parallel group of `tp` ranks (merged traces) is judged against the unsharded T0, with
/// T1 rounding each rank's o_proj partial before their sum (StepOptions::o_proj_ranks).
Judgement judge(const Config& cfg, std::shared_ptr<const Weights> weights, int num_blocks,
                const std::vector<StepInput>& steps, const std::vector<StepTrace>& gpu, int tp = 1);

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

/// One plan's run of some steps against `eager`'s run of the same steps.
struct PlanCheck {
  std::string plan;
  std::string difference;  // the first bitwise difference from eager; "" when equal
  int captures = 0;        // captures the stack (each rank) held after the steps
  std::string structure;   // segments of the first step's capture ("GEGEG"; "" at tp > 1)
};

/// BOUNDARIES.md section 3's first invariant, shared by the plan tests and `dsv32 selfcheck`:
/// each of `plans` but `eager`, run over `steps` on a fresh stack (tp > 1: a fresh
/// tensor-parallel group, its ranks' traces merged), compared bit for bit with `eager`'s traces
/// of the same steps, in the order given. At tp 1 the plan is captured at the first step's
/// capture size before the steps run (as Stack::run would on first use), for `structure`.
std::vector<PlanCheck> check_plans_bitwise(const Config& cfg, const Weights& weights,
                                           int num_blocks, const std::vector<StepInput>& steps,
                                           const std::vector<std::string>& plans,
                                           const std::vector<StepTrace>& eager, int tp = 1);

}  // namespace dsv32::gpu

// BOUNDARIES.md section 3's first invariant on the GPU stack: every plan's run of some steps
// against `eager`'s, bit for bit.
#pragma once

#include <string>
#include <vector>

#include "dsv32/gpu/tp.hpp"
#include "dsv32/oracle/oracle.hpp"

namespace dsv32::gpu {

/// One plan's run of some steps against `eager`'s run of the same steps.
struct PlanCheck {
  std::string plan;
  std::string difference;  // the first bitwise difference from eager; "" when equal
  int captures = 0;        // captures the stack (each rank) held after the steps
  std::string structure;   // segments of the first step's capture ("GEGEG"; "" at tp > 1)
  std::string served;      // "3 full graph, 5 piecewise graph": what served the steps (tp 1)
};

/// BOUNDARIES.md section 3's first invariant, shared by the plan tests and `dsv32 selfcheck`:
/// each of `plans` but `eager`, run over `steps` on a fresh stack (tp > 1: a fresh
/// tensor-parallel group, its ranks' traces merged), compared bit for bit with `eager`'s traces
/// of the same steps, in the order given. At tp 1 the plan is captured at the first step's
/// capture size before the steps run (as Stack::run would on first use), for `structure`.
/// `mutant` (tp 1 only; "" none): a plan mutant is applied to every plan that captures, a
/// stack mutant switched on in every stack (a full graphs' mutant only shows in a plan with
/// full graphs): `dsv32 selfcheck --mutant` shows the main job failing on it. `transport`: how
/// the ranks of tp > 1 meet (TpTransport).
std::vector<PlanCheck> check_plans_bitwise(const Config& cfg, const Weights& weights,
                                           int num_blocks, const std::vector<StepInput>& steps,
                                           const std::vector<std::string>& plans,
                                           const std::vector<StepTrace>& eager, int tp = 1,
                                           const std::string& mutant = "",
                                           TpTransport transport = TpTransport::automatic);

}  // namespace dsv32::gpu

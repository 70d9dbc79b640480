// Running steps under plans on fresh GPU stacks and checking the plan invariants of
// BOUNDARIES.md section 3, shared by the plan tests and the GPU properties.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dsv32/gpu/plan_check.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"

namespace dsv32::testing {

/// Runs `steps` under the preset `plan` on a fresh stack (tp > 1: a fresh tensor-parallel group
/// whose ranks meet over `transport`, its ranks' traces merged); `captures` receives how many
/// captures the stack (each rank) ended up holding.
inline std::vector<StepTrace> run_plan(const Config& cfg, const Weights& w, int num_blocks,
                                       const std::vector<StepInput>& steps, const std::string& plan,
                                       int* captures = nullptr, int tp = 1,
                                       gpu::TpTransport transport = gpu::TpTransport::automatic) {
  if (tp > 1)
    return gpu::run_steps_tp(cfg, w, tp, num_blocks, steps, boundary::plan_preset(plan, cfg),
                             captures, transport);
  return gpu::run_steps(cfg, w, num_blocks, steps, boundary::plan_preset(plan, cfg), "", captures);
}

/// "" when `eager` passes the oracle's gates (TESTING.md) on every step and each of `plans` gives
/// eager's bits on every step, capturing once per distinct capture size; else what failed first.
/// With `unjudgeable`, a run whose only oracle failures are vacuous gates (the oracle's own
/// spread too wide to judge by) sets it and is judged by the bitwise checks alone. With tp > 1
/// every run is a tensor-parallel group's (its ranks meeting over `transport`), judged against
/// the unsharded oracle.
inline std::string check_plans(const Config& cfg, const std::shared_ptr<const Weights>& w,
                               int num_blocks, const std::vector<StepInput>& steps,
                               const std::vector<std::string>& plans,
                               std::string* unjudgeable = nullptr, int tp = 1,
                               gpu::TpTransport transport = gpu::TpTransport::automatic) {
  const std::vector<StepTrace> base =
      run_plan(cfg, *w, num_blocks, steps, "eager", nullptr, tp, transport);
  const Judgement j = judge(cfg, w, num_blocks, steps, base, tp);
  if (j.stages == 0) return "eager vs oracle: nothing was compared";
  const bool only_vacuous = j.vacuous == static_cast<int>(j.failures.size());
  if (!j.failures.empty() && unjudgeable && only_vacuous)
    *unjudgeable = j.failures.front();
  else if (!j.failures.empty())
    return "eager vs oracle: " + j.failures.front() + " (" + std::to_string(j.failures.size()) +
           " failures)";
  for (const gpu::PlanCheck& c :
       gpu::check_plans_bitwise(cfg, *w, num_blocks, steps, plans, base, tp, "", transport)) {
    if (!c.difference.empty()) return "plan " + c.plan + " differs from eager: " + c.difference;
    // One graph per capture size and plan serving a step there (a dispatch plan: its full graph
    // for uniform decode steps, its piecewise plan's for the others); at tp 1 check_plans_bitwise
    // captures the plan (both kinds) at the first step's size first.
    const boundary::Plan p = boundary::plan_preset(c.plan, cfg);
    std::set<std::pair<std::string, int>> graphs;
    if (tp == 1 && p.capture && !steps.empty()) {
      graphs.insert({p.record_signature(), steps.front().capture_size});
      if (p.mixed && p.mixed->capture)
        graphs.insert({p.mixed->record_signature(), steps.front().capture_size});
    }
    for (const StepInput& in : steps)
      if (const boundary::Plan& s = p.serving(in); s.capture)
        graphs.insert({s.record_signature(), in.capture_size});
    if (c.captures != static_cast<int>(graphs.size()))
      return "plan " + c.plan + " holds " + std::to_string(c.captures) + " captures for " +
             std::to_string(graphs.size()) + " (plan, capture size) pairs its steps use";
  }
  return "";
}

}  // namespace dsv32::testing

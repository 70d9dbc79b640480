#include "dsv32/gpu/plan_check.hpp"

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/stack_lab.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"

namespace dsv32::gpu {

std::vector<PlanCheck> check_plans_bitwise(const Config& cfg, const Weights& weights,
                                           int num_blocks, const std::vector<StepInput>& steps,
                                           const std::vector<std::string>& plans,
                                           const std::vector<StepTrace>& eager, int tp,
                                           const std::string& mutant, TpTransport transport) {
  if (tp > 1 && !mutant.empty())
    throw boundary::PlanError("check_plans_bitwise: mutants are switched on at tp 1 only");
  // The mutant's name parsed once (throws PlanError for a name that is none).
  const std::optional<boundary::Mutant> parsed =
      mutant.empty() ? std::nullopt : std::optional(boundary::parse_mutant(mutant));
  std::vector<PlanCheck> out;
  for (const std::string& name : plans) {
    boundary::Plan plan = boundary::plan_preset(name, cfg);
    if (!plan.capture) continue;  // `eager`, the baseline itself
    PlanCheck c;
    c.plan = name;
    if (parsed && boundary::is_plan_mutant(*parsed)) plan = boundary::mutate_plan(plan, *parsed);
    std::vector<StepTrace> got;
    if (tp > 1) {
      got = run_steps_tp(cfg, weights, tp, num_blocks, steps, plan, &c.captures, transport);
    } else {
      Stack stack(cfg, weights, num_blocks, max_capture_size(steps));
      if (parsed && !boundary::is_plan_mutant(*parsed)) stack.lab().set_mutant(mutant);
      if (plan.capture && !steps.empty())
        c.structure = stack.capture(plan, steps.front().capture_size).structure;
      for (const StepInput& in : steps) got.push_back(stack.run(plan, in));
      const StackReport report = stack.report();
      c.captures = report.captures;
      std::map<std::string, int> how;
      for (const Served& sv : report.served) ++how[sv.how_text()];
      for (const auto& [kind, n] : how)
        c.served += (c.served.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
    }
    c.difference = first_difference(cfg, eager, got);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace dsv32::gpu

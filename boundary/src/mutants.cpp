#include "dsv32/boundary/mutants.hpp"

#include "dsv32/boundary/error.hpp"
#include "dsv32/boundary/plan.hpp"

namespace dsv32::boundary {

const std::vector<std::string>& mutant_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const MutantInfo& m : kMutantTable) n.emplace_back(m.name);
    return n;
  }();
  return names;
}

const std::string& mutant_name(Mutant m) {
  return mutant_names()[static_cast<std::size_t>(m)];
}

std::optional<Mutant> find_mutant(std::string_view name) {
  for (const MutantInfo& m : kMutantTable)
    if (m.name == name) return m.mutant;
  return std::nullopt;
}

Mutant parse_mutant(std::string_view name) {
  if (const std::optional<Mutant> m = find_mutant(name)) return *m;
  std::string known;
  for (const std::string& n : mutant_names()) known += (known.empty() ? "" : ", ") + n;
  throw PlanError("unknown mutant '" + std::string(name) + "' (known: " + known + ")");
}

bool is_plan_mutant(std::string_view mutant) {
  const std::optional<Mutant> m = find_mutant(mutant);
  return m && is_plan_mutant(*m);
}

std::string stack_switch(std::string_view mutant) {
  return is_plan_mutant(mutant) ? std::string() : std::string(mutant);
}

bool is_full_graph_mutant(std::string_view mutant) {
  const std::optional<Mutant> m = find_mutant(mutant);
  return m && is_full_graph_mutant(*m);
}

std::string mutant_plan(std::string_view mutant) {
  const std::optional<Mutant> m = find_mutant(mutant);
  return plan_preset_name(m ? mutant_plan(*m) : PlanPreset::narrow);
}

std::string mutant_bait(std::string_view mutant) {
  const std::optional<Mutant> m = find_mutant(mutant);
  return m ? std::string(mutant_bait(*m)) : "mutant-bait";
}

StackMutant stack_mutant(std::string_view name) {
  if (name.empty()) return StackMutant::none;
  if (const std::optional<Mutant> m = find_mutant(name); m && !is_plan_mutant(*m))
    return stack_mutant(*m);
  throw PlanError("'" + std::string(name) +
                  "' is not a stack mutant (plan mutants go through boundary::mutate_plan)");
}

Plan mutate_plan(const Plan& plan, Mutant m) {
  const std::string& name = mutant_name(m);
  if (is_full_graph_mutant(m) && !plan.device_driven)
    throw PlanError("mutant '" + name + "' is a bug of the full graphs: plan '" + plan.name +
                    "' has none (use full or full-and-piecewise)");
  if (!is_plan_mutant(m)) return plan;
  if (!plan.capture) throw PlanError("mutant '" + name + "' needs a captured plan");
  Plan p = plan;
  p.name += "+" + name;
  p.allow_host_capture = true;
  if (m == Mutant::uv_captured_nocopy) p.copy_form = false;
  const Op captured = m == Mutant::capture_host_op ? Op::sparse_mqa : Op::uv_proj;
  for (LayerPlacement& layer : p.placement) layer[captured] = Placement::graph;
  return p;
}

Plan mutate_plan(const Plan& plan, std::string_view mutant) {
  return mutate_plan(plan, parse_mutant(mutant));
}

}  // namespace dsv32::boundary

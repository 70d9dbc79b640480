#include "dsv32/judge/bisect.hpp"

#include <optional>
#include <ostream>
#include <utility>

#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

/// The op that produces a trace stage; "residual_add" for the output.
std::string op_of(const std::string& stage) {
  return std::string(stage_op(stage));
}

}  // namespace

std::string_view to_string(BisectVerdict v) {
  switch (v) {
    case BisectVerdict::none:
      return "none";
    case BisectVerdict::data:
      return "data";
    case BisectVerdict::eager_segment:
      return "eager-segment";
    case BisectVerdict::boundary:
      return "boundary";
    case BisectVerdict::dispatch:
      return "dispatch";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, BisectVerdict v) {
  return os << to_string(v);
}

std::string BisectReport::summary() const {
  switch (verdict) {
    case BisectVerdict::none:
      return "no divergence: the plan gives eager's bits and eager passes";
    case BisectVerdict::boundary:
      return "capturing op '" + op + "' of layer " + std::to_string(layer) +
             " breaks bitwise equality with eager (first divergence " + where + ")";
    case BisectVerdict::dispatch:
      return "a step that is not a uniform decode was served by the full graph (first "
             "divergence " +
             where + ")";
    case BisectVerdict::eager_segment:
      return "breakable-eager already differs from eager: first divergence " + where + " (op '" +
             op + "')";
    case BisectVerdict::data:
      break;
  }
  return "eager fails the oracle: first failing stage " + where + " (op '" + op + "')";
}

BisectReport bisect(const Config& cfg, const std::shared_ptr<const Weights>& weights,
                    int num_blocks, const std::vector<StepInput>& steps, const boundary::Plan& plan,
                    const std::string& mutant, const PlanRunner& run_plan,
                    const std::function<void(const std::string&)>& progress) {
  // The mutant's name is parsed here, once.
  const std::optional<boundary::Mutant> m =
      mutant.empty() ? std::nullopt : std::optional(boundary::parse_mutant(mutant));
  const boundary::Plan target = m ? boundary::mutate_plan(plan, *m) : plan;
  const std::string stack_mutant = m && !boundary::is_plan_mutant(*m) ? mutant : std::string();
  BisectReport rep;
  const auto run = [&](const boundary::Plan& p, const std::string& what) {
    std::vector<StepTrace> out = run_plan(p, stack_mutant);
    ++rep.runs;
    if (progress) progress("run " + std::to_string(rep.runs) + ": " + what);
    return out;
  };
  const boundary::Plan eager = boundary::plan_preset(boundary::PlanPreset::eager, cfg);
  const std::vector<StepTrace> base = run(eager, "eager");
  // A data bug: eager itself is wrong. Named by the first stage the oracle rejects.
  const Judgement j = judge(cfg, weights, num_blocks, steps, base);
  if (!j.failures.empty()) {
    rep.verdict = BisectVerdict::data;
    rep.where = Divergence{j.first_step, j.first_layer, j.first_stage, ""}.where();
    rep.op = op_of(j.first_stage);
    rep.layer = j.first_layer;
    rep.detail = j.failures.front();
    return rep;
  }
  const auto differs = [&](const std::vector<StepTrace>& got) {
    return first_divergence(cfg, base, got);
  };
  // A dispatch plan's mixed steps run its piecewise plan: a fault there is that plan's, and is
  // bisected as that plan.
  const auto search = [&](const boundary::Plan& t, const Divergence& whole) {
    // The capture machinery with every op eager (a dispatch plan keeps its dispatch and its
    // device-driven variants).
    boundary::Plan none = t;
    none.name = "bisect-0";
    for (boundary::LayerPlacement& layer : none.placement)
      for (auto& [op, where] : layer) where = boundary::Placement::eager;
    const Divergence d0 = differs(run(none, "every op eager"));
    if (d0.found()) {
      rep.verdict = BisectVerdict::eager_segment;
      rep.where = d0.where();
      rep.op = op_of(d0.stage);
      rep.layer = d0.layer;
      rep.detail = d0.detail;
      return;
    }
    // The plan's captured ops in execution order; the shortest prefix that breaks ends in the
    // culprit (a prefix captures those ops and leaves the rest eager).
    std::vector<std::pair<int, Op>> graph_ops;
    for (int l = 0; l < cfg.num_layers; ++l)
      for (const Op op : t.layer_ops(cfg, l))
        if (t.at(l, op) == boundary::Placement::graph) graph_ops.emplace_back(l, op);
    std::size_t lo = 0, hi = graph_ops.size();  // prefix lo is good, prefix hi is bad
    Divergence bad = whole;
    while (hi - lo > 1) {
      const std::size_t mid = (lo + hi) / 2;
      boundary::Plan p = none;
      p.name = "bisect-" + std::to_string(mid);
      for (std::size_t i = 0; i < mid; ++i)
        p.placement[graph_ops[i].first][graph_ops[i].second] = boundary::Placement::graph;
      const Divergence d = differs(run(
          p, std::to_string(mid) + " of " + std::to_string(graph_ops.size()) + " ops captured"));
      if (d.found())
        hi = mid, bad = d;
      else
        lo = mid;
    }
    rep.verdict = BisectVerdict::boundary;
    rep.layer = graph_ops[hi - 1].first;
    rep.op = op_name(graph_ops[hi - 1].second);
    rep.where = bad.where();
    rep.detail = bad.detail;
  };
  const Divergence whole = differs(run(target, "plan " + target.name));
  if (!whole.found()) return rep;
  if (target.device_driven && target.mixed) {
    const boundary::Plan& piecewise = *target.mixed;
    if (piecewise.capture) {
      const Divergence alone = differs(run(piecewise, "its piecewise plan " + piecewise.name));
      if (alone.found()) {
        search(piecewise, alone);
        rep.detail = "in plan " + piecewise.name + ", which serves the mixed steps: " + rep.detail;
        return rep;
      }
    }
    // The piecewise plan alone gives eager's bits: a step that is not a uniform decode and still
    // differs was served by the full graph.
    if (!boundary::uniform_decode(steps.at(whole.step))) {
      rep.verdict = BisectVerdict::dispatch;
      rep.where = whole.where();
      rep.detail = "step " + std::to_string(whole.step) +
                   " is not a uniform decode and differs from eager, while plan " + piecewise.name +
                   " alone gives eager's bits: the full graph served it (" + whole.detail + ")";
      return rep;
    }
  }
  search(target, whole);
  return rep;
}

}  // namespace dsv32

// `dsv32 bisect (GOLDEN.h5 | --case NAME) --plan P [--mutant M | --all-mutants] [--json F]`:
// names the op whose move across the eager boundary breaks a plan's bitwise equality with
// `eager`, or, for a data bug, the first stage that fails the oracle (BOUNDARIES.md section 4).
// `--all-mutants` without a golden or a case runs each mutant on the registry case that
// exposes it (boundary::mutant_bait).
// Exit 0: nothing diverged (or, with --all-mutants, every mutant was caught and named);
// 1: a divergence was found and named (or a mutant went unnoticed); 2: bad usage or input.
#include <fmt/core.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/bisect.hpp"
#include "dsv32/gpu/device.hpp"
#endif

namespace dsv32::tools {
namespace {

struct BisectOptions {
  std::string golden;
  std::string case_name;
  std::string plan = "narrow";
  std::string mutant;
  bool all_mutants = false;
  std::string json;
};

int run(const BisectOptions& o) {
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_device_reason(); !why.empty()) {
    fmt::print(stderr, "dsv32 bisect: {}\n", why);
    return kExitUsage;
  }
  const bool baits = o.all_mutants && o.golden.empty() && o.case_name.empty();
  if (!baits && o.golden.empty() == o.case_name.empty()) {
    fmt::print(stderr,
               "dsv32 bisect: give a golden file or --case NAME (one of them; neither with "
               "--all-mutants: each mutant on its own case)\n");
    return kExitUsage;
  }
  // The cases, made once each: the one given, or each mutant's bait.
  std::map<std::string, golden::GoldenCase> cases;
  const auto case_for = [&](const std::string& m) -> const golden::GoldenCase& {
    const std::string name =
        baits ? std::string(boundary::mutant_bait(boundary::parse_mutant(m))) : o.case_name;
    auto it = cases.find(name);
    if (it == cases.end())
      it = cases
               .emplace(name, name.empty() ? golden::read(o.golden)
                                           : golden::generate(golden::find_case(name), "bisect"))
               .first;
    return it->second;
  };
  std::vector<std::string> mutants;
  if (o.all_mutants)
    mutants = boundary::mutant_names();
  else
    mutants.push_back(o.mutant);
  // With --all-mutants, a full graphs' mutant runs under full-and-piecewise where --plan has no
  // full graph (it could not show); the table names each run's case and plan.
  const auto plan_for = [&](const std::string& m) {
    const Config& cfg = case_for(m).cfg;
    const boundary::Plan plan = boundary::plan_preset(o.plan, cfg);
    const std::optional<boundary::Mutant> mutant = boundary::find_mutant(m);
    if (o.all_mutants && mutant && boundary::is_full_graph_mutant(*mutant) && !plan.device_driven)
      return boundary::plan_preset(boundary::mutant_plan(*mutant), cfg);
    return plan;
  };
  for (const std::string& m : mutants)  // unknown names and unusable plans fail before any run
    if (!m.empty()) boundary::mutate_plan(plan_for(m), m);
  const std::string what =
      baits ? std::string("each mutant's own case")
            : fmt::format("case {} ({} steps)", case_for("").case_id, case_for("").steps.size());
  fmt::print("dsv32 bisect: {}, plan {}, {}\n", what, o.plan, gpu::device_summary());
  fmt::print("{:<20} {:<15} {:<20} {:<14} {:<16} {:>5}  {}\n", "mutant", "case", "plan", "verdict",
             "op", "layer", "first divergence");
  nlohmann::json out{{"case", baits ? "" : case_for("").case_id}, {"plan", o.plan}};
  int unnoticed = 0, diverged = 0;
  for (const std::string& m : mutants) {
    const golden::GoldenCase& gc = case_for(m);
    const boundary::Plan p = plan_for(m);
    const gpu::BisectReport r = gpu::bisect(
        gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, p, m,
        [&](const std::string& line) { fmt::print(stderr, "  [{}] {}\n", m, line); });
    fmt::print("{:<20} {:<15} {:<20} {:<14} {:<16} {:>5}  {}\n", m.empty() ? "(none)" : m,
               gc.case_id, p.name, to_string(r.verdict), r.op.empty() ? "-" : r.op,
               r.layer < 0 ? std::string("-") : std::to_string(r.layer),
               r.where.empty() ? "-" : r.where);
    if (!o.all_mutants) fmt::print("{}\n{}\n", r.summary(), r.detail);
    unnoticed += r.verdict == BisectVerdict::none ? 1 : 0;
    diverged += r.verdict == BisectVerdict::none ? 0 : 1;
    out["results"].push_back({{"mutant", m},
                              {"case", gc.case_id},
                              {"plan", p.name},
                              {"verdict", std::string(to_string(r.verdict))},
                              {"op", r.op},
                              {"layer", r.layer},
                              {"where", r.where},
                              {"detail", r.detail},
                              {"runs", r.runs}});
  }
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  if (o.all_mutants) {
    fmt::print("{} of {} mutants caught\n", diverged, mutants.size());
    return unnoticed == 0 ? kExitPass : kExitFail;
  }
  return diverged ? kExitFail : kExitPass;
#else
  (void)o;
  fmt::print(stderr, "dsv32 bisect: this build has no CUDA\n");
  return kExitUsage;
#endif
}

}  // namespace

void add_bisect(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BisectOptions>();
  CLI::App* sub = app.add_subcommand(
      "bisect", "Name the op whose move across the eager boundary breaks a plan");
  sub->add_option("golden", o->golden, "Golden file whose steps and weights to run")
      ->check(kInputFile);
  sub->add_option("--case", o->case_name, "A registry case, generated now (e.g. mutant-bait)")
      ->check(kRegistryCase);
  sub->add_option("--plan", o->plan, "The plan that misbehaves")->capture_default_str();
  sub->add_option("--mutant", o->mutant, "Switch on a mutant of BOUNDARIES.md section 4");
  sub->add_flag("--all-mutants", o->all_mutants,
                "Bisect every mutant in turn (a table); without a golden or --case, each on the "
                "registry case that exposes it");
  sub->add_option("--json", o->json, "Also write the results as JSON")->check(kOutputFile);
  sub->callback([o, &exit_code] {
    refuse_output_clash("bisect", {{"--json", o->json}}, {{"the golden", o->golden}});
    exit_code = run(*o);
  });
}

}  // namespace dsv32::tools

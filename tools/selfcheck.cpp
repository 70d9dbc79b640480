// `dsv32 selfcheck`: the main job's verdict table for the default scenario: the oracle
// against the committed goldens, its own invariants, and the GPU plans (issue 7).
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <utility>

#include "commands.hpp"
#include "dsv32/boundary/plan.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/coverage.hpp"
#include "dsv32/oracle/scored_rows.hpp"
#include "dsv32/oracle/trace_diff.hpp"
#include "report.hpp"
#include "version.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/plan_check.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#endif

#ifndef DSV32_FIXTURES_DIR
#define DSV32_FIXTURES_DIR "fixtures"
#endif

namespace dsv32::tools {
namespace {

struct SelfcheckOptions {
  std::string mutant;  // a mutant switched on in the GPU rows ("" none)
  std::string scenario = "default";
  std::string fixtures = DSV32_FIXTURES_DIR;
  std::string json;
  std::vector<std::string> require;  // coverage requirements (docs/COVERAGE.md)
};

std::string fmt_g(double v) {
  return fmt::format("{:.3g}", v);
}

/// Regenerates every committed case and compares it with its fixture, stage by stage. Only
/// bitwise passes: the oracle's bits are a function of its inputs (docs/DETERMINISM.md), so a
/// regeneration that differs at all, even within the gates, is drift.
Verdict goldens(const SelfcheckOptions& o) {
  int cases = 0, bitwise = 0, within = 0;
  std::string first_problem, first_drift;
  for (const golden::CaseSpec& spec : golden::registry()) {
    if (!spec.committed) continue;
    ++cases;
    const std::string path = (std::filesystem::path(o.fixtures) / (spec.name + ".h5")).string();
    try {
      const golden::GoldenCase ref = golden::read(path);
      const golden::GoldenCase now = golden::generate(spec, ref.generator);
      const std::vector<StageDiff> d =
          diff_traces(spec.cfg, now.expected, ref.expected, ref.emulated);
      bool ok = true, same = true;
      for (const StageDiff& s : d) {
        ok = ok && s.result.pass;
        if (!s.result.pass && first_problem.empty())
          first_problem = spec.name + ": " + s.where() + " " + s.result.summary();
        if (s.result.max_err != 0.0 && same && first_drift.empty())
          first_drift = spec.name + ": " + s.where() + " max_err " + fmt_g(s.result.max_err);
        same = same && s.result.max_err == 0.0;
      }
      bitwise += same;
      within += ok && !same;
    } catch (const std::exception& e) {
      if (first_problem.empty()) first_problem = e.what();
    }
  }
  std::string detail = fmt::format("{}/{} cases bitwise", bitwise, cases);
  if (!first_problem.empty())
    detail = first_problem;
  else if (within > 0)
    detail = fmt::format(
        "drift: {} of {} cases within gates but not bitwise (first: {}); the "
        "fixtures were not written by this oracle",
        within, cases, first_drift);
  return {"oracle vs committed goldens (fixtures/)", bitwise == cases ? Status::pass : Status::fail,
          detail};
}

/// The case families (docs/CASES.md): every registry case with claims in `require` is made
/// again, and making it checks them against its own T0 scores.
Verdict families() {
  int cases = 0, claims = 0;
  std::string problem, names;
  for (const golden::CaseSpec& spec : golden::registry()) {
    if (spec.require.empty() || !spec.committed) continue;  // on-demand ones: when made
    ++cases;
    claims += static_cast<int>(spec.require.size());
    names += (names.empty() ? "" : ", ") + spec.name;
    try {
      golden::generate(spec, "selfcheck");
    } catch (const std::exception& e) {
      if (problem.empty()) problem = e.what();
    }
  }
  return {"case families: each exercises what it claims",
          problem.empty() ? Status::pass : Status::fail,
          problem.empty() ? fmt::format("{} claims of {} cases met ({})", claims, cases, names)
                          : problem};
}

#if DSV32_HAVE_CUDA
/// The case's steps under `eager` on one GPU with `mutant` switched on, and their judgement.
std::pair<std::vector<StepTrace>, Judgement> judged_eager(const golden::GoldenCase& gc,
                                                          const std::string& mutant) {
  std::vector<StepTrace> eager =
      gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps,
                     boundary::plan_preset("eager", gc.cfg), boundary::stack_switch(mutant));
  Judgement j =
      judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, eager);
  return {std::move(eager), std::move(j)};
}

/// Every plan on the GPU: bitwise equal to `eager`, and `eager` within the oracle's gates.
void gpu_rows(const golden::GoldenCase& gc, const std::string& mutant, std::vector<Verdict>& rows) {
  const auto [eager, j] = judged_eager(gc, mutant);
  rows.push_back({"gpu eager vs oracle (T2 vs T0/T1)",
                  j.failures.empty() && j.stages > 0 ? Status::pass : Status::fail,
                  j.failures.empty() ? fmt::format("{} stages, {} top-k rows; {}", j.stages,
                                                   j.topk_rows, j.worst_text())
                                     : j.failures.front(),
                  {},
                  // A data bug: wrong under every plan; bisect names its first failing stage.
                  bisect_command(gc.case_id, "narrow", mutant)});
  for (const gpu::PlanCheck& c : gpu::check_plans_bitwise(
           gc.cfg, gc.weights, gc.num_blocks, gc.steps, boundary::plan_names(), eager, 1, mutant)) {
    rows.push_back({"gpu plan " + c.plan + " (T3 vs T2)",
                    c.difference.empty() ? Status::pass : Status::fail,
                    c.difference.empty()
                        ? fmt::format("bitwise equal to eager over {} steps ({}); segments "
                                      "{}; oracle gate {}",
                                      gc.steps.size(), c.served, c.structure, j.worst_text())
                        : c.difference,
                    {},
                    bisect_command(gc.case_id, c.plan, mutant)});
  }
}

/// Decode context parallelism (dcp-bait: vLLM's layout over 4 ranks, ranks emulated on this
/// GPU), with `mutant` switched on: `eager` within the DCP oracle's gates, every plan bitwise
/// equal to it.
Verdict dcp_row(const std::string& mutant) {
  const golden::GoldenCase gc =
      golden::generate(golden::find_case("dcp-bait"), generator_string("selfcheck"));
  const std::string what =
      fmt::format("gpu dcp {} (dcp-bait, interleave {}): eager vs DCP oracle, every plan bitwise",
                  gc.cfg.dcp_size, gc.cfg.dcp_interleave);
  const auto [eager, j] = judged_eager(gc, mutant);
  if (!j.failures.empty() || j.stages == 0)
    return {what,
            Status::fail,
            j.failures.empty() ? "nothing compared" : j.failures.front(),
            {},
            bisect_command(gc.case_id, "narrow", mutant)};
  const std::vector<gpu::PlanCheck> checks = gpu::check_plans_bitwise(
      gc.cfg, gc.weights, gc.num_blocks, gc.steps, boundary::plan_names(), eager, 1, mutant);
  for (const gpu::PlanCheck& c : checks)
    if (!c.difference.empty())
      return {what,
              Status::fail,
              "plan " + c.plan + ": " + c.difference,
              {},
              bisect_command(gc.case_id, c.plan, mutant)};
  return {what, Status::pass,
          fmt::format("{} plans bitwise equal to eager over {} steps; oracle gate {}",
                      checks.size(), gc.steps.size(), j.worst_text())};
}

/// Tensor parallelism of `tp` ranks (over NCCL on tp GPUs, else on one GPU): `eager` within the
/// unsharded oracle's gates, every other plan bitwise equal to it.
Verdict tp_row(const golden::GoldenCase& gc, int tp) {
  const std::string what =
      fmt::format("gpu tp {} ({}): eager vs unsharded oracle, every plan bitwise", tp,
                  gpu::transport_name(gpu::TpTransport::automatic, tp));
  if (gc.cfg.num_heads % tp != 0)
    return {what, Status::not_run,
            fmt::format("{} heads do not divide by {}", gc.cfg.num_heads, tp)};
  if (const std::string why = gpu::no_tp_reason(tp); !why.empty())
    return {what, Status::not_run, why};
  const auto w = std::make_shared<const Weights>(gc.weights);
  const std::vector<StepTrace> eager = gpu::run_steps_tp(
      gc.cfg, gc.weights, tp, gc.num_blocks, gc.steps, boundary::plan_preset("eager", gc.cfg));
  const Judgement j = judge(gc.cfg, w, gc.num_blocks, gc.steps, eager, tp);
  // A stage whose gate is vacuous (T1 rounds each rank's o_proj partial: at tiny sizes the
  // spread can pass the cap, TOLERANCES.md) is judged by the bitwise plan checks alone, as the
  // TP tests do; any other failure fails the row.
  const int vacuous = j.vacuous;
  if (static_cast<int>(j.failures.size()) > vacuous || j.stages == 0) {
    std::string first = "nothing compared";
    for (const std::string& f : j.failures)
      if (f.find("vacuous gate") == std::string::npos) {
        first = f;
        break;
      }
    return {what, Status::fail, first};
  }
  const std::vector<gpu::PlanCheck> checks = gpu::check_plans_bitwise(
      gc.cfg, gc.weights, gc.num_blocks, gc.steps, boundary::plan_names(), eager, tp);
  for (const gpu::PlanCheck& c : checks)
    if (!c.difference.empty()) return {what, Status::fail, "plan " + c.plan + ": " + c.difference};
  return {what, Status::pass,
          fmt::format("{} plans bitwise equal to tp eager; oracle gate {}{}", checks.size(),
                      j.worst_text(),
                      vacuous ? fmt::format("; {} stage(s) of vacuous gate judged bitwise only "
                                            "(first: {})",
                                            vacuous, j.failures.front().substr(0, 40))
                              : "")};
}
#endif

/// `--mutant` with no GPU rows to show it in: the run could not check what it was asked to.
struct MutantNotRun : std::runtime_error {
  explicit MutantNotRun(const std::string& why)
      : std::runtime_error(
            "--mutant switches on a bug of the GPU build, and the GPU rows did not "
            "run (" +
            why + "): nothing was checked") {}
};

std::vector<Verdict> run(const SelfcheckOptions& o) {
  if (!o.mutant.empty()) {  // refused before the work, not after it
#if DSV32_HAVE_CUDA
    if (const std::string why = gpu::no_device_reason(); !why.empty()) throw MutantNotRun(why);
#else
    throw MutantNotRun("this build has no CUDA");
#endif
  }
  std::vector<Verdict> rows;
  rows.push_back(goldens(o));
  rows.push_back(families());

  const golden::CaseSpec& spec = golden::find_case(o.scenario);
  const Config& cfg = spec.cfg;
  const golden::GoldenCase gc = golden::generate(spec, generator_string("selfcheck"));

  // The same steps unpadded must give the same real rows.
  golden::CaseSpec unpadded = spec;
  for (golden::StepPlan& p : unpadded.steps) p.capture_size = 0;
  const golden::GoldenCase up = golden::generate(unpadded, "");
  double pad_diff = 0;
  for (std::size_t s = 0; s < gc.expected.size(); ++s)
    for (std::size_t i = 0; i < gc.expected[s].output.data.size(); ++i)
      pad_diff = std::max(pad_diff,
                          std::fabs(gc.expected[s].output.data[i] - up.expected[s].output.data[i]));
  rows.push_back({"oracle exact: padded rows (NaN) change no real row",
                  pad_diff <= 1e-12 ? Status::pass : Status::fail, "max diff " + fmt_g(pad_diff)});

  // Every F layer's top-k row is valid against the exact scores.
  const auto w = std::make_shared<const Weights>(gc.weights);
  Oracle exact(cfg, w, Mode::exact, spec.num_blocks);
  std::string topk_problem;
  int n_rows = 0;
  Coverage coverage;
  for (std::size_t s = 0; s < gc.steps.size(); ++s) {
    const StepInput& in = gc.steps[s];
    const StepTrace tr = exact.step(in);
    coverage.add_step(in, cfg.index_topk);
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (!cfg.is_full_layer(l)) continue;
      const TopkRows rows_l = topk_rows(tr.layers[l]);
      scored_rows(
          in.num_tokens, [&](int t) { return exact.index_scores(l, in, tr.layers[l], t); },
          [&](int t, const IndexScores& sc) {
            coverage.add_scores(sc.score, cfg.index_topk);
            std::vector<int> row(rows_l.row(t).data(), rows_l.row(t).data() + cfg.index_topk);
            const std::string why = check_topk_row(row, sc.score, cfg.index_topk, 0.0);
            if (!why.empty() && topk_problem.empty())
              topk_problem = fmt::format("step{}/layer{}/token{}: {}", s, l, t, why);
            ++n_rows;
          });
    }
  }
  rows.push_back({"oracle exact: top-k rows valid against exact scores",
                  topk_problem.empty() ? Status::pass : Status::fail,
                  topk_problem.empty() ? fmt::format("{} rows", n_rows) : topk_problem});
  // What the scenario exercises, and the requirements on it (docs/COVERAGE.md).
  std::string unmet;
  for (const std::string& r : o.require)
    if (const std::string why = Requirement::parse(r).check(coverage);
        !why.empty() && unmet.empty())
      unmet = "not exercised: --require " + why;
  std::map<std::string, long> metrics;
  for (const auto& [name, v] : coverage.metrics()) metrics[name] = v;
  rows.push_back({o.require.empty() ? "coverage of the scenario"
                                    : fmt::format("coverage of the scenario (--require {})",
                                                  fmt::join(o.require, ", ")),
                  !unmet.empty()      ? Status::fail
                  : o.require.empty() ? Status::info
                                      : Status::pass,
                  unmet.empty() ? coverage.line().substr(10) : unmet, metrics});

  // The gates the GPU will face (T0 judged by itself with T1's spread) must be non-vacuous.
  double widest = 0;
  std::string where, refused;
  for (const StageDiff& d : diff_traces(cfg, gc.expected, gc.expected, gc.emulated)) {
    if (d.result.refused && refused.empty()) refused = d.where() + ": " + d.result.note;
    const double cap = d.result.tol > 0 && d.result.rms > 0 ? d.result.tol / d.result.rms : 0;
    if (cap > widest) widest = cap, where = d.where();
  }
  rows.push_back(
      {"oracle T1 spread: every gate non-vacuous", refused.empty() ? Status::pass : Status::fail,
       refused.empty() ? fmt::format("widest gate {:.1f}% of RMS at {}", 100 * widest, where)
                       : refused});
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_device_reason(); !why.empty()) {
    rows.push_back({fmt::format("gpu plans ({})", fmt::join(boundary::plan_names(), ", ")),
                    Status::not_run, why});
  } else {
    gpu_rows(gc, o.mutant, rows);
    rows.push_back(dcp_row(o.mutant));
    if (o.mutant.empty())
      for (int tp : {2, 4}) rows.push_back(tp_row(gc, tp));
  }
#else
  rows.push_back({"gpu plans", Status::not_run, "built without CUDA"});
#endif
  return rows;
}

}  // namespace

void add_selfcheck(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<SelfcheckOptions>();
  CLI::App* sub = app.add_subcommand("selfcheck", "Verdict table for the default scenario");
  sub->add_option("--scenario", o->scenario, "Registry case to judge")
      ->check(kRegistryCase)
      ->capture_default_str();
  sub->add_option("--fixtures", o->fixtures, "Directory of committed goldens")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  sub->add_option("--json", o->json, "Also write the verdicts as JSON here")->check(kOutputFile);
  sub->add_option("--require", o->require,
                  "METRIC OP VALUE[%], e.g. pruned>=50%: fail unless the scenario exercised it "
                  "(docs/COVERAGE.md); again for more")
      ->check(kRequirement);
  sub->add_option("--mutant", o->mutant,
                  "Switch on a mutant of the GPU build (BOUNDARIES.md section 4, docs/GPU.md) in "
                  "the GPU rows: the table must then fail (the tensor-parallel rows are left out)")
      ->check([](const std::string& m) {
        const auto& names = boundary::mutant_names();
        return std::find(names.begin(), names.end(), m) == names.end()
                   ? fmt::format("unknown mutant '{}' (known: {})", m, fmt::join(names, ", "))
                   : std::string();
      });
  sub->callback([o, &exit_code] {
    std::vector<NamedPath> fixtures;  // what the goldens row reads
    for (const golden::CaseSpec& spec : golden::registry())
      if (spec.committed)
        fixtures.push_back(
            {"fixture", (std::filesystem::path(o->fixtures) / (spec.name + ".h5")).string()});
    refuse_output_clash("selfcheck", {{"--json", o->json}}, fixtures);
    const std::vector<Verdict> rows = run(*o);
    const std::string title =
        fmt::format("dsv32 selfcheck: scenario {}{}", o->scenario,
                    o->mutant.empty() ? "" : ", mutant " + o->mutant + " switched on");
    const bool ok = print_verdicts(title, rows);
    if (!o->json.empty()) write_verdicts_json(o->json, title, rows);
    exit_code = ok ? kExitPass : kExitFail;
  });
}

}  // namespace dsv32::tools

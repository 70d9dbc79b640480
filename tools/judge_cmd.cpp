// `dsv32 judge CANDIDATE.h5 --golden GOLDEN.h5 [--json REPORT]`: judges any implementation's
// traces (docs/CANDIDATE.md) against a golden case with TESTING.md's rules, the oracle recomputed
// on the candidate's own top-k sets. Exit 0: every provided stage passes; 1: a stage fails (the
// first one named); 2: bad input.
#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/judge/judge.hpp"
#include "requirements.hpp"

namespace dsv32::tools {
namespace {

struct JudgeOptions {
  std::string candidate, golden, json;
  int tp = 1;
  double max_gib = 16;
  std::vector<std::string> require;  // docs/COVERAGE.md: `pruned>=50%`, checked after judging
};

/// One (layer, stage) over the steps: its status and worst gate ratio.
struct StageLine {
  std::string name;
  int judged = 0, failed = 0, missing = 0;
  double worst = 0.0;
  std::string first_failure;
};

/// A gate ratio in the JSON report: a number, or the string "inf" for a failure that no finite
/// ratio measures (JSON has no infinity).
nlohmann::json ratio_json(double r) {
  return std::isfinite(r) ? nlohmann::json(r) : nlohmann::json("inf");
}

int run(const JudgeOptions& o) {
  refuse_output_clash("judge", {{"--json", o.json}},
                      {{"the candidate", o.candidate}, {"--golden", o.golden}});
  golden::ReadLimits limits;
  limits.max_bytes = o.max_gib * (1ull << 30);
  golden::GoldenCase gc = golden::read(o.golden, limits);
  const std::vector<StepTrace> cand = golden::read_candidate(o.candidate, gc, limits);
  fmt::print(stderr, "  judging {} step(s) of {} against case {}\n", cand.size(), o.candidate,
             gc.case_id);
  // The weights move to the judge's oracles (at DSv3.2 sizes a copy is 1.6 GB of doubles).
  const LseBase base = golden::read_candidate_lse_base(o.candidate, limits);
  const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(std::move(gc.weights)),
                            gc.num_blocks, gc.steps, cand, o.tp, /*partial=*/true, base);
  // The stages in trace order, each once.
  std::vector<StageLine> lines;
  std::map<std::string, std::size_t> at;
  for (const Judgement::Row& r : j.rows) {
    const std::string name = r.stage_path();
    auto [it, fresh] = at.try_emplace(name, lines.size());
    if (fresh) lines.push_back(StageLine{name, 0, 0, 0, 0.0, ""});
    StageLine& s = lines[it->second];
    if (!r.provided) {
      ++s.missing;
      continue;
    }
    ++s.judged;
    s.worst = std::max(s.worst, r.ratio);
    if (!r.pass && s.failed++ == 0)
      s.first_failure = "step" + std::to_string(r.step) + ": " + r.summary;
  }
  const bool pass = j.failures.empty();
  fmt::print("dsv32 judge: {} against {} (case {}, {} of {} steps provided)\n", o.candidate,
             o.golden, gc.case_id, cand.size(), gc.steps.size());
  fmt::print("{:<18} {:<13} {:>8}  {}\n", "stage", "status", "worst", "first failure");
  nlohmann::json stages = nlohmann::json::array();
  for (const StageLine& s : lines) {
    const std::string status = s.failed   ? "FAIL"
                               : s.judged ? (s.missing ? "pass (part)" : "pass")
                                          : "not provided";
    fmt::print("{:<18} {:<13} {:>8}  {}\n", s.name, status,
               s.judged ? fmt::format("{:.3f}", s.worst) : "", s.first_failure);
    stages.push_back({{"stage", s.name},
                      {"status", status},
                      {"steps_judged", s.judged},
                      {"steps_missing", s.missing},
                      {"steps_failed", s.failed},
                      {"worst_ratio", ratio_json(s.worst)},
                      {"first_failure", s.first_failure}});
  }
  for (const std::string& f : j.failures) fmt::print("  FAIL {}\n", f);
  fmt::print("{}\n", j.coverage.line());
  // Requirements on what the run exercised: a numeric pass that did not exercise them fails.
  const RequirementsChecked checked = check_requirements(o.require, j.coverage);
  const std::string& unmet = checked.first_unmet;
  const bool met = unmet.empty();
  if (pass && met)
    fmt::print("verdict: pass ({} stages and {} top-k rows judged; {} not provided; {})\n",
               j.stages, j.topk_rows, j.not_provided.size(), j.worst_text());
  else if (pass)
    fmt::print("verdict: FAIL: every stage passes, but the run did not exercise --require {}\n",
               unmet);
  else
    fmt::print("verdict: FAIL at step{}{}/{}: {}\n", j.first_step,
               j.first_layer < 0 ? "" : "/layer" + std::to_string(j.first_layer), j.first_stage,
               j.failures.front());
  if (!o.json.empty()) {
    nlohmann::json out{{"candidate", o.candidate},
                       {"golden", o.golden},
                       {"case_id", gc.case_id},
                       {"verdict", pass && met ? "pass" : "fail"},
                       {"steps_provided", cand.size()},
                       {"steps", gc.steps.size()},
                       {"stages_judged", j.stages},
                       {"topk_rows_judged", j.topk_rows},
                       {"worst_ratio", ratio_json(j.worst)},
                       {"worst_where", j.worst_where},
                       {"not_provided", j.not_provided},
                       {"failures", j.failures},
                       {"stages", stages},
                       {"requirements", checked.results}};
    nlohmann::json cov;
    for (const auto& [name, v] : j.coverage.metrics()) cov[name] = v;
    out["coverage"] = cov;
    if (!pass)
      out["first_failure"] = {{"step", j.first_step},
                              {"layer", j.first_layer},
                              {"stage", j.first_stage},
                              {"message", j.failures.front()}};
    else if (!met)
      out["first_failure"] = {{"step", -1},
                              {"layer", -1},
                              {"stage", "require"},
                              {"message", "not exercised: --require " + unmet}};
    else
      out["first_failure"] = nullptr;
    files::write_atomically(o.json, out.dump(2) + "\n");
  }
  return pass && met ? kExitPass : kExitFail;
}

}  // namespace

void add_judge(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<JudgeOptions>();
  CLI::App* sub = app.add_subcommand(
      "judge", "Judge any implementation's traces (docs/CANDIDATE.md) against a golden case");
  sub->add_option("candidate", o->candidate, "Candidate file: /steps/step{s}/expected/...")
      ->required()
      ->check(kInputFile);
  sub->add_option("--golden", o->golden, "Golden file the candidate ran")
      ->required()
      ->check(kInputFile);
  sub->add_option("--json", o->json, "Also write the report as JSON")->check(kOutputFile);
  sub->add_option("--max-gib", o->max_gib, "Refuse files whose tensors need more memory")
      ->check(positive_up_to(1 << 20))
      ->capture_default_str();
  sub->add_option("--require", o->require,
                  "METRIC OP VALUE[%], e.g. pruned>=50%: exit 1 unless the run exercised it "
                  "(docs/COVERAGE.md); again for more")
      ->check(kRequirement);
  sub->add_option("--tp", o->tp,
                  "The candidate ran as tp tensor-parallel ranks (T1 rounds each rank's o_proj "
                  "partial)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  sub->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace dsv32::tools

// `dsv32 diff CANDIDATE REFERENCE`: stage-by-stage comparison in op order, so the first
// divergent stage stands out.
#include <fmt/core.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32::tools {
namespace {

struct DiffOptions {
  std::string candidate, reference;
  std::string group = "expected";
  bool all_rows = false;
  std::string json;
  double max_gib = 16;
};

int run(const DiffOptions& o) {
  golden::ReadLimits limits;
  limits.max_bytes = o.max_gib * (1ull << 30);
  const golden::GoldenCase cand = golden::read(o.candidate, limits);
  const golden::GoldenCase ref = golden::read(o.reference, limits);
  if (!(cand.cfg == ref.cfg)) {
    fmt::print(stderr, "dsv32 diff: the two files have different configs: {}\n",
               golden::config_difference(cand.cfg, ref.cfg));
    return kExitUsage;
  }
  const auto& traces = o.group == "emulated" ? cand.emulated : cand.expected;
  const std::vector<StageDiff> rows = diff_traces(ref.cfg, traces, ref.expected, ref.emulated);
  int bad = 0;
  const StageDiff* first = nullptr;
  fmt::print("dsv32 diff: {} [{}] vs {} (T0 expected, T1 emulated), profile {}\n", o.candidate,
             o.group, o.reference, ref.tolerance_profile);
  fmt::print("{:<28} {:<16} {:<8} {:>12} {:>12}  {}\n", "stage", "op", "status", "max_err", "tol",
             "detail");
  for (const StageDiff& d : rows) {
    const bool ok = d.result.pass;
    if (!ok) {
      ++bad;
      if (!first) first = &d;
    }
    if (ok && !o.all_rows) continue;
    std::string detail = d.result.note;
    if (d.result.first_bad >= 0)
      detail = fmt::format("first bad {} got {:.6g} want {:.6g}; {}/{} over. {}",
                           d.result.first_bad, d.result.got_at, d.result.want_at,
                           d.result.count_over, d.result.count, d.result.note);
    fmt::print("{:<28} {:<16} {:<8} {:>12.4g} {:>12.4g}  {}\n", d.where(), stage_op(d.stage),
               d.result.refused ? "REFUSED"
               : ok             ? "ok"
                                : "FAIL",
               d.result.max_err, d.result.tol, detail);
  }
  if (first)
    fmt::print("\nfirst divergent stage: {} (op {}); {} of {} stages fail\n", first->where(),
               stage_op(first->stage), bad, rows.size());
  else
    fmt::print("\nall {} stages agree\n", rows.size());
  if (!o.json.empty()) {
    nlohmann::json j;
    for (const StageDiff& d : rows)
      j["stages"].push_back({{"where", d.where()},
                             {"op", stage_op(d.stage)},
                             {"pass", d.result.pass},
                             {"refused", d.result.refused},
                             {"max_err", d.result.max_err},
                             {"tol", d.result.tol},
                             {"first_bad", d.result.first_bad},
                             {"count_over", d.result.count_over},
                             {"note", d.result.note}});
    j["first_divergent"] = first ? first->where() : "";
    j["pass"] = bad == 0;
    files::write_atomically(o.json, j.dump(2) + "\n");
  }
  return bad == 0 ? kExitPass : kExitFail;
}

}  // namespace

void add_diff(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<DiffOptions>();
  CLI::App* sub = app.add_subcommand("diff", "Compare a golden (or dump) with a reference golden");
  sub->add_option("candidate", o->candidate, "File to judge")->required()->check(kInputFile);
  sub->add_option("reference", o->reference, "Reference golden file")
      ->required()
      ->check(kInputFile);
  sub->add_option("--group", o->group, "Candidate group to judge")
      ->check(CLI::IsMember({"expected", "emulated"}))
      ->capture_default_str();
  sub->add_flag("--all-rows", o->all_rows, "Print passing stages too");
  sub->add_option("--json", o->json, "Also write the comparison as JSON")->check(kOutputFile);
  sub->add_option("--max-gib", o->max_gib, "Refuse files whose tensors need more memory")
      ->check(positive_up_to(1 << 20))
      ->capture_default_str();
  sub->callback([o, &exit_code] {
    refuse_output_clash("diff", {{"--json", o->json}},
                        {{"the candidate", o->candidate}, {"the reference", o->reference}});
    exit_code = run(*o);
  });
}

}  // namespace dsv32::tools

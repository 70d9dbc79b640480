// `dsv32 selfcheck`: the main job's verdict table for the default scenario.
// Today it checks the oracle against itself (invariances, top-k validity, the bf16 spread the
// GPU gates will use); the GPU columns report why they were not run.
#include <fmt/core.h>

#include <cmath>
#include <memory>

#include "commands.hpp"
#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "report.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#endif

namespace dsv32::tools {
namespace {

struct Options {
  std::string preset = "tiny-fs";
  std::uint64_t seed = 1;
  std::string json;
};

// Steps of the default scenario: prefill, a mixed padded step, then contexts beyond K.
const std::vector<std::pair<std::vector<StepRequest>, int>>& default_steps() {
  static const std::vector<std::pair<std::vector<StepRequest>, int>> steps{
      {{{0, 12}, {1, 3}}, 16},
      {{{0, 1}, {1, 1}, {2, 5}}, 8},
      {{{0, 1}, {1, 9}, {2, 1}}, 16},
      {{{0, 1}, {2, 1}}, 2},
  };
  return steps;
}

std::string fmt_g(double v) {
  return fmt::format("{:.3g}", v);
}

std::vector<Verdict> run(const Options& o) {
  const Config cfg = preset(o.preset);
  const auto w = std::make_shared<Weights>(Weights::generate(cfg, o.seed));
  const int blocks = 64;
  Oracle exact(cfg, w, Mode::exact, blocks), emul(cfg, w, Mode::emulated, blocks),
      unpadded(cfg, w, Mode::exact, blocks);
  ScenarioBuilder b_pad(cfg, o.seed, blocks), b_plain(cfg, o.seed, blocks);
  std::vector<Verdict> rows;
  double pad_diff = 0, worst_topk_eps = 0, worst_spread = 0, worst_cap_ratio = 0;
  std::string topk_problem, spread_tensor;
  int topk_rows = 0;
  for (std::size_t s = 0; s < default_steps().size(); ++s) {
    const auto& [reqs, capture] = default_steps()[s];
    const StepInput in = b_pad.step(reqs, capture, Poison::nan);
    const StepInput in_plain = b_plain.step(reqs);
    const StepTrace t0 = exact.step(in), tp = unpadded.step(in_plain);
    const StepTrace t1 = emul.step(in, StepOptions::follow(cfg, t0));
    for (std::size_t i = 0; i < t0.output.data.size(); ++i)
      pad_diff = std::max(pad_diff, std::fabs(t0.output.data[i] - tp.output.data[i]));
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerTrace& lt = t0.layers[l];
      for (const Tensor& x0 : lt.tensors) {
        if (x0.dtype == DType::int32 || is_indexer_stage(x0.name) || x0.name == "lse") continue;
        const DType st = storage_dtype(cfg, x0.name);
        const double cap = vacuity_cap(x0, st);
        const CompareResult r =
            compare_bf16(t1.layers[l].at(x0.name), x0, t1.layers[l].at(x0.name), st);
        if (r.tol / cap > worst_cap_ratio) {
          worst_cap_ratio = r.tol / cap;
          spread_tensor = fmt::format("step{}/layer{}/{}", s, l, x0.name);
        }
        worst_spread = std::max(worst_spread, r.tol);
      }
      if (!cfg.is_full_layer(l)) continue;
      const Tensor& topk = lt.at("topk");
      for (int t = 0; t < in.num_tokens; ++t) {
        const Oracle::IndexScores sc = exact.index_scores(l, in, lt, t);
        double eps = 0;
        for (double a : sc.abs_terms) eps = std::max(eps, index_score_eps(cfg, a));
        worst_topk_eps = std::max(worst_topk_eps, eps);
        std::vector<int> row(cfg.index_topk);
        for (int k = 0; k < cfg.index_topk; ++k)
          row[k] = static_cast<int>(topk.data[static_cast<std::size_t>(t) * cfg.index_topk + k]);
        const std::string why = check_topk_row(row, sc.score, cfg.index_topk, 0.0);
        if (!why.empty() && topk_problem.empty())
          topk_problem = fmt::format("step{}/layer{}/token{}: {}", s, l, t, why);
        ++topk_rows;
      }
    }
  }
  rows.push_back({"oracle exact: padded rows (NaN) change no real row",
                  pad_diff <= 1e-12 ? "pass" : "FAIL", "max diff " + fmt_g(pad_diff)});
  rows.push_back({"oracle exact: top-k rows valid against exact scores",
                  topk_problem.empty() ? "pass" : "FAIL",
                  topk_problem.empty() ? fmt::format("{} rows", topk_rows) : topk_problem});
  rows.push_back(
      {"oracle emulated vs exact: bf16 gates non-vacuous", worst_cap_ratio <= 1.0 ? "pass" : "FAIL",
       fmt::format("widest gate {:.2f} of its cap at {}", worst_cap_ratio, spread_tensor)});
#if DSV32_HAVE_CUDA
  const std::string why = gpu::no_device_reason();
  rows.push_back({"gpu plans", "not run", why.empty() ? "GPU plans arrive with issue 7" : why});
#else
  rows.push_back({"gpu plans", "not run", "built without CUDA"});
#endif
  return rows;
}

}  // namespace

void add_selfcheck(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("selfcheck", "Verdict table for the default scenario");
  sub->add_option("--preset", o->preset, "Config preset")->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of weights and inputs")->capture_default_str();
  sub->add_option("--json", o->json, "Also write the verdicts as JSON here");
  sub->callback([o, &exit_code] {
    const std::vector<Verdict> rows = run(*o);
    const std::string title = fmt::format("dsv32 selfcheck: preset {}, seed {}, {} steps",
                                          o->preset, o->seed, default_steps().size());
    const bool ok = print_verdicts(title, rows);
    if (!o->json.empty()) write_verdicts_json(o->json, title, rows);
    exit_code = ok ? kExitPass : kExitFail;
  });
}

}  // namespace dsv32::tools

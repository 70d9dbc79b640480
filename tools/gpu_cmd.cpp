// `dsv32 gpu GOLDEN.h5 --plan P [--tp N] [--dcp W [--dcp-interleave I]] [--dump OUT.h5]
// [--require R] [--json F]`: runs a golden case's steps on the GPU under a plan (with --tp, on N
// GPUs, each with 1/N of the heads, or N ranks on one GPU; with --dcp, its keys over W
// decode-context-parallel ranks emulated on each), judges the run against the (unsharded) oracle,
// reports what the run exercised (the case's coverage, which graph served each step, which kernel
// paths ran; docs/COVERAGE.md) and optionally writes the GPU's trace as a golden-schema file (in
// `expected` and `emulated`) that `dsv32 diff OUT.h5 GOLDEN.h5` reads.
#include <fmt/core.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/coverage.hpp"
#include "report.hpp"
#include "requirements.hpp"
#include "version.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#endif

namespace dsv32::tools {
namespace {

struct GpuOptions {
  std::string golden;
  std::string plan = "eager";
  std::string dump;
  std::string json;
  std::vector<std::string> require;
  int tp = 1;
  int dcp = 1, dcp_interleave = 1;
  bool far_blocks = false;
};

/// The config the run shards `golden` by: the golden's own, or resharded over --dcp ranks (an
/// unsharded golden only: a DCP golden's ranks are its own). Throws ConfigError naming the
/// flag.
Config run_config(const Config& golden, const GpuOptions& o) {
  if (o.dcp == 1 && o.dcp_interleave == 1) return golden;
  if (o.dcp == 1)
    throw ConfigError("--dcp-interleave " + std::to_string(o.dcp_interleave) +
                      " needs --dcp W > 1 (the interleave of a DCP layout)");
  if (golden.dcp_size > 1)
    throw ConfigError("--dcp: the golden is sharded already (dcp_size " +
                      std::to_string(golden.dcp_size) +
                      "); --dcp reshards an unsharded golden only");
  Config c = golden;
  c.dcp_size = o.dcp;
  c.dcp_interleave = o.dcp_interleave;
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw ConfigError("--dcp " + std::to_string(o.dcp) + " --dcp-interleave " +
                      std::to_string(o.dcp_interleave) + ": " + e.what());
  }
  if (o.tp > 1 && o.tp % o.dcp != 0)
    throw ConfigError("--dcp " + std::to_string(o.dcp) + " does not divide --tp " +
                      std::to_string(o.tp) + " (a DCP group is ranks of the TP group)");
  return c;
}

/// The counts `dsv32 gpu` adds to a requirement's metrics: the steps each kind of graph served,
/// and the top-k rows whose threshold bin was crowded (radix passes within it, counted on the
/// device).
const std::vector<std::string>& served_metrics() {
  static const std::vector<std::string> names{"steps_full", "steps_piecewise", "steps_eager",
                                              "crowded_bin_rows"};
  return names;
}

int run(const GpuOptions& o) {
  // The DCP flags are checked against the golden's layout first, with or without CUDA.
  std::optional<golden::GoldenCase> read;
  std::optional<Config> resharded;
  if (o.dcp > 1 || o.dcp_interleave > 1) {
    read = golden::read(o.golden);
    try {
      resharded = run_config(read->cfg, o);
    } catch (const ConfigError& e) {
      fmt::print(stderr, "dsv32 gpu: {}\n", e.what());
      return kExitUsage;
    }
  }
#if DSV32_HAVE_CUDA
  golden::GoldenCase gc = read ? std::move(*read) : golden::read(o.golden);
  const Config cfg = resharded ? *resharded : gc.cfg;
  if (const std::string why = gpu::no_tp_reason(o.tp); !why.empty()) {
    fmt::print(stderr, "dsv32 gpu: {}\n", why);
    return kExitUsage;
  }
  const boundary::Plan plan = boundary::plan_preset(o.plan, gc.cfg);
  const int T = max_capture_size(gc.steps);
  gpu::StackOptions options;
  if (o.far_blocks) {
    options.block_offset = gpu::far_block_offset(gc.cfg);
    fmt::print("  far blocks: block ids moved up by {} (slot x row past 2^31 elements)\n",
               options.block_offset);
  }
  gpu::TpGroup group(cfg, gc.weights, o.tp, gc.num_blocks, T, options);
  std::vector<StepTrace> got;
  for (std::size_t s = 0; s < gc.steps.size(); ++s) {
    got.push_back(group.run(plan, gc.steps[s]));
    progress(fmt::format("  {}: step {}/{}", gc.case_id, s + 1, gc.steps.size()),
             s + 1 == gc.steps.size());
  }
  const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks,
                            gc.steps, got, o.tp);
  const std::string dcp =
      cfg.dcp_size > 1 ? fmt::format(" dcp {} interleave {}", cfg.dcp_size, cfg.dcp_interleave)
                       : "";
  fmt::print(
      "dsv32 gpu: case {} plan {} tp {} ({}){} on {}: {} stages and {} top-k rows judged, {} "
      "failures\n",
      gc.case_id, o.plan, o.tp, gpu::transport_name(group.transport(), o.tp), dcp,
      gpu::device_summary(), j.stages, j.topk_rows, j.failures.size());
  for (const std::string& f : j.failures) fmt::print("  FAIL {}\n", f);
  if (j.failures.empty()) fmt::print("  {}\n", j.worst_text());
  // What the run exercised: the case's rows, the graphs that served the steps, the paths.
  fmt::print("  {}\n", j.coverage.line());
  std::map<std::string, long> counts{
      {"steps_full", 0}, {"steps_piecewise", 0}, {"steps_eager", 0}, {"crowded_bin_rows", 0}};
  nlohmann::json served = nlohmann::json::array();
  std::string by_step;
  const gpu::StackReport report = group.report();
  for (std::size_t s = 0; s < report.served.size(); ++s) {
    const gpu::Served& sv = report.served[s];
    using How = gpu::Served::How;
    ++counts[sv.how == How::full_graph        ? "steps_full"
             : sv.how == How::piecewise_graph ? "steps_piecewise"
                                              : "steps_eager"];
    served.push_back({{"step", s},
                      {"plan", sv.plan},
                      {"how", sv.how_text()},
                      {"capture_size", sv.capture_size}});
    by_step += fmt::format("{}{}: {} {}{}", s ? "; " : "", s, sv.plan, sv.how_text(),
                           sv.how == How::eager ? "" : fmt::format(" at {}", sv.capture_size));
  }
  fmt::print("  served: {} steps by a full graph, {} by a piecewise graph, {} eagerly ({})\n",
             counts["steps_full"], counts["steps_piecewise"], counts["steps_eager"], by_step);
  nlohmann::json paths = nlohmann::json::object();
  for (const auto& [path, n] : report.kernel_paths) {
    const bool rows =
        std::find(std::begin(gpu::kTopkRowPathNames), std::end(gpu::kTopkRowPathNames), path) !=
        std::end(gpu::kTopkRowPathNames);
    fmt::print("  kernel path: {} ({} {})\n", path, n, rows ? "rows" : "layer-steps");
    paths[path] = n;
    if (path == gpu::kTopkCrowdedBinPath) counts["crowded_bin_rows"] = n;
  }
  const RequirementsChecked checked = check_requirements(o.require, j.coverage, counts);
  const std::string& unmet = checked.first_unmet;
  const bool pass = j.failures.empty() && unmet.empty();
  if (j.failures.empty() && !unmet.empty())
    fmt::print("verdict: FAIL: every stage passes, but the run did not exercise --require {}\n",
               unmet);
  // Both outputs or neither: each to a temporary file, renamed together.
  files::StagedFiles outputs;
  if (!o.json.empty()) {
    nlohmann::json cov;
    for (const auto& [name, v] : j.coverage.metrics()) cov[name] = v;
    for (const auto& [name, v] : counts) cov[name] = v;
    outputs.add(o.json, nlohmann::json{{"case_id", gc.case_id},
                                       {"plan", o.plan},
                                       {"tp", o.tp},
                                       {"dcp", cfg.dcp_size},
                                       {"dcp_interleave", cfg.dcp_interleave},
                                       {"block_offset", options.block_offset},
                                       {"device", gpu::device_summary()},
                                       {"verdict", pass ? "pass" : "fail"},
                                       {"stages_judged", j.stages},
                                       {"topk_rows_judged", j.topk_rows},
                                       {"failures", j.failures},
                                       {"coverage", cov},
                                       {"served", served},
                                       {"kernel_paths", paths},
                                       {"requirements", checked.results}}
                                .dump(2) +
                            "\n");
  }
  if (!o.dump.empty()) {
    gc.generator =
        generator_string("gpu --plan " + o.plan + " --tp " + std::to_string(o.tp) +
                         (o.dcp > 1 ? " --dcp " + std::to_string(o.dcp) + " --dcp-interleave " +
                                          std::to_string(o.dcp_interleave)
                                    : ""));
    gc.expected = got;
    gc.emulated = got;
    golden::stage(outputs, o.dump, gc, {}, /*verify=*/false);
  }
  outputs.commit();
  if (!o.dump.empty())
    fmt::print("  GPU trace written to {} (compare: dsv32 diff {} {})\n", o.dump, o.dump, o.golden);
  return pass ? kExitPass : kExitFail;
#else
  (void)o;
  (void)read;
  (void)resharded;
  fmt::print(stderr, "dsv32 gpu: this build has no CUDA\n");
  return kExitUsage;
#endif
}

}  // namespace

void add_gpu(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GpuOptions>();
  CLI::App* sub =
      app.add_subcommand("gpu", "Run a golden case on the GPU under a plan and judge it");
  sub->add_option("golden", o->golden, "Golden file whose steps and weights to run")
      ->required()
      ->check(kInputFile);
  sub->add_option("--plan", o->plan,
                  "eager, breakable-eager, wide, narrow, narrow-copy, full, full-and-piecewise "
                  "(its piecewise plan by suffix: full-and-piecewise:wide)")
      ->capture_default_str();
  sub->add_option("--tp", o->tp,
                  "Tensor-parallel ranks, one GPU each (each holds num_heads / tp heads)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  sub->add_option("--dcp", o->dcp,
                  "Decode context parallelism of an unsharded golden: its keys over W ranks "
                  "emulated on each GPU (each its share of every top-k row, its partial "
                  "attention, the LSE merge), judged against the unsharded oracle; W divides "
                  "--tp when --tp > 1")
      ->check(int_in(1, kMaxDcpSize))
      ->capture_default_str();
  sub->add_option("--dcp-interleave", o->dcp_interleave,
                  "Positions a rank owns in a row before the next rank's (vLLM's "
                  "cp_kv_cache_interleave_size); divides the golden's block size")
      ->check(int_in(1, kMaxConfigSize))
      ->capture_default_str();
  sub->add_option("--dump", o->dump, "Write the GPU trace as a golden-schema file")
      ->check(kOutputFile);
  sub->add_flag("--far-blocks", o->far_blocks,
                "Place the case's blocks near the top of a pool so large that cache offsets pass "
                "2^31 elements (several GiB of device memory; docs/CASES.md)");
  sub->add_option("--json", o->json, "Also write the verdict and coverage as JSON here")
      ->check(kOutputFile);
  sub->add_option("--require", o->require,
                  "METRIC OP VALUE[%], e.g. pruned>=50% or steps_full>=1: fail unless the run "
                  "exercised it (docs/COVERAGE.md); again for more")
      ->check(requirement_check(served_metrics()));
  sub->callback([o, &exit_code] {
    refuse_output_clash("gpu", {{"--json", o->json}, {"--dump", o->dump}},
                        {{"the golden", o->golden}});
    exit_code = run(*o);
  });
}

}  // namespace dsv32::tools

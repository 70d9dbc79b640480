// `dsv32 gpu GOLDEN.h5 --plan P [--tp N] [--dump OUT.h5]`: runs a golden case's steps on the GPU
// under a plan (with --tp, on N GPUs, each with 1/N of the heads), judges the run against the
// (unsharded) oracle, and optionally writes the GPU's trace as a golden-schema file (in
// `expected` and `emulated`) that `dsv32 diff OUT.h5 GOLDEN.h5` reads.
#include <fmt/core.h>

#include <memory>

#include "commands.hpp"
#include "dsv32/golden/golden.hpp"
#include "report.hpp"
#include "version.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#endif

namespace dsv32::tools {
namespace {

struct Options {
  std::string golden;
  std::string plan = "eager";
  std::string dump;
  int tp = 1;
};

int run(const Options& o) {
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_tp_reason(o.tp); !why.empty()) {
    fmt::print(stderr, "dsv32 gpu: {}\n", why);
    return kExitUsage;
  }
  golden::GoldenCase gc = golden::read(o.golden);
  const boundary::Plan plan = boundary::plan_preset(o.plan, gc.cfg);
  const int T = max_capture_size(gc.steps);
  gpu::TpGroup group(gc.cfg, gc.weights, o.tp, gc.num_blocks, T);
  std::vector<StepTrace> got;
  for (std::size_t s = 0; s < gc.steps.size(); ++s) {
    got.push_back(group.run(plan, gc.steps[s]));
    progress(fmt::format("  {}: step {}/{}", gc.case_id, s + 1, gc.steps.size()),
             s + 1 == gc.steps.size());
  }
  const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks,
                            gc.steps, got, o.tp);
  fmt::print(
      "dsv32 gpu: case {} plan {} tp {} on {}: {} stages and {} top-k rows judged, {} "
      "failures\n",
      gc.case_id, o.plan, o.tp, gpu::device_summary(), j.stages, j.topk_rows, j.failures.size());
  for (const std::string& f : j.failures) fmt::print("  FAIL {}\n", f);
  if (j.failures.empty()) fmt::print("  {}\n", j.worst_text());
  if (!o.dump.empty()) {
    gc.generator = generator_string("gpu --plan " + o.plan + " --tp " + std::to_string(o.tp));
    gc.expected = got;
    gc.emulated = got;
    golden::write(o.dump, gc, {}, /*verify=*/false);
    fmt::print("  GPU trace written to {} (compare: dsv32 diff {} {})\n", o.dump, o.dump, o.golden);
  }
  return j.failures.empty() ? kExitPass : kExitFail;
#else
  (void)o;
  fmt::print(stderr, "dsv32 gpu: this build has no CUDA\n");
  return kExitUsage;
#endif
}

}  // namespace

void add_gpu(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Options>();
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
  sub->add_option("--dump", o->dump, "Write the GPU trace as a golden-schema file")
      ->check(kOutputFile);
  sub->callback([o, &exit_code] {
    refuse_output_over_input("gpu", o->dump, {o->golden});
    exit_code = run(*o);
  });
}

}  // namespace dsv32::tools

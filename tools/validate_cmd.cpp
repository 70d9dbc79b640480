// `dsv32 validate FILE...`: reads each file as the other commands do (the strict, contained
// reader of docs/BAD_INPUT.md) and says whether they would take it. The Python package runs it
// before reading a golden with h5py, so both sides refuse by one set of rules.
#include <fmt/core.h>

#include <memory>

#include "commands.hpp"
#include "dsv32/golden/golden.hpp"

namespace dsv32::tools {
namespace {

struct ValidateOptions {
  std::vector<std::string> files;
  std::string golden;  // set: the files are candidates for this golden
  double max_gib = 16;
};

int run(const ValidateOptions& o) {
  golden::ReadLimits limits;
  limits.max_bytes = o.max_gib * (1ull << 30);
  if (o.golden.empty()) {
    for (const std::string& path : o.files)
      fmt::print("{}: a golden file: {}\n", path, golden::describe(path, limits));
    return kExitPass;
  }
  const golden::GoldenCase gc = golden::read(o.golden, limits);
  for (const std::string& path : o.files) {
    const std::vector<StepTrace> steps = golden::read_candidate(path, gc, limits);
    fmt::print("{}: a candidate file for case {}: {} of its {} steps\n", path, gc.case_id,
               steps.size(), gc.steps.size());
  }
  return kExitPass;
}

}  // namespace

void add_validate(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* sub = app.add_subcommand(
      "validate", "Read files as the other commands do; exit 0 when every one would be taken");
  sub->add_option("files", o->files, "Golden files (candidate files with --golden)")
      ->required()
      ->check(kInputFile);
  sub->add_option("--golden", o->golden, "Read the files as candidates for this golden")
      ->check(kInputFile);
  sub->add_option("--max-gib", o->max_gib, "Refuse files whose tensors need more memory")
      ->check(positive_up_to(1 << 20))
      ->capture_default_str();
  sub->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace dsv32::tools

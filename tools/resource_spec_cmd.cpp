// `dsv32 resource-spec [-o FILE] [--slots-per-gpu N]`: writes the CTest resource specification
// for the GPUs this process sees, so that `ctest -L gpu -j N --resource-spec-file FILE` spreads
// the GPU tests over them (docs/GPU.md). The default FILE is where the GPU tests' resource
// groups are sized from when ctest starts (cmake/Dsv32TestResources.cmake).
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#endif

namespace dsv32::tools {
namespace {

struct ResourceSpecOptions {
  std::string out = DSV32_RESOURCE_SPEC;
  int slots = 8;  // the GPU suite's best on one H100 (docs/DECISIONS.md, "The GPU suite's time")
};

int run(const ResourceSpecOptions& o) {
#if DSV32_HAVE_CUDA
  const int n = gpu::device_count();
#else
  const int n = 0;
#endif
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < n; ++i) gpus.push_back({{"id", std::to_string(i)}, {"slots", o.slots}});
  const nlohmann::json spec = {{"version", {{"major", 1}, {"minor", 0}}},
                               {"local", nlohmann::json::array({{{"gpus", gpus}}})}};
  // Written whole or not at all; a failure names the file and the reason.
  files::write_atomically(o.out, spec.dump(2) + "\n");
  fmt::print("dsv32 resource-spec: {} GPU{} with {} slot{} each -> {}\n", n, n == 1 ? "" : "s",
             o.slots, o.slots == 1 ? "" : "s", o.out);
  if (n == 0)
    fmt::print(stderr,
               "dsv32 resource-spec: no GPU visible: GPU tests cannot be scheduled "
               "with this spec\n");
  return kExitPass;
}

}  // namespace

void add_resource_spec(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ResourceSpecOptions>();
  CLI::App* cmd =
      app.add_subcommand("resource-spec",
                         "Write the CTest resource spec for the visible GPUs (ctest -L gpu -j N "
                         "--resource-spec-file FILE spreads the GPU tests over them)");
  cmd->add_option("-o,--output", o->out, "Where to write it")
      ->check(kOutputFile)
      ->capture_default_str();
  cmd->add_option("--slots-per-gpu", o->slots,
                  "Single-GPU tests that may share one GPU at a time (multi-GPU tests take "
                  "whole GPUs)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace dsv32::tools

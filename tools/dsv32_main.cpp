// dsv32: the suite's command-line entry point (verdicts, goldens, diff, benchmarks).
#include <fmt/core.h>

#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/h5.hpp"
#include "environment.hpp"
#include "version.hpp"

namespace {

/// "unknown command 'X' (commands: ...)" when the first argument is neither an option nor a
/// subcommand ("A subcommand is required" said nothing of the typo); else "".
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::string known;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == argv[1]) return "";
    known += (known.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown command '" + std::string(argv[1]) + "' (commands: " + known + ")";
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything runs: libgomp reads its environment at the first parallel region.
  if (const std::string why = dsv32::tools::omp_environment_problem(); !why.empty()) {
    fmt::print(stderr, "dsv32: bad environment: {}\n", why);
    return dsv32::tools::kExitUsage;
  }
  // Ranks on one GPU (the main job's tensor-parallel rows, `dsv32 gpu --tp`) need CUDA's kernels
  // loaded eagerly (gpu/tp.hpp); set before CUDA starts, unless the caller chose a mode.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  // A temporary file is removed on SIGINT/SIGTERM; a file-size limit is a write error.
  dsv32::files::install_signal_cleanup();
  CLI::App app{"dsv32-oracle: DeepSeek-V3.2 attention oracle and boundary test suite"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsv32 " DSV32_VERSION " (git " DSV32_GIT_REVISION ")");
  int exit_code = dsv32::tools::kExitPass;
  dsv32::tools::add_selfcheck(app, exit_code);
  dsv32::tools::add_golden(app, exit_code);
  dsv32::tools::add_diff(app, exit_code);
  dsv32::tools::add_judge(app, exit_code);
  dsv32::tools::add_validate(app, exit_code);
  dsv32::tools::add_gpu(app, exit_code);
  dsv32::tools::add_bisect(app, exit_code);
  dsv32::tools::add_resource_spec(app, exit_code);
  dsv32::tools::add_bench_oracle(app, exit_code);
  dsv32::tools::add_bench_gpu(app, exit_code);
  if (const std::string why = unknown_command(app, argc, argv); !why.empty()) {
    fmt::print(stderr, "dsv32: {}\n", why);
    return dsv32::tools::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // CLI11 checks required options before it looks at unknown ones: `--gold X` would read as
    // "--golden is required". The unknown option is the user's mistake; name it first.
    for (const CLI::App* sub : app.get_subcommands())
      for (const std::string& arg : sub->remaining())
        if (arg.rfind("--", 0) == 0) {
          fmt::print(stderr, "dsv32 {}: unknown option '{}' (dsv32 {} --help lists them)\n",
                     sub->get_name(), arg, sub->get_name());
          return dsv32::tools::kExitUsage;
        }
    return app.exit(e) == 0 ? 0 : dsv32::tools::kExitUsage;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : dsv32::tools::kExitUsage;
  } catch (const dsv32::files::WriteError& e) {
    fmt::print(stderr, "dsv32: cannot write: {}\n", e.what());
    return dsv32::tools::kExitUsage;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "dsv32: out of memory: the sizes asked for do not fit in this process's memory "
               "(lower them, or see --max-gib where the command has it)\n");
    return dsv32::tools::kExitUsage;
  } catch (const dsv32::h5::GoldenError& e) {
    fmt::print(stderr, "dsv32: bad input file: {}\n", e.what());
    return dsv32::tools::kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsv32: error: {}\n", e.what());
    return dsv32::tools::kExitUsage;
  }
  return exit_code;
}

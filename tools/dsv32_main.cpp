// dsv32: the suite's command-line entry point (verdicts, goldens, diff, benchmarks).
#include <fmt/core.h>

#include <exception>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/h5.hpp"

int main(int argc, char** argv) {
  // A temporary file is removed on SIGINT/SIGTERM; a file-size limit is a write error.
  dsv32::files::install_signal_cleanup();
  CLI::App app{"dsv32-oracle: DeepSeek-V3.2 attention oracle and boundary test suite"};
  app.require_subcommand(1);
  int exit_code = dsv32::tools::kExitPass;
  dsv32::tools::add_selfcheck(app, exit_code);
  dsv32::tools::add_golden(app, exit_code);
  dsv32::tools::add_diff(app, exit_code);
  dsv32::tools::add_judge(app, exit_code);
  dsv32::tools::add_gpu(app, exit_code);
  dsv32::tools::add_bisect(app, exit_code);
  dsv32::tools::add_resource_spec(app, exit_code);
  dsv32::tools::add_bench_oracle(app, exit_code);
  dsv32::tools::add_bench_gpu(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : dsv32::tools::kExitUsage;
  } catch (const dsv32::files::WriteError& e) {
    fmt::print(stderr, "dsv32: cannot write: {}\n", e.what());
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

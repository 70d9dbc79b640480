// Subcommands of the dsv32 tool; each registers its options on a CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace dsv32::tools {

/// Exit codes: 0 all checks passed, 1 a check failed, 2 bad usage or bad input.
inline constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2;

void add_selfcheck(CLI::App& app, int& exit_code);
void add_bench_oracle(CLI::App& app, int& exit_code);
void add_golden(CLI::App& app, int& exit_code);
void add_diff(CLI::App& app, int& exit_code);
void add_gpu(CLI::App& app, int& exit_code);
void add_bench_gpu(CLI::App& app, int& exit_code);
void add_bisect(CLI::App& app, int& exit_code);
void add_resource_spec(CLI::App& app, int& exit_code);
void add_judge(CLI::App& app, int& exit_code);

}  // namespace dsv32::tools

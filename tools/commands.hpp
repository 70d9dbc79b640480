// Subcommands of the dsv32 tool; each registers its options on a CLI11 app.
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/coverage.hpp"
#include "outputs.hpp"

namespace dsv32::tools {

/// Exit codes: 0 all checks passed, 1 a check failed, 2 bad usage or bad input.
inline constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2;

/// An input file: an existing regular file (a FIFO would block, a directory is not a file).
inline const CLI::Validator kInputFile(
    [](std::string& path) {
      const std::string why = files::not_regular_file_reason(path);
      return why.empty() ? std::string() : path + ": " + why;
    },
    "FILE");
/// An output file: its directory exists and is writable, and it is not a directory; checked
/// before the work starts, so a long job cannot end in an output it could never write.
inline const CLI::Validator kOutputFile(
    [](std::string& path) {
      if (path.empty()) return std::string("an empty path names no file");
      try {
        files::require_writable_location(path);
      } catch (const files::WriteError& e) {
        return std::string(e.what());
      }
      return std::string();
    },
    "FILE");

/// A case of the registry (golden::find_case), checked when the command line is parsed: an
/// unknown name is refused, listing the known ones, before any work.
inline const CLI::Validator kRegistryCase(
    [](std::string& name) {
      try {
        golden::find_case(name);
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
      return std::string();
    },
    "CASE");

/// A coverage requirement (`pruned>=50%`, docs/COVERAGE.md) over Coverage's metrics and the
/// counts `more` a command adds, checked when the command line is parsed: a malformed one is
/// refused naming the part that is wrong.
inline CLI::Validator requirement_check(std::vector<std::string> more = {}) {
  return CLI::Validator(
      [more](std::string& text) {
        try {
          Requirement::parse(text, more);
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
        return std::string();
      },
      "REQUIREMENT");
}
inline const CLI::Validator kRequirement = requirement_check();

/// An integer option in [lo, hi]: "'two' is not an integer", "0 is outside [1, 1000]".
inline CLI::Validator int_in(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "'" + text + "' is not an integer";
        if (v < lo || v > hi)
          return text + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return std::string();
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
/// A real option in (0, hi]: "'x' is not a number", "0 must be > 0 and <= ...".
inline CLI::Validator positive_up_to(double hi) {
  return CLI::Validator(
      [hi](std::string& text) {
        std::size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "'" + text + "' is not a number";
        if (!(v > 0 && v <= hi)) return text + " must be > 0 and <= " + std::to_string(hi);
        return std::string();
      },
      "NUMBER in (0, " + std::to_string(hi) + "]");
}

/// Refuses (before any work) outputs that collide: two on one path, or one that is an input
/// (output_clash). Writing them would lose an output or destroy what the command reads.
inline void refuse_output_clash(const std::string& command, const std::vector<NamedPath>& outputs,
                                const std::vector<NamedPath>& inputs) {
  if (const std::string why = output_clash(outputs, inputs); !why.empty())
    throw CLI::ValidationError(command, why);
}

/// Refuses, before any work, a product of in-range sizes that needs more than `max_gib` GiB
/// (each flag is bounded alone; their product is not): `what` names the flags and their values.
inline void refuse_over(const std::string& command, const std::string& what, double bytes,
                        double max_gib, const std::string& raise_with) {
  if (bytes <= max_gib * double(1ull << 30)) return;
  throw CLI::ValidationError(
      command, what + " needs about " +
                   std::to_string(static_cast<long long>(bytes / (1ull << 30))) + " GiB, over " +
                   std::to_string(static_cast<long long>(max_gib)) + " GiB" + raise_with);
}

void add_selfcheck(CLI::App& app, int& exit_code);
void add_bench_oracle(CLI::App& app, int& exit_code);
void add_golden(CLI::App& app, int& exit_code);
void add_diff(CLI::App& app, int& exit_code);
void add_gpu(CLI::App& app, int& exit_code);
void add_bench_gpu(CLI::App& app, int& exit_code);
void add_bisect(CLI::App& app, int& exit_code);
void add_resource_spec(CLI::App& app, int& exit_code);
void add_judge(CLI::App& app, int& exit_code);
void add_validate(CLI::App& app, int& exit_code);

}  // namespace dsv32::tools

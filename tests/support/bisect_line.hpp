// The bisect line a failing GPU test prints (issue 53): the build's own dsv32 tool bisecting the
// golden the test ran, under the plan that failed. `BisectLines.APrintedLineRunsAsPrinted` runs
// one as printed. Needs DSV32_TOOL_PATH (the tool's path, a compile definition).
#pragma once

#include <string>

namespace dsv32::testing {

/// `s` quoted for a POSIX shell.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The command that bisects `golden` (a golden file's path) under `plan`.
inline std::string bisect_line(const std::string& golden, const std::string& plan) {
  return shell_quoted(DSV32_TOOL_PATH) + " bisect " + shell_quoted(golden) + " --plan " + plan;
}

}  // namespace dsv32::testing

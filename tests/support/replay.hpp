// Test names a shell can type, and the one replay line a failure prints (docs/GPU.md, "Test
// names and replay lines"). Every test binary's main prints the line of each of its tests with
// --dsv32_replay_lines, and `Tests.EveryReplayLineRunsExactlyItsTest` checks each against ctest.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace dsv32::testing {

/// A case or plan name as a test name spells it: every character outside [A-Za-z0-9_] becomes
/// '_' ("kv-fp8" -> "kv_fp8", "full-and-piecewise" -> "full_and_piecewise").
inline std::string gtest_safe(std::string_view name) {
  std::string out(name);
  for (char& c : out)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      c = '_';
  return out;
}

/// The test's name as ctest lists it ("Prefix/Suite.Test/param"; gtest_discover_tests runs
/// with NO_PRETTY_VALUES, so no "# GetParam() = ..." tail under any CMake).
inline std::string ctest_name(const ::testing::TestInfo& info) {
  return std::string(info.test_suite_name()) + "." + info.name();
}

/// A regular expression that matches `name` whole and nothing else (CTest's -R searches).
inline std::string exact_regex(std::string_view name) {
  std::string out = "^";
  for (char c : name) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out + "$";
}

/// The command that runs exactly the test `name` again, with its output.
inline std::string replay_line(std::string_view name) {
  return "ctest -R '" + exact_regex(name) + "' --output-on-failure";
}

/// The replay line of the running test.
inline std::string replay_line() {
  return replay_line(ctest_name(*::testing::UnitTest::GetInstance()->current_test_info()));
}

}  // namespace dsv32::testing

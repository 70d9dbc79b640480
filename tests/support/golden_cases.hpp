// The committed golden cases as test parameters, shared by the GPU and golden test suites.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"
#include "support/replay.hpp"

namespace dsv32::testing {

/// Path of a committed fixture.
inline std::string fixture(const std::string& name) {
  return std::string(DSV32_FIXTURES_DIR) + "/" + name + ".h5";
}

/// The largest capture size of a case's steps.
inline int max_capture(const golden::GoldenCase& c) {
  return max_capture_size(c.steps);
}

/// Names of the committed registry cases.
inline std::vector<std::string> committed_cases() {
  std::vector<std::string> names;
  for (const golden::CaseSpec& c : golden::registry())
    if (c.committed) names.push_back(c.name);
  return names;
}

/// gtest-safe parameter name of a case ("ctx-around-k" -> "ctx_around_k").
inline std::string case_test_name(const ::testing::TestParamInfo<std::string>& p) {
  return gtest_safe(p.param);
}

}  // namespace dsv32::testing

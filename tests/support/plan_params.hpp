// The plan as a test parameter: the last element of a test's name, so that `ctest -R '/narrow$'`
// runs one plan (`/full_and_piecewise$`: names are gtest-safe).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsv32/boundary/plan.hpp"
#include "support/replay.hpp"

namespace dsv32::testing {

/// The plans a test compares with `eager`: every preset, `eager` itself too (a second eager run
/// on a stack of its own must give the same bits).
inline std::vector<std::string> compared_plans() {
  return boundary::plan_names();
}

/// The plans that capture: every preset but `eager` (the properties' parameters).
inline std::vector<std::string> capturing_plans() {
  std::vector<std::string> plans;
  for (const std::string& p : boundary::plan_names())
    if (p != "eager") plans.push_back(p);
  return plans;
}

/// A plan parameter's name element ("full-and-piecewise" -> "full_and_piecewise").
inline std::string plan_test_name(const ::testing::TestParamInfo<std::string>& p) {
  return gtest_safe(p.param);
}

}  // namespace dsv32::testing

// Boundary plans under real capture and replay (BOUNDARIES.md sections 2-3): segment structure,
// capture runs no graph op, and every plan bitwise equal to `eager` over changing steps.
#include <gtest/gtest.h>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/judge.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/oracle/compare.hpp"
#include "support/golden_cases.hpp"
#include "support/gpu.hpp"

namespace dsv32 {
namespace {

using testing::case_test_name;
using testing::committed_cases;
using testing::fixture;
using testing::max_capture;

TEST(PlanPresets, ValidatorRejectsCapturingHostOps) {
  const Config cfg = preset("tiny-fs");
  for (const std::string& name : gpu::plan_names())
    EXPECT_NO_THROW(gpu::validate(gpu::plan_preset(name, cfg), cfg));
  gpu::Plan p = gpu::plan_preset("narrow", cfg);
  p.placement[1]["sparse_mqa"] = gpu::Placement::graph;
  try {
    gpu::validate(p, cfg);
    FAIL() << "a captured sparse_mqa was accepted";
  } catch (const gpu::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1: op 'sparse_mqa'"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(gpu::validate(p, cfg, /*allow_host_capture=*/true));
  EXPECT_THROW(gpu::plan_preset("full", cfg), gpu::PlanError);
  EXPECT_EQ(gpu::plan_preset("narrow", cfg).ops(cfg, 1).size(), 10u);  // S layer: no indexer ops
  EXPECT_EQ(gpu::plan_preset("narrow-copy", cfg).ops(cfg, 0).back(), "residual_add");
}

TEST(GpuPlans, SegmentStructureMatchesEachPlan) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));  // FSF: 3 layers
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 16);
  const auto info = [&](const char* plan) {
    return stack.capture(gpu::plan_preset(plan, gc.cfg), 8);
  };
  EXPECT_EQ(info("narrow").structure, "GEGEGEG");
  EXPECT_EQ(info("narrow").eager_breaks, 3);
  EXPECT_EQ(info("narrow-copy").structure, "GEGEGEG");
  EXPECT_EQ(info("wide").structure, "GEGEGEG");
  EXPECT_EQ(info("breakable-eager").structure, "E");
  EXPECT_EQ(info("breakable-eager").graphs, 0);
}

TEST(GpuPlans, CaptureRunsNoGraphOp) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 16);
  for (const char* plan : {"narrow", "wide", "narrow-copy"}) {
    stack.capture(gpu::plan_preset(plan, gc.cfg), 8);
    // The capture left ones in the residual stream; residual_add or any G op would change them.
    for (double v : stack.residual(8)) ASSERT_EQ(v, 1.0) << plan;
  }
}

/// Runs every step of a case under each plan on its own stack; all must equal `eager` bitwise.
void expect_plans_bitwise_equal(const golden::GoldenCase& gc) {
  gpu::Stack eager(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
  std::vector<StepTrace> base;
  for (const StepInput& in : gc.steps) base.push_back(eager.step(in));
  for (const std::string& name : gpu::plan_names()) {
    if (name == "eager") continue;
    const gpu::Plan plan = gpu::plan_preset(name, gc.cfg);
    gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
    std::vector<StepTrace> got;
    for (const StepInput& in : gc.steps) got.push_back(stack.run(plan, in));
    EXPECT_EQ(gpu::first_difference(gc.cfg, base, got), "") << gc.case_id << " plan " << name;
  }
}

class GpuPlanFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuPlanFixtures, EveryPlanIsBitwiseEqualToEager) {
  DSV32_REQUIRE_GPU();
  expect_plans_bitwise_equal(golden::read(fixture(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuPlanFixtures, ::testing::ValuesIn(committed_cases()),
                         case_test_name);

TEST(GpuPlans, ReplayAfterShortContextCaptureHandlesContextsBeyondKAndChangingRequests) {
  DSV32_REQUIRE_GPU();
  // One capture size (8) throughout: captured while contexts are short, replayed as they grow
  // past K, with T_a changing under the same T and requests joining and finishing.
  golden::CaseSpec spec = golden::find_case("default");
  spec.steps = {{{{0, 2}, {1, 3}}, 8, {}},
                {{{0, 1}, {1, 1}, {2, 6}}, 8, {1}},
                {{{0, 1}, {2, 1}, {3, 1}}, 8, {}},
                {{{0, 7}, {2, 1}}, 8, {}},
                {{{0, 1}}, 8, {}}};
  expect_plans_bitwise_equal(golden::generate(spec, "test"));
}

}  // namespace
}  // namespace dsv32

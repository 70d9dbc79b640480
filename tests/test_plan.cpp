// Plans and capture sizes as data (BOUNDARIES.md sections 2-3): the CPU-only part of the
// capture machinery. Built with the GPU library, runs without a GPU.
#include <gtest/gtest.h>

#include "dsv32/gpu/plan.hpp"

namespace dsv32 {
namespace {

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

TEST(CaptureSizes, FollowTheVllmList) {
  const std::vector<int> s = gpu::capture_sizes(512);
  EXPECT_EQ(std::vector<int>(s.begin(), s.begin() + 5), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(s.back(), 512);
  for (std::size_t i = 1; i < s.size(); ++i) {
    ASSERT_LT(s[i - 1], s[i]);
    const int step = s[i] <= 8 ? s[i] - s[i - 1] : s[i] <= 256 ? 8 : 16;
    EXPECT_EQ(s[i] - s[i - 1], step) << "at " << s[i];
  }
  EXPECT_EQ(gpu::capture_sizes(1), std::vector<int>{1});
  EXPECT_EQ(gpu::capture_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_THROW(gpu::capture_sizes(0), std::invalid_argument);
}

TEST(CaptureSizes, AStepPadsToTheSmallestSizeThatHoldsIt) {
  const std::vector<int> s = gpu::capture_sizes(512);
  for (int ta = 1; ta <= 520; ++ta) {
    const int T = gpu::capture_size_for(s, ta);
    if (ta > 512) {
      EXPECT_EQ(T, 0) << "T_a " << ta << " above the largest size runs without a graph";
      continue;
    }
    ASSERT_GE(T, ta);
    for (int size : s)
      if (size >= ta) {
        EXPECT_EQ(T, size) << "T_a " << ta;
        break;
      }
  }
  EXPECT_EQ(gpu::capture_size_for(s, 3), 4);
  EXPECT_EQ(gpu::capture_size_for(s, 257), 272);
  EXPECT_THROW(gpu::capture_size_for(s, 0), std::invalid_argument);
}

}  // namespace
}  // namespace dsv32

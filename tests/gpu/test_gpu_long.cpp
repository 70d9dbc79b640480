// Long contexts at DeepSeek-V3.2's sizes on the GPU (docs/CASES.md, "Long contexts"): 128
// heads, 64 indexer heads, Lkv 512 in fp8_ds_mla, K 2048, contexts of 65536 to 163840 keys
// given as prefixes. Each case is generated here (the oracle computes only its measured steps),
// its eager run judged against the oracle and every plan held to eager's bits; the mixed case
// again with its blocks where every cache offset passes 2^31 elements; the decode again over 2, 4
// and 8 DCP ranks.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"

namespace dsv32 {
namespace {

class GpuLong : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuLong, EveryPlanGivesEagerBitsAndEagerPassesTheOracle) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::generate(golden::find_case(GetParam()), "test");
  ASSERT_FALSE(gc.steps.front().given.empty()) << "the case starts from a given prefix";
  const auto w = std::make_shared<const Weights>(gc.weights);
  EXPECT_EQ(testing::check_plans(gc.cfg, w, gc.num_blocks, gc.steps, boundary::plan_names()), "");
  if (GetParam() != "long-mixed") return;
  // The mixed case again on far blocks (made once: generating it is this test's cost): every
  // cache offset past 2^31 elements, the near run's bits.
  gpu::StackOptions far;
  far.block_offset = gpu::far_block_offset(gc.cfg);
  ASSERT_GE(far.block_offset * gc.cfg.block_size * (gc.cfg.kv_lora_rank + gc.cfg.qk_rope_head_dim),
            1LL << 31)
      << "the latent and rope row of the first far slot";
  const std::vector<StepTrace> near =
      testing::run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
  for (const char* plan : {"eager", "narrow", "full-and-piecewise"}) {
    const std::vector<StepTrace> got =
        gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps,
                       boundary::plan_preset(plan, gc.cfg), "", nullptr, far);
    EXPECT_EQ(first_difference(gc.cfg, near, got), "") << plan << " on far blocks";
  }
}

// The 131072-key decode under decode context parallelism (MATH.md, "Context-parallel shards"),
// made once and run at W = 2, 4 and 8 (vLLM's interleave 1, its keys a quarter, an eighth ... a
// rank): eager under DCP passes the unsharded oracle, and the plans that capture the ranks'
// launches give its bits.
TEST(GpuLongDcp, TheLongDecodeOverTwoFourAndEightRanks) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::generate(golden::find_case("long-decode"), "test");
  const auto w = std::make_shared<const Weights>(gc.weights);
  for (const int ranks : {2, 4, 8}) {
    Config cfg = gc.cfg;
    cfg.dcp_size = ranks;
    const std::vector<StepTrace> eager =
        testing::run_plan(cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
    const Judgement j = judge(gc.cfg, w, gc.num_blocks, gc.steps, eager);
    EXPECT_GT(j.stages, 0);
    EXPECT_TRUE(j.failures.empty()) << "dcp " << ranks << ": " << j.failures.front();
    for (const char* plan : {"narrow", "full-and-piecewise"})
      EXPECT_EQ(first_difference(cfg, eager,
                                 testing::run_plan(cfg, gc.weights, gc.num_blocks, gc.steps, plan)),
                "")
          << "dcp " << ranks << ", " << plan;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuLong, ::testing::Values("long-decode", "long-mixed", "long-max"),
                         [](const auto& param) {
                           std::string n = param.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace dsv32

// Tensor parallelism on GPUs (MATH.md section 3): `tp` ranks on `tp` devices, each with its
// heads and the replicated indexer, o_proj's partial sums gathered over NCCL. Every plan gives
// the bits of the group's `eager` run, and `eager` passes the unsharded oracle's gates. Test
// names end in tp<N>: ctest gives them N GPUs (cmake/Dsv32TestResources.cmake); with fewer
// visible they skip, saying so.
#include <gtest/gtest.h>

#include <algorithm>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/golden_cases.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"

namespace dsv32 {
namespace {

using testing::check_plans;
using testing::fixture;

#define DSV32_REQUIRE_TP(tp)                                                                 \
  do {                                                                                       \
    DSV32_REQUIRE_GPU();                                                                     \
    if (const std::string why_ = gpu::no_tp_reason(tp); !why_.empty()) GTEST_SKIP() << why_; \
  } while (0)

TEST(GpuTp, OneRankGivesTheBitsOfAPlainStack) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  for (const char* plan : {"eager", "narrow"}) {
    const boundary::Plan p = boundary::plan_preset(plan, gc.cfg);
    const auto plain = gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps, p);
    const auto one = gpu::run_steps_tp(gc.cfg, gc.weights, 1, gc.num_blocks, gc.steps, p);
    EXPECT_EQ(first_difference(gc.cfg, plain, one), "") << plan;
  }
}

/// (committed case, tp) pairs whose head count divides by tp.
struct TpCase {
  std::string name;
  int tp;
};

void PrintTo(const TpCase& c, std::ostream* os) {
  *os << "{" << c.name << ", " << c.tp << "}";
}

std::vector<TpCase> tp_cases() {
  std::vector<TpCase> out;
  for (int tp : {2, 4})
    for (const golden::CaseSpec& c : golden::registry())
      if (c.committed && c.cfg.num_heads % tp == 0) out.push_back({c.name, tp});
  return out;
}

std::string tp_case_name(const ::testing::TestParamInfo<TpCase>& p) {
  std::string n = p.param.name + "_tp" + std::to_string(p.param.tp);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class GpuTpFixtures : public ::testing::TestWithParam<TpCase> {};

TEST_P(GpuTpFixtures, EveryPlanGivesEagerBitsAndEagerMatchesTheUnshardedOracle) {
  const auto [name, tp] = GetParam();
  DSV32_REQUIRE_TP(tp);
  const golden::GoldenCase gc = golden::read(fixture(name));
  const auto w = std::make_shared<const Weights>(gc.weights);
  EXPECT_EQ(check_plans(gc.cfg, w, gc.num_blocks, gc.steps, boundary::plan_names(), nullptr, tp),
            "");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuTpFixtures, ::testing::ValuesIn(tp_cases()), tp_case_name);

class GpuTpFull : public ::testing::TestWithParam<int> {};

TEST_P(GpuTpFull, Dsv32SizesEveryPlan) {
  const int tp = GetParam();
  DSV32_REQUIRE_TP(tp);
  const golden::CaseSpec spec = golden::find_case("dsv32-full");  // H = 128, one F layer
  const golden::GoldenCase gc = golden::generate(spec, "test");
  const auto w = std::make_shared<const Weights>(gc.weights);
  EXPECT_EQ(
      check_plans(gc.cfg, w, gc.num_blocks, gc.steps, {"eager", "narrow", "wide"}, nullptr, tp),
      "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, GpuTpFull, ::testing::Values(2, 4),
                         [](const auto& p) { return "tp" + std::to_string(p.param); });

class GpuTpRanks : public ::testing::TestWithParam<int> {};

// The judge can fail a group: the ranks' traces merged in the wrong order put heads in the
// wrong places, and the unsharded oracle says so; in the right order it passes.
TEST_P(GpuTpRanks, RanksMergedOutOfOrderFailTheOracle) {
  const int tp = GetParam();
  DSV32_REQUIRE_TP(tp);
  const golden::GoldenCase gc = golden::read(fixture("default"));
  ASSERT_EQ(gc.cfg.num_heads % tp, 0);
  gpu::TpGroup group(gc.cfg, gc.weights, tp, gc.num_blocks, testing::max_capture(gc));
  const boundary::Plan eager = boundary::plan_preset("eager", gc.cfg);
  std::vector<StepTrace> merged, swapped;
  for (const StepInput& in : gc.steps) {
    merged.push_back(group.run(eager, in));
    std::vector<StepTrace> ranks = group.rank_traces();
    ASSERT_EQ(static_cast<int>(ranks.size()), tp);
    for (const StepTrace& r : ranks)  // each rank holds its share of the heads
      ASSERT_EQ(r.layers[0].at("o").shape[1], merged.back().layers[0].at("o").shape[1] / tp);
    std::reverse(ranks.begin(), ranks.end());
    swapped.push_back(gpu::merge_rank_traces(gc.cfg, ranks));
  }
  const auto w = std::make_shared<const Weights>(gc.weights);
  EXPECT_TRUE(judge(gc.cfg, w, gc.num_blocks, gc.steps, merged, tp).failures.empty());
  const Judgement bad = judge(gc.cfg, w, gc.num_blocks, gc.steps, swapped, tp);
  ASSERT_FALSE(bad.failures.empty());
  EXPECT_EQ(bad.first_layer, 0);
  EXPECT_TRUE(is_head_split_stage(bad.first_stage)) << bad.failures.front();
}

INSTANTIATE_TEST_SUITE_P(Sizes, GpuTpRanks, ::testing::Values(2, 4),
                         [](const auto& p) { return "tp" + std::to_string(p.param); });

class GpuTpFailure : public ::testing::TestWithParam<int> {};

// A rank that fails while the others wait for it in o_proj's all-gather must not hang the
// group: the communicators are aborted, the step throws naming the rank, the group refuses
// further calls, and a new group on the same GPUs computes the same bits as before.
TEST_P(GpuTpFailure, ARankThatFailsAbortsTheGroupInsteadOfHanging) {
  const int tp = GetParam();
  DSV32_REQUIRE_TP(tp);
  const golden::GoldenCase gc = golden::read(fixture("default"));
  const boundary::Plan eager = boundary::plan_preset("eager", gc.cfg);
  const std::vector<StepInput> first{gc.steps.front()};
  std::vector<StepTrace> before;
  {
    gpu::TpGroup group(gc.cfg, gc.weights, tp, gc.num_blocks, testing::max_capture(gc));
    before.push_back(group.run(eager, first.front()));
    group.inject_rank_failure(tp - 1);
    std::string error;
    try {
      group.run(eager, first.front());
    } catch (const gpu::TpError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("rank " + std::to_string(tp - 1) + ": injected failure"),
              std::string::npos)
        << "the step's error: '" << error << "'";
    EXPECT_THROW(group.run(eager, first.front()), gpu::TpError) << "a broken group must refuse";
  }
  const std::vector<StepTrace> after =
      gpu::run_steps_tp(gc.cfg, gc.weights, tp, gc.num_blocks, first, eager);
  EXPECT_EQ(first_difference(gc.cfg, before, after), "");
}

INSTANTIATE_TEST_SUITE_P(Sizes, GpuTpFailure, ::testing::Values(2, 4),
                         [](const auto& p) { return "tp" + std::to_string(p.param); });

}  // namespace
}  // namespace dsv32

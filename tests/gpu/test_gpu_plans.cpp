// Boundary plans under real capture and replay (BOUNDARIES.md sections 2-3): segment structure,
// capture runs no graph op, and every plan bitwise equal to `eager` over changing steps. A test
// over plans takes the plan as its name's last element: `ctest -R '/narrow$'` runs one plan.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/plan_check.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/stack_lab.hpp"
#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/compare.hpp"
#include "support/bisect_line.hpp"
#include "support/golden_cases.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"
#include "support/plan_params.hpp"
#include "support/replay.hpp"

namespace dsv32 {
namespace {

using testing::bisect_line;
using testing::check_plans;
using testing::committed_cases;
using testing::compared_plans;
using testing::fixture;
using testing::gtest_safe;
using testing::max_capture;
using testing::plan_test_name;
using testing::replay_line;
using testing::run_plan;

TEST(GpuPlans, SegmentStructureMatchesEachPlan) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));  // FSF: 3 layers
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 16);
  const auto info = [&](const char* plan) {
    return stack.capture(boundary::plan_preset(plan, gc.cfg), 8);
  };
  EXPECT_EQ(info("narrow").structure, "GEGEGEG");
  EXPECT_EQ(info("narrow").eager_breaks, 3);
  EXPECT_EQ(info("narrow-copy").structure, "GEGEGEG");
  EXPECT_EQ(info("wide").structure, "GEGEGEG");
  EXPECT_EQ(info("breakable-eager").structure, "E");
  EXPECT_EQ(info("breakable-eager").graphs, 0);
  EXPECT_EQ(info("full").structure, "G");  // one graph, no eager break
  EXPECT_EQ(info("full").eager_breaks, 0);
  EXPECT_EQ(info("full-and-piecewise").structure, "G");  // its own; narrow's alongside
}

TEST(GpuPlans, CaptureRunsNoGraphOp) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 16);
  for (const char* plan : {"narrow", "wide", "narrow-copy", "full", "full-and-piecewise"}) {
    stack.capture(boundary::plan_preset(plan, gc.cfg), 8);
    // The capture left ones in the residual stream; residual_add or any G op would change them.
    for (double v : stack.lab().residual(8)) ASSERT_EQ(v, 1.0) << plan;
  }
}

TEST(GpuPlans, OneStackKeepsTwoPlansOfOneCaptureSizeApart) {
  DSV32_REQUIRE_GPU();
  // Independent prefill steps (new requests each, so no step reads another's cache) at one
  // capture size, run on one stack alternating a correct plan with a wrong one of the same
  // name: `narrow` with sparse_mqa captured (its metadata baked at capture). The correct plan
  // must give eager's bits every time and the wrong one must not: a stack that keyed its
  // captures by size, or by name, would replay one plan's graph for the other.
  const golden::GoldenCase gc = golden::read(fixture("default"));
  ScenarioBuilder b(gc.cfg, 5, gc.num_blocks);
  std::vector<StepInput> steps;
  for (int i = 0; i < 6; ++i) steps.push_back(b.step({{2 * i, 3}, {2 * i + 1, 2}}, 8));
  const std::vector<StepTrace> eager = run_plan(gc.cfg, gc.weights, gc.num_blocks, steps, "eager");
  const boundary::Plan good = boundary::plan_preset("narrow", gc.cfg);
  boundary::Plan bad = boundary::mutate_plan(good, "capture-host-op");
  bad.name = good.name;
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 8);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const bool use_bad = s % 2 == 1;
    const StepTrace t = stack.run(use_bad ? bad : good, steps[s]);
    const CompareResult r = compare_abs(t.output, eager[s].output, 0.0);
    if (use_bad)
      EXPECT_FALSE(r.pass) << "step " << s << ": the wrong plan gave eager's bits (it replayed "
                           << "the correct plan's graph)";
    else
      EXPECT_TRUE(r.pass) << "step " << s << ": " << r.summary();
  }
  EXPECT_EQ(stack.report().captures, 2);
}

TEST(GpuPlans, OneStackKeepsTheFullAndThePiecewiseGraphOfOneSizeApart) {
  DSV32_REQUIRE_GPU();
  // full-and-piecewise on one stack: uniform decode and mixed steps alternate at one capture size,
  // contexts growing past K and requests joining and finishing. Each step must give eager's
  // bits; a stack that keyed its graphs by size alone would replay the first step's kind of
  // graph for the other (the full graph's decode kernels are wrong for a mixed batch, and the
  // piecewise graph was captured for other steps), and one that captured the full graph only
  // would run mixed steps eagerly: it must hold two graphs.
  const golden::GoldenCase gc = golden::read(fixture("default"));
  ScenarioBuilder b(gc.cfg, 7, gc.num_blocks);
  std::vector<StepInput> steps;
  steps.push_back(b.step({{0, 1}, {1, 1}}, 8));          // uniform decode: the full graph
  steps.push_back(b.step({{0, 1}, {1, 1}, {2, 4}}, 8));  // mixed: narrow's graph
  steps.push_back(b.step({{0, 1}, {1, 1}, {2, 1}}, 8));  // uniform decode
  steps.push_back(b.step({{0, 6}, {2, 1}}, 8));          // mixed: contexts past K
  steps.push_back(b.step({{0, 1}, {1, 1}, {2, 1}}, 8));  // uniform decode, past K
  b.finish(1);
  steps.push_back(b.step({{3, 3}, {0, 1}}, 8));          // a request joins
  steps.push_back(b.step({{0, 1}, {2, 1}, {3, 1}}, 8));  // uniform decode
  const std::vector<StepTrace> eager = run_plan(gc.cfg, gc.weights, gc.num_blocks, steps, "eager");
  const boundary::Plan fp = boundary::plan_preset("full-and-piecewise", gc.cfg);
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 8);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const CompareResult r = compare_abs(stack.run(fp, steps[s]).output, eager[s].output, 0.0);
    EXPECT_TRUE(r.pass) << "step " << s
                        << (boundary::uniform_decode(steps[s]) ? " (uniform decode)" : " (mixed)")
                        << ": " << r.summary();
  }
  EXPECT_EQ(stack.report().captures, 2);
}

/// Runs every step of a case under `eager` and under `plan`, each on its own stack: equal bits.
/// A failure names the test's replay line and, where the case is a golden file (`path`), the
/// bisect command for it.
void expect_plan_bitwise_equal(const golden::GoldenCase& gc, const std::string& plan,
                               const std::string& path = "") {
  const std::vector<StepTrace> base =
      run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
  for (const gpu::PlanCheck& c :
       gpu::check_plans_bitwise(gc.cfg, gc.weights, gc.num_blocks, gc.steps, {plan}, base))
    EXPECT_EQ(c.difference, "") << gc.case_id << " plan " << c.plan << " (replay: " << replay_line()
                                << (path.empty() ? "" : "; to bisect: " + bisect_line(path, plan))
                                << ")";
}

/// A committed golden under one plan: "GpuPlanFixtures.EqualsEagerBitwise/<case>/<plan>",
/// registered for every committed case and compared plan.
class GpuPlanFixture : public ::testing::Test {
 public:
  GpuPlanFixture(std::string name, std::string plan)
      : name_(std::move(name)), plan_(std::move(plan)) {}
  void TestBody() override {
    DSV32_REQUIRE_GPU();
    expect_plan_bitwise_equal(golden::read(fixture(name_)), plan_, fixture(name_));
  }

 private:
  std::string name_, plan_;
};

[[maybe_unused]] const bool kFixturePlansRegistered = [] {
  for (const std::string& name : committed_cases())
    for (const std::string& plan : compared_plans())
      ::testing::RegisterTest(
          "GpuPlanFixtures",
          ("EqualsEagerBitwise/" + gtest_safe(name) + "/" + gtest_safe(plan)).c_str(), nullptr,
          nullptr, __FILE__, __LINE__,
          [=]() -> ::testing::Test* { return new GpuPlanFixture(name, plan); });
  return true;
}();

// The bisect line a failing fixture test prints runs as printed: with a GPU, bisect answers
// `none` on a committed golden; without one, the tool refuses for want of a GPU, not for the
// line (a flag or path it could not parse).
TEST(BisectLines, APrintedLineRunsAsPrinted) {
  const std::string line = bisect_line(fixture("default"), "narrow");
  FILE* p = popen((line + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr) << line;
  std::string out;
  char buf[4096];
  while (const std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << line << "\n" << out;
  if (gpu::no_device_reason().empty()) {
    EXPECT_EQ(WEXITSTATUS(status), 0) << line << "\n" << out;
    EXPECT_NE(out.find("no divergence"), std::string::npos) << line << "\n" << out;
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 2) << line << "\n" << out;
    EXPECT_NE(out.find("dsv32 bisect: "), std::string::npos) << line << "\n" << out;
    EXPECT_EQ(out.find("--help"), std::string::npos) << "the line did not parse: " << line << "\n"
                                                     << out;
  }
}

TEST(GpuPlans, TopkUnderLargeTieGroupsIsValidAndTheSameAtEveryReplay) {
  // topk-stress: tie groups of hundreds of keys at the K-th place and crowded bins; the sets
  // are judged valid, every run of the graphs gives the same bits (no atomic order leaks), and
  // the device counted the crowded bins' fallback, each real row of each F layer once.
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("topk-stress"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture_size(gc.steps));
  const boundary::Plan narrow = boundary::plan_preset("narrow", gc.cfg);
  std::vector<StepTrace> first;
  for (const StepInput& in : gc.steps) first.push_back(stack.run(narrow, in));
  const Judgement j =
      judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, first);
  EXPECT_TRUE(j.failures.empty()) << j.failures.front();
  EXPECT_GE(j.coverage.largest_tie, 300);
  const std::map<std::string, long> paths = stack.report().kernel_paths;
  ASSERT_TRUE(paths.count(gpu::kTopkCrowdedBinPath));
  EXPECT_GT(paths.at(gpu::kTopkCrowdedBinPath), 0);
  long rows = 0, want = 0;
  for (const char* path : gpu::kTopkRowPathNames) rows += paths.count(path) ? paths.at(path) : 0;
  const long full_layers =
      std::count(gc.cfg.index_topk_pattern.begin(), gc.cfg.index_topk_pattern.end(), 'F');
  for (const StepInput& in : gc.steps) want += full_layers * in.num_tokens;
  EXPECT_EQ(rows, want);
  for (int again = 0; again < 3; ++again)
    EXPECT_EQ(first_difference(gc.cfg, first,
                               run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "narrow")),
              "")
        << "replay " << again;
}

TEST(GpuPlans, RowsPastTheRegisterBinsUnderEagerAndTheDispatchMode) {
  // topk-long (generated here, about a second: its 16396 positions are a given prefix): K =
  // 2048, a chunk crossing 16384 keys and decodes at 16400+ keys over tie groups of thousands,
  // the last two in full graphs; the select's general path and the device-driven scores' capped
  // grid run, and the dispatch mode gives eager's bits.
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::generate(golden::find_case("topk-long"), "test");
  const std::vector<StepTrace> eager =
      run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
  const Judgement j =
      judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, eager);
  EXPECT_TRUE(j.failures.empty()) << j.failures.front();
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture_size(gc.steps));
  const boundary::Plan fp = boundary::plan_preset("full-and-piecewise", gc.cfg);
  std::vector<StepTrace> got;
  for (const StepInput& in : gc.steps) got.push_back(stack.run(fp, in));
  EXPECT_EQ(first_difference(gc.cfg, eager, got), "");
  const gpu::StackReport report = stack.report();
  ASSERT_EQ(report.served.size(), 4u);
  EXPECT_EQ(report.served[3].how, gpu::Served::How::full_graph);
  const std::map<std::string, long> paths = stack.report().kernel_paths;
  EXPECT_TRUE(paths.count("top-k: general select (rows past 16384 keys)"));
  EXPECT_TRUE(paths.count("index scores: device-driven over the capped grid"));
}

TEST(GpuPlans, FarBlocksGiveTheNearBits) {
  // Far blocks (docs/CASES.md): the blocks near the top of a pool where every cache offset
  // passes 2^31 elements; the speculative-verify case under eager, narrow and the dispatch mode
  // (its verify batches in the full graph) gives eager's bits on near blocks.
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("spec-verify"));
  gpu::StackOptions far;
  far.block_offset = gpu::far_block_offset(gc.cfg);
  ASSERT_GE(far.block_offset * gc.cfg.block_size * 128, 1LL << 31);
  const std::vector<StepTrace> near =
      run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
  for (const char* plan : {"eager", "narrow", "full-and-piecewise"}) {
    const std::vector<StepTrace> got =
        gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps,
                       boundary::plan_preset(plan, gc.cfg), "", nullptr, far);
    EXPECT_EQ(first_difference(gc.cfg, near, got), "") << plan;
  }
}

/// Generated scenarios under one plan each: "Plans/GpuPlanSweeps.<test>/<plan>".
class GpuPlanSweeps : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuPlanSweeps, ReplayAfterShortContextCaptureHandlesContextsBeyondKAndChangingRequests) {
  DSV32_REQUIRE_GPU();
  // One capture size (8) throughout: captured while contexts are short, replayed as they grow
  // past K, with T_a changing under the same T and requests joining and finishing.
  golden::CaseSpec spec = golden::find_case("default");
  spec.steps = {{{{0, 2}, {1, 3}}, 8, {}},
                {{{0, 1}, {1, 1}, {2, 6}}, 8, {1}},
                {{{0, 1}, {2, 1}, {3, 1}}, 8, {}},
                {{{0, 7}, {2, 1}}, 8, {}},
                {{{0, 1}}, 8, {}}};
  expect_plan_bitwise_equal(golden::generate(spec, "test"), GetParam());
}

/// Steps at capture sizes T of the vLLM list up to 512, each with T_a = T, T - 1 and 1 real
/// tokens (decode, prefill and mixed batches over growing contexts, padded rows NaN).
std::vector<StepInput> token_count_steps(const Config& cfg, int num_blocks) {
  ScenarioBuilder b(cfg, 31, num_blocks);
  std::vector<StepInput> steps;
  std::vector<int> live;  // requests with context, oldest first
  int next_id = 0;
  for (int T : {1, 2, 8, 24, 64, 136, 256, 512}) {
    for (int Ta : std::set<int>{T, std::max(1, T - 1), 1}) {
      std::vector<StepRequest> reqs;
      const int decodes = std::min<int>(static_cast<int>(live.size()), Ta == 1 ? 1 : Ta / 2);
      for (int i = 0; i < decodes; ++i) reqs.push_back({live[i], 1});  // decodes first
      if (const int rest = Ta - decodes; rest > 0) {
        reqs.push_back({next_id, rest});
        live.push_back(next_id++);
      }
      steps.push_back(b.step(reqs, T, Poison::nan));
      if (live.size() > 6) {
        b.finish(live.front());
        live.erase(live.begin());
      }
    }
  }
  return steps;
}

/// Decode-only steps at capture sizes of the vLLM list up to 512, each with T_a = T and T - 1
/// requests of one new token (padded rows NaN), after a prefill that gives some requests
/// contexts past K; contexts grow by one a step, so the short-prefill decision changes too.
std::vector<StepInput> decode_steps(const Config& cfg, int num_blocks) {
  ScenarioBuilder b(cfg, 37, num_blocks);
  std::vector<StepInput> steps;
  steps.push_back(b.step({{0, 12}, {1, 30}, {2, 5}}, 48, Poison::nan));
  for (int T : {1, 2, 8, 24, 64, 136, 256, 512})
    for (int Ta : std::set<int>{T, std::max(1, T - 1)}) {
      std::vector<StepRequest> reqs;
      // Short contexts first at the small sizes (the shortcut), the long ones from T = 8 on.
      const int first = T < 8 ? 3 : 0;
      for (int r = first; r < first + Ta; ++r) reqs.push_back({r, 1});
      steps.push_back(b.step(reqs, T, Poison::nan));
    }
  return steps;
}

TEST_P(GpuPlanSweeps, DecodeBatchesUpTo512) {
  DSV32_REQUIRE_GPU();
  // The full graph's sweep: every capture size with its decode kernels over T rows, the live
  // rows read on the device.
  const Config cfg = preset("tiny-fs");  // F S F, K = 8, blocks of 5
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 37));
  const int num_blocks = 4000;  // 515 requests of up to 30 tokens, blocks of 5
  const std::vector<StepInput> steps = decode_steps(cfg, num_blocks);
  ASSERT_EQ(max_capture_size(steps), 512);
  for (std::size_t s = 1; s < steps.size(); ++s) ASSERT_TRUE(boundary::uniform_decode(steps[s]));
  EXPECT_EQ(check_plans(cfg, w, num_blocks, steps, {GetParam()}), "") << replay_line();
}

TEST_P(GpuPlanSweeps, TokenCountsUpTo512WithFewerRealTokens) {
  DSV32_REQUIRE_GPU();
  const Config cfg = preset("tiny-fs");  // F S F, K = 8, blocks of 5
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 31));
  const int num_blocks = 3000 / cfg.block_size;  // every token of every step fits
  const std::vector<StepInput> steps = token_count_steps(cfg, num_blocks);
  ASSERT_EQ(max_capture_size(steps), 512);
  EXPECT_EQ(check_plans(cfg, w, num_blocks, steps, {GetParam()}), "") << replay_line();
}

INSTANTIATE_TEST_SUITE_P(Plans, GpuPlanSweeps, ::testing::ValuesIn(compared_plans()),
                         plan_test_name);

}  // namespace
}  // namespace dsv32

// Given prefixes on the GPU (docs/spec/GOLDEN.md, "Given prefix"; docs/GPU.md): the stack stores
// a request's drawn cache entries before the step that first names it, eagerly, under every
// plan (captured on first use, or before the step and replayed), on far blocks, over a
// tensor-parallel group and from a golden file as `dsv32 gpu` reads it. The eager run is judged
// against the CPU oracle, every plan gives eager's bits, and the same steps with the prefix
// withheld from the GPU (or another prefix stored in its place) fail the oracle. A test over
// plans takes the plan as its name's last element: `ctest -R 'GpuPrefixPlans.*/narrow$'`.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/prefix.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"
#include "support/plan_params.hpp"
#include "support/replay.hpp"

namespace dsv32 {
namespace {

namespace fs = std::filesystem;
using testing::compared_plans;
using testing::gtest_safe;
using testing::replay_line;

/// A small config with given prefixes: the cache's format and precision, and whether blocks are
/// placed far (StackOptions::block_offset past 2^31 elements of the widest cache row).
struct Variant {
  std::string name;
  std::string preset;
  KvCache kv;
  Precision precision;
  bool far;
};

void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v{
      {"tiny_fp8", "tiny", KvCache::fp8_ds_mla, Precision::bf16, false},  // one F layer
      {"fs_fp8", "tiny-fs", KvCache::fp8_ds_mla, Precision::bf16, false},
      {"fs_bf16", "tiny-fs", KvCache::bf16, Precision::bf16, false},
      {"fs_fp32", "tiny-fs", KvCache::bf16, Precision::fp32, false},
      {"fs_fp32_fp8", "tiny-fs", KvCache::fp8_ds_mla, Precision::fp32, false},
      {"fs_fp8_far", "tiny-fs", KvCache::fp8_ds_mla, Precision::bf16, true},
      {"fs_bf16_far", "tiny-fs", KvCache::bf16, Precision::bf16, true},
  };
  return v;
}

constexpr int kNumBlocks = 32;
constexpr std::uint64_t kSeed = 41;

/// K = 8, blocks of 5 (tiny, tiny-fs). Request 0 starts as a decode after 23 given positions
/// (past K, its last block partly given), request 1 as a chunk of 4 after 13 beside a decode and
/// a fresh prefill (a mixed step), request 3 as a decode after 6 (within K: all keys selected)
/// at a capture size not seen before; decodes over the prefixes follow. Capture sizes 2, 8, 4.
std::vector<StepInput> prefix_steps(const Config& cfg) {
  ScenarioBuilder b(cfg, kSeed, kNumBlocks);
  std::vector<StepInput> steps;
  steps.push_back(b.step({{0, 1, 23}}, 2));
  steps.push_back(b.step({{0, 1}, {1, 4, 13}, {2, 3}}, 8));
  steps.push_back(b.step({{0, 1}, {1, 1}, {2, 1}}, 8));
  steps.push_back(b.step({{0, 1}, {3, 1, 6}}, 4));
  steps.push_back(b.step({{0, 1}, {1, 1}, {2, 1}, {3, 1}}, 8));
  return steps;
}

struct PrefixRun {
  Config cfg;
  std::shared_ptr<const Weights> w;
  std::vector<StepInput> steps;
  gpu::StackOptions options;
};

PrefixRun setup(const Variant& v) {
  PrefixRun s;
  s.cfg = preset(v.preset);
  s.cfg.kv_cache = v.kv;
  s.cfg.precision = v.precision;
  s.cfg.validate();
  s.w = std::make_shared<const Weights>(Weights::generate(s.cfg, kSeed));
  s.steps = prefix_steps(s.cfg);
  if (v.far) s.options.block_offset = gpu::far_block_offset(s.cfg);
  return s;
}

/// The steps under the preset `plan` on a fresh stack with the setup's options.
std::vector<StepTrace> run(const PrefixRun& s, const std::string& plan,
                           const std::vector<StepInput>& steps) {
  return gpu::run_steps(s.cfg, *s.w, kNumBlocks, steps, boundary::plan_preset(plan, s.cfg), "",
                        nullptr, s.options);
}

/// Every oracle failure of `got` for the setup's steps, or why nothing was judged.
std::vector<std::string> oracle_failures(const PrefixRun& s, const std::vector<StepTrace>& got) {
  const Judgement j = judge(s.cfg, s.w, kNumBlocks, s.steps, got);
  std::vector<std::string> bad = j.failures;
  if (j.stages == 0) bad.push_back("nothing was compared");
  return bad;
}

class GpuPrefix : public ::testing::TestWithParam<Variant> {};

TEST_P(GpuPrefix, TheScenarioGivesPrefixes) {
  // No GPU needed: what the other tests rely on. Steps 0, 1 and 3 give one prefix each, of
  // the request's context length.
  const PrefixRun s = setup(GetParam());
  ASSERT_EQ(s.steps.size(), 5u);
  for (int step : {0, 1, 3}) {
    const StepInput& in = s.steps[step];
    ASSERT_EQ(in.given.size(), 1u) << "step " << step;
    const GivenPrefix& g = *in.given.front();
    int ctx = -1;
    for (const RequestStep& r : in.requests)
      if (r.id == g.request_id) ctx = r.ctx;
    EXPECT_EQ(ctx, g.length) << "step " << step << ": the prefix's request and its context";
    EXPECT_NO_THROW(g.check(s.cfg));
  }
  for (int step : {2, 4}) EXPECT_TRUE(s.steps[step].given.empty()) << "step " << step;
  EXPECT_GT(s.steps[0].requests[0].ctx, s.cfg.index_topk);  // past K: a real selection
  EXPECT_LT(s.steps[3].requests[1].ctx, s.cfg.index_topk);  // within K: all of 0..p
}

/// The setup's steps with each given prefix drawn from another seed: well-formed entries, but
/// not the step's.
std::vector<StepInput> with_other_prefixes(const PrefixRun& s) {
  std::vector<StepInput> other = s.steps;
  for (StepInput& in : other)
    for (auto& g : in.given)
      g = std::make_shared<const GivenPrefix>(
          draw_prefix(s.cfg, kSeed + 1, g->request_id, g->length));
  return other;
}

/// The oracle's emulated (storage-dtype) run of `steps` as a candidate: what a faultless GPU run
/// would give, up to rounding.
std::vector<StepTrace> oracle_run(const PrefixRun& s, const std::vector<StepInput>& steps) {
  Oracle t1(s.cfg, s.w, Mode::emulated, kNumBlocks);
  std::vector<StepTrace> out;
  for (const StepInput& in : steps) out.push_back(t1.step(in));
  return out;
}

TEST_P(GpuPrefix, TheScenarioIsJudgeableAndNeedsItsPrefix) {
  // No GPU needed: the oracle's own emulated run (its own sets, as a GPU picks them) passes the
  // judge, so a GPU failure is the GPU's; the same run with each prefix drawn from another seed
  // fails at the first step.
  const PrefixRun s = setup(GetParam());
  for (const std::string& f : oracle_failures(s, oracle_run(s, s.steps)))
    ADD_FAILURE() << GetParam().name << " oracle as candidate: " << f;
  const Judgement j = judge(s.cfg, s.w, kNumBlocks, s.steps, oracle_run(s, with_other_prefixes(s)));
  EXPECT_FALSE(j.failures.empty()) << "the oracle passed with other prefixes";
  EXPECT_EQ(j.first_step, 0);
}

TEST_P(GpuPrefix, EagerMatchesTheOracle) {
  DSV32_REQUIRE_GPU();
  const PrefixRun s = setup(GetParam());
  const std::vector<StepTrace> got = run(s, "eager", s.steps);
  for (const std::string& f : oracle_failures(s, got))
    ADD_FAILURE() << GetParam().name << " eager: " << f << "  (replay: " << replay_line() << ")";
  if (GetParam().far) {  // far blocks give the near bits
    PrefixRun near = s;
    near.options.block_offset = 0;
    EXPECT_EQ(first_difference(s.cfg, run(near, "eager", s.steps), got), "");
  }
}

TEST_P(GpuPrefix, WithheldPrefixFailsTheOracle) {
  // The test can fail: the GPU runs the same steps without the prefix (its caches hold what
  // they were set up with at those slots) and is judged against the oracle, which has it.
  DSV32_REQUIRE_GPU();
  const PrefixRun s = setup(GetParam());
  std::vector<StepInput> withheld = s.steps;
  for (StepInput& in : withheld) in.given.clear();
  const Judgement j = judge(s.cfg, s.w, kNumBlocks, s.steps, run(s, "eager", withheld));
  EXPECT_FALSE(j.failures.empty()) << "the GPU passed without the prefix";
  EXPECT_EQ(j.first_step, 0) << "the first step reads the prefix";
}

TEST_P(GpuPrefix, AnotherPrefixFailsTheOracle) {
  // Well-formed entries, but not the step's: each prefix drawn from another seed. Storing is
  // what the oracle sees, not merely that something finite was stored.
  DSV32_REQUIRE_GPU();
  const PrefixRun s = setup(GetParam());
  const Judgement j =
      judge(s.cfg, s.w, kNumBlocks, s.steps, run(s, "eager", with_other_prefixes(s)));
  EXPECT_FALSE(j.failures.empty()) << "the GPU passed with another request's prefix";
  EXPECT_EQ(j.first_step, 0);
}

TEST_P(GpuPrefix, CapturedBeforeTheStepsReplaysThem) {
  // Stack::capture at every capture size first (no step seen), then Stack::replay of each step:
  // the replay stores the step's prefix before launching.
  DSV32_REQUIRE_GPU();
  const PrefixRun s = setup(GetParam());
  const std::vector<StepTrace> eager = run(s, "eager", s.steps);
  std::set<int> sizes;
  for (const StepInput& in : s.steps) sizes.insert(in.capture_size);
  for (const char* name : {"narrow", "full-and-piecewise"}) {
    const boundary::Plan plan = boundary::plan_preset(name, s.cfg);
    gpu::Stack stack(s.cfg, *s.w, kNumBlocks, max_capture_size(s.steps), 0, nullptr, s.options);
    for (int T : sizes) stack.capture(plan, T);
    std::vector<StepTrace> got;
    for (const StepInput& in : s.steps) got.push_back(stack.replay(plan, in));
    EXPECT_EQ(first_difference(s.cfg, eager, got), "") << name;
    EXPECT_EQ(stack.report().captures, static_cast<int>(sizes.size()) * (plan.mixed ? 2 : 1))
        << name << ": a replay captured";
  }
}

std::string variant_name(const ::testing::TestParamInfo<Variant>& p) {
  return p.param.name;
}

INSTANTIATE_TEST_SUITE_P(Variants, GpuPrefix, ::testing::ValuesIn(variants()), variant_name);

/// One variant under one plan, captured on first use: "GpuPrefixPlans.EqualsEagerBitwise/
/// <variant>/<plan>", registered for every variant and compared plan.
class GpuPrefixPlan : public ::testing::Test {
 public:
  GpuPrefixPlan(Variant v, std::string plan) : v_(std::move(v)), plan_(std::move(plan)) {}
  void TestBody() override {
    DSV32_REQUIRE_GPU();
    const PrefixRun s = setup(v_);
    EXPECT_EQ(first_difference(s.cfg, run(s, "eager", s.steps), run(s, plan_, s.steps)), "")
        << v_.name << " plan " << plan_ << " (replay: " << replay_line() << ")";
  }

 private:
  Variant v_;
  std::string plan_;
};

[[maybe_unused]] const bool kPlansRegistered = [] {
  for (const Variant& v : variants())
    for (const std::string& plan : compared_plans())
      ::testing::RegisterTest("GpuPrefixPlans",
                              ("EqualsEagerBitwise/" + v.name + "/" + gtest_safe(plan)).c_str(),
                              nullptr, nullptr, __FILE__, __LINE__,
                              [=]() -> ::testing::Test* { return new GpuPrefixPlan(v, plan); });
  return true;
}();

/// Every rank's stack stores the whole prefix (the caches are replicated); eager passes the
/// unsharded oracle and every plan gives its bits: "" or why not.
std::string prefix_under_tp2(gpu::TpTransport transport) {
  const PrefixRun s = setup(variants()[1]);  // fs_fp8
  return testing::check_plans(s.cfg, s.w, kNumBlocks, s.steps, boundary::plan_names(), nullptr, 2,
                              transport);
}

TEST(GpuPrefixTp, EveryPlanOnEachRankMatchesTheUnshardedOracle_tp2_one_gpu) {
  DSV32_REQUIRE_GPU();
  EXPECT_EQ(prefix_under_tp2(gpu::TpTransport::one_gpu), "");
}

TEST(GpuPrefixTp, EveryPlanOnEachRankMatchesTheUnshardedOracle_tp2) {
  DSV32_REQUIRE_GPU();
  if (const std::string why = gpu::no_tp_reason(2, gpu::TpTransport::nccl); !why.empty())
    GTEST_SKIP() << why;
  EXPECT_EQ(prefix_under_tp2(gpu::TpTransport::nccl), "");
}

TEST(GpuPrefixGolden, AGoldenWithAPrefixRunsAsDsv32GpuRunsIt) {
  // Through a file: the prefix written under /prefix, read back onto its steps, run by a
  // tensor-parallel group of one as `dsv32 gpu GOLDEN --plan P` runs it, judged as it judges.
  DSV32_REQUIRE_GPU();
  golden::CaseSpec spec;
  spec.name = "gpu-prefix";
  spec.cfg = preset("tiny-fs");
  spec.cfg.kv_cache = KvCache::fp8_ds_mla;
  spec.seed = kSeed;
  spec.num_blocks = kNumBlocks;
  spec.steps = {{{{0, 1, 23}}, 2, {}},
                {{{0, 1}, {1, 4, 13}, {2, 3}}, 8, {}},
                {{{0, 1}, {1, 1}, {2, 1}}, 8, {}}};
  const fs::path dir = fs::temp_directory_path() / "dsv32-gpu-prefix";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "gpu-prefix.h5").string();
  golden::write(path, golden::generate(spec, "test"));
  const golden::GoldenCase gc = golden::read(path);
  fs::remove_all(dir);
  ASSERT_EQ(gc.steps.at(0).given.size(), 1u);
  ASSERT_EQ(gc.steps.at(1).given.size(), 1u);
  for (const char* name : {"eager", "full-and-piecewise"}) {
    gpu::TpGroup group(gc.cfg, gc.weights, 1, gc.num_blocks, max_capture_size(gc.steps));
    std::vector<StepTrace> got;
    for (const StepInput& in : gc.steps)
      got.push_back(group.run(boundary::plan_preset(name, gc.cfg), in));
    const Judgement j =
        judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, got);
    EXPECT_GT(j.stages, 0) << name;
    for (const std::string& f : j.failures) ADD_FAILURE() << name << ": " << f;
  }
}

}  // namespace
}  // namespace dsv32

// Judging any implementation's traces (dsv32::judge, TESTING.md sections 1-2) and the bisect
// engine, without a GPU: the candidates are the goldens' own traces, with defects put in on
// purpose, and the bisect's runs come from a stand-in implementation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/judge/bisect.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/golden_cases.hpp"
#include "support/judging.hpp"

namespace dsv32 {
namespace {

using testing::case_test_name;
using testing::committed_cases;
using testing::fixture;

using testing::judge_case;
using testing::stage_of;

std::string failures_of(const Judgement& j) {
  std::string s;
  for (std::size_t i = 0; i < j.failures.size() && i < 3; ++i) s += "\n  " + j.failures[i];
  return s;
}

class JudgeGolden : public ::testing::TestWithParam<std::string> {};

// The golden's own T0 traces, as a candidate, pass. (Its T1 traces are no candidate: T1 follows
// T0's top-k sets, which need not be valid for T1's own quantized q and k.)
TEST_P(JudgeGolden, ItsOwnTracesPass) {
  const golden::GoldenCase gc = golden::read(fixture(GetParam()));
  const Judgement j = judge_case(gc, gc.expected);
  EXPECT_TRUE(j.failures.empty()) << failures_of(j);
  EXPECT_GT(j.stages, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, JudgeGolden, ::testing::ValuesIn(committed_cases()),
                         case_test_name);

// One defect each in `output`, in `o` (two heads swapped) and in `topk` (a selected position
// replaced by a worse one): judging fails, naming that stage first.
TEST(JudgeDefects, OutputNamesTheOutput) {
  const golden::GoldenCase gc = golden::read(fixture("default"));
  std::vector<StepTrace> bad = gc.expected;
  Tensor& out = bad.back().output;
  out.data[out.data.size() / 2] += 1.0 + std::fabs(out.data[out.data.size() / 2]);
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty()) << "a wrong output element passed";
  EXPECT_EQ(j.first_stage, "output") << j.failures.front();
  EXPECT_EQ(j.first_layer, -1);
  EXPECT_EQ(j.first_step, static_cast<int>(bad.size()) - 1);
}

TEST(JudgeDefects, TwoHeadsSwappedInONamesO) {
  const golden::GoldenCase gc = golden::read(fixture("default"));
  std::vector<StepTrace> bad = gc.expected;
  Tensor& o = stage_of(bad.front().layers.front(), "o");
  const int H = gc.cfg.num_heads, dv = gc.cfg.v_head_dim;
  ASSERT_GE(H, 2);
  const std::int64_t rows = o.shape.front();
  for (std::int64_t t = 0; t < rows; ++t)
    for (int i = 0; i < dv; ++i)
      std::swap(o.data[(t * H + 0) * dv + i], o.data[(t * H + 1) * dv + i]);
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty()) << "two swapped heads passed";
  EXPECT_EQ(j.first_stage, "o") << j.failures.front();
  EXPECT_EQ(j.first_layer, 0);
  EXPECT_EQ(j.first_step, 0);
}

TEST(JudgeDefects, AWorsePositionInTopkNamesTopk) {
  const golden::GoldenCase gc = golden::read(fixture("ctx-around-k"));
  const int K = gc.cfg.index_topk;
  // The first (step, F layer, token) whose context exceeds K, so that its set is a selection.
  Oracle t0(gc.cfg, std::make_shared<const Weights>(gc.weights), Mode::exact, gc.num_blocks);
  for (std::size_t s = 0; s < gc.steps.size(); ++s) {
    const StepInput& in = gc.steps[s];
    t0.step(in);
    for (int l = 0; l < gc.cfg.num_layers; ++l) {
      if (!gc.cfg.is_full_layer(l)) continue;
      for (int t = 0; t < in.num_tokens; ++t) {
        if (in.positions[t] + 1 <= K) continue;
        const LayerTrace& lt = gc.expected[s].layers[l];
        const IndexScores sc = t0.index_scores(l, in, lt, t);
        const Tensor& topk = lt.at("topk");
        std::set<int> chosen;
        for (int k = 0; k < K; ++k) chosen.insert(static_cast<int>(topk.data[t * K + k]));
        int worst = -1;
        for (int p = 0; p <= in.positions[t]; ++p)
          if (!chosen.count(p) && (worst < 0 || sc.score[p] < sc.score[worst])) worst = p;
        ASSERT_GE(worst, 0);
        // The best selected position out, the worst unselected one in, in ascending order.
        int best = *chosen.begin();
        for (int p : chosen)
          if (sc.score[p] > sc.score[best]) best = p;
        chosen.erase(best);
        chosen.insert(worst);
        std::vector<StepTrace> bad = gc.expected;
        Tensor& row = stage_of(bad[s].layers[l], "topk");
        int k = 0;
        for (int p : chosen) row.data[t * K + k++] = p;
        const Judgement j = judge_case(gc, bad);
        ASSERT_FALSE(j.failures.empty()) << "a worse selected position passed";
        EXPECT_EQ(j.first_stage, "topk") << j.failures.front();
        EXPECT_EQ(j.first_layer, l);
        EXPECT_EQ(j.first_step, static_cast<int>(s));
        return;
      }
    }
  }
  FAIL() << "ctx-around-k has no token whose context exceeds K";
}

// The bisect engine with a stand-in implementation: the golden's T0 traces, with a defect that
// appears only when the plan places one op in a graph, or in every captured plan, or always.
class BisectEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    gc_ = golden::read(fixture("default"));
    w_ = std::make_shared<const Weights>(gc_.weights);
  }
  /// The traces with `y` of (step 0, `layer`) moved by one unit in its first element.
  std::vector<StepTrace> broken(int layer) const {
    std::vector<StepTrace> out = gc_.expected;
    Tensor& y = stage_of(out.front().layers.at(layer), "y");
    y.data.front() += 1.0;
    return out;
  }
  BisectReport run(const boundary::Plan& plan, const PlanRunner& runner) const {
    return bisect(gc_.cfg, w_, gc_.num_blocks, gc_.steps, plan, "", runner);
  }
  golden::GoldenCase gc_;
  std::shared_ptr<const Weights> w_;
};

TEST_F(BisectEngine, NamesTheCapturedOpThatBreaksTheRun) {
  const boundary::Plan narrow = boundary::plan_preset(boundary::PlanPreset::narrow, gc_.cfg);
  const int layer = gc_.cfg.num_layers - 1;
  int graph_ops = 0;
  for (int l = 0; l < gc_.cfg.num_layers; ++l)
    for (const Op op : narrow.layer_ops(gc_.cfg, l))
      graph_ops += narrow.at(l, op) == boundary::Placement::graph;
  for (const Op culprit : {Op::o_proj, Op::input_norm, Op::residual_add}) {
    const PlanRunner runner = [&](const boundary::Plan& p, const std::string& mutant) {
      EXPECT_EQ(mutant, "");
      const bool captured = p.capture && p.at(layer, culprit) == boundary::Placement::graph;
      return captured ? broken(layer) : gc_.expected;
    };
    const BisectReport r = run(narrow, runner);
    EXPECT_EQ(r.verdict, BisectVerdict::boundary) << op_name(culprit) << ": " << r.summary();
    EXPECT_EQ(r.op, op_name(culprit));
    EXPECT_EQ(r.layer, layer);
    EXPECT_EQ(r.where, "step0/layer" + std::to_string(layer) + "/y");
    // eager, the plan, breakable-eager, then a binary search over the captured ops.
    EXPECT_LE(r.runs, 3 + static_cast<int>(std::ceil(std::log2(graph_ops)))) << op_name(culprit);
  }
}

TEST_F(BisectEngine, TellsTheMachineryAndDataBugsApart) {
  const boundary::Plan narrow = boundary::plan_preset(boundary::PlanPreset::narrow, gc_.cfg);
  const BisectReport none =
      run(narrow, [&](const boundary::Plan&, const std::string&) { return gc_.expected; });
  EXPECT_EQ(none.verdict, BisectVerdict::none) << none.summary();
  EXPECT_EQ(none.runs, 2);
  const BisectReport machinery = run(narrow, [&](const boundary::Plan& p, const std::string&) {
    return p.capture ? broken(0) : gc_.expected;
  });
  EXPECT_EQ(machinery.verdict, BisectVerdict::eager_segment) << machinery.summary();
  EXPECT_EQ(machinery.where, "step0/layer0/y");
  EXPECT_EQ(machinery.op, "o_proj");
  const BisectReport data =
      run(narrow, [&](const boundary::Plan&, const std::string&) { return broken(0); });
  EXPECT_EQ(data.verdict, BisectVerdict::data) << data.summary();
  EXPECT_EQ(data.where, "step0/layer0/y");
  EXPECT_EQ(data.op, "o_proj");
  EXPECT_EQ(data.runs, 1);
}

TEST_F(BisectEngine, HandsAStackMutantToEveryRunAndAppliesAPlanMutant) {
  const boundary::Plan narrow = boundary::plan_preset(boundary::PlanPreset::narrow, gc_.cfg);
  std::set<std::string> mutants;
  const PlanRunner record = [&](const boundary::Plan& p, const std::string& mutant) {
    mutants.insert(mutant);
    // The plan mutant capture-host-op captures sparse_mqa: break the run where it is captured.
    const bool host = p.capture && p.at(0, Op::sparse_mqa) == boundary::Placement::graph;
    return host ? broken(0) : gc_.expected;
  };
  const BisectReport stack =
      bisect(gc_.cfg, w_, gc_.num_blocks, gc_.steps, narrow, "double-rope", record);
  EXPECT_EQ(mutants, std::set<std::string>{"double-rope"});
  EXPECT_EQ(stack.verdict, BisectVerdict::none);
  mutants.clear();
  const BisectReport plan =
      bisect(gc_.cfg, w_, gc_.num_blocks, gc_.steps, narrow, "capture-host-op", record);
  EXPECT_EQ(mutants, std::set<std::string>{""});
  EXPECT_EQ(plan.verdict, BisectVerdict::boundary) << plan.summary();
  EXPECT_EQ(plan.op, "sparse_mqa");
  EXPECT_EQ(plan.layer, 0);
}

TEST(BisectVerdicts, PrintAsTheirNames) {
  EXPECT_EQ(to_string(BisectVerdict::none), "none");
  EXPECT_EQ(to_string(BisectVerdict::data), "data");
  EXPECT_EQ(to_string(BisectVerdict::eager_segment), "eager-segment");
  EXPECT_EQ(to_string(BisectVerdict::boundary), "boundary");
  EXPECT_EQ(to_string(BisectVerdict::dispatch), "dispatch");
}

}  // namespace
}  // namespace dsv32

// The CUDA stack's `eager` plan against the oracle (TESTING.md sections 1-2): every committed
// golden case, a full-size case, bitwise repeatability, and poisoned padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/stack_lab.hpp"
#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/trace_diff.hpp"
#include "support/golden_cases.hpp"
#include "support/gpu.hpp"

namespace dsv32 {
namespace {

using testing::case_test_name;
using testing::committed_cases;
using testing::fixture;
using testing::max_capture;

/// Runs every step of a case on the GPU and judges it; failures carry the replay command.
std::vector<std::string> judge_case(const golden::GoldenCase& gc,
                                    const gpu::StackOptions& options = {}) {
  const std::vector<StepTrace> got =
      gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps,
                     boundary::plan_preset("eager", gc.cfg), "", nullptr, options);
  const Judgement j =
      judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, got);
  std::vector<std::string> bad;
  for (const std::string& f : j.failures)
    bad.push_back(gc.case_id + " plan eager " + f + "  (replay: " + testing::replay_line() + ")");
  if (j.stages == 0) bad.push_back(gc.case_id + ": nothing was compared");
  return bad;
}

class GpuEager : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuEager, MatchesTheOracleOnCommittedGolden) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture(GetParam()));
  const std::vector<std::string> bad = judge_case(gc);
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuEager, ::testing::ValuesIn(committed_cases()),
                         case_test_name);

// indexer_topk's scores on CUDA cores (StackOptions::index_mma off): other score bits than the
// tensor cores', judged against the oracle the same way.
class GpuEagerCudaCoreScores : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuEagerCudaCoreScores, MatchesTheOracleOnCommittedGolden) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture(GetParam()));
  gpu::StackOptions options;
  options.index_mma = false;
  const std::vector<std::string> bad = judge_case(gc, options);
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuEagerCudaCoreScores, ::testing::ValuesIn(committed_cases()),
                         case_test_name);

TEST(GpuEagerFull, Dsv32SizesMatchTheOracle) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::generate(golden::find_case("dsv32-full"), "test");
  const std::vector<std::string> bad = judge_case(gc);
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

TEST(GpuEagerRepeat, TwentyRunsOfAStepAreBitwiseIdentical) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
  for (std::size_t s = 0; s + 1 < gc.steps.size(); ++s) stack.step(gc.steps[s]);
  // Re-running the last step rewrites the same cache entries with the same values.
  const StepTrace first = stack.step(gc.steps.back());
  for (int i = 1; i < 20; ++i) {
    const StepTrace again = stack.step(gc.steps.back());
    for (int l = 0; l < gc.cfg.num_layers; ++l)
      for (const Tensor& t : first.layers[l].tensors) {
        const CompareResult r = compare_abs(again.layers[l].at(t.name), t, 0.0);
        ASSERT_TRUE(r.pass) << "run " << i << " layer " << l << ": " << r.summary();
      }
    ASSERT_TRUE(compare_abs(again.output, first.output, 0.0).pass) << "run " << i;
  }
}

TEST(GpuEagerPadding, PoisonedPaddedRowsChangeNoRealRow) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("padded"));
  for (double poison : {std::nan(""), 1e30}) {
    gpu::Stack a(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
    gpu::Stack b(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
    for (const StepInput& in : gc.steps) {
      StepInput poisoned = in;
      poisoned.hidden.bottomRows(in.capture_size - in.num_tokens).setConstant(poison);
      StepInput zeroed = in;
      zeroed.hidden.bottomRows(in.capture_size - in.num_tokens).setZero();
      const StepTrace ta = a.step(poisoned), tb = b.step(zeroed);
      EXPECT_TRUE(compare_abs(ta.output, tb.output, 0.0).pass) << "poison " << poison;
      for (double v : ta.output.data) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// `dsv32 bench-gpu --ablate` times a step with one launch left out: every launch is labelled by
// its op, leaving one out must change the step (else the benchmark times nothing), and
// skip_launch("") must bring back the step's own bits.
TEST(GpuAblation, ALaunchLeftOutChangesTheStepAndComesBack) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
  for (std::size_t s = 0; s + 1 < gc.steps.size(); ++s) stack.step(gc.steps[s]);
  const StepInput& last = gc.steps.back();
  const std::vector<std::string> labels = stack.lab().launch_labels(last);
  ASSERT_FALSE(labels.empty());
  for (const std::string& l : labels) {
    const std::string op = l.substr(0, l.find(':'));
    EXPECT_TRUE(find_op(op).has_value()) << "label " << l << " names no op";
    EXPECT_GT(l.size(), op.size() + 1) << "label " << l << " names no kernel";
  }
  for (const char* want : {"input_norm:rmsnorm", "residual_add:residual_add"})
    EXPECT_NE(std::find(labels.begin(), labels.end(), want), labels.end()) << want;
  const StepTrace ref = stack.step(last);
  stack.lab().skip_launch("residual_add:residual_add");
  const StepTrace without = stack.step(last);
  EXPECT_FALSE(compare_abs(without.output, ref.output, 0.0).pass)
      << "leaving residual_add out changed nothing";
  stack.lab().skip_launch("");
  const StepTrace again = stack.step(last);
  const CompareResult r = compare_abs(again.output, ref.output, 0.0);
  EXPECT_TRUE(r.pass) << "after skip_launch(\"\"): " << r.summary();
}

// The indexer's stream (docs/GPU.md, "Two streams"): the same steps with the indexer forked onto
// its own stream and with one stream (StackOptions::overlap off) give the same bits under every
// plan; a missing join would let sparse_mqa read top-k rows still being written, or the next
// layer's clear race them. So do the kernels launched without programmatic dependent launch
// (pdl off) and the select's radix passes alone (topk_bins off).
// `indexer_wq_b` leads (runs on the main stream ahead of `q_b_proj`) exactly where the plan
// runs `norm_rope_cache` .. `indexer_topk` in one forked stretch: eagerly, or all captured (a
// plan that captures the host op `indexer_topk` on purpose); not under `narrow` (`indexer_topk`
// eager), nor `narrow` with `q_b_proj` eager.
TEST(GpuOverlap, OneStreamAndTwoGiveTheSameBits) {
  DSV32_REQUIRE_GPU();
  for (const char* name : {"ctx-around-k", "fs-pattern"}) {
    const golden::GoldenCase gc = golden::read(fixture(name));
    bool indexer = false;
    for (int l = 0; l < gc.cfg.num_layers; ++l) indexer = indexer || gc.cfg.is_full_layer(l);
    ASSERT_TRUE(indexer) << name << " has no F layer";
    // The steps under `plan` with `options`, and how often the stack forked the indexer's
    // stream and led with indexer_wq_b.
    const auto run = [&](const gpu::StackOptions& options, const boundary::Plan& plan) {
      gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc), 0, nullptr, options);
      std::vector<StepTrace> out;
      for (const StepInput& in : gc.steps) out.push_back(stack.run(plan, in));
      return std::tuple{out, stack.report().indexer_forks, stack.report().indexer_leads};
    };
    std::vector<boundary::Plan> plans;
    for (const std::string& plan : boundary::plan_names())
      plans.push_back(boundary::plan_preset(plan, gc.cfg));
    boundary::Plan qb_eager = boundary::plan_preset("narrow", gc.cfg);
    qb_eager.name = "narrow with q_b_proj eager";
    for (auto& layer : qb_eager.placement) layer[Op::q_b_proj] = boundary::Placement::eager;
    plans.push_back(qb_eager);
    boundary::Plan all = boundary::plan_preset("breakable-eager", gc.cfg);
    all.name = "every op captured";
    all.allow_host_capture = true;  // indexer_topk, sparse_mqa and uv_proj too, on purpose
    for (auto& layer : all.placement)
      for (auto& [op, where] : layer) where = boundary::Placement::graph;
    plans.push_back(all);
    for (const boundary::Plan& p : plans) {
      const std::string& plan = p.name;
      gpu::StackOptions single, plain, cuda_cores;
      single.overlap = false;
      plain.pdl = false;
      plain.topk_bins = false;
      cuda_cores.index_mma = false;  // other bits (TESTING.md's bound): against eager's own
      const auto [one, forks_one, leads_one] = run(single, p);
      const auto [two, forks_two, leads_two] = run({}, p);
      const auto [other, forks_other, leads_other] = run(plain, p);
      ASSERT_EQ(one.size(), gc.steps.size());
      if (!p.allow_host_capture) {  // a plan that captures H ops on purpose is wrong by design
        EXPECT_EQ(first_difference(gc.cfg, std::get<0>(run(cuda_cores, plans.front())),
                                   std::get<0>(run(cuda_cores, p))),
                  "")
            << name << " under " << plan << " with index_mma off";
      }
      EXPECT_EQ(first_difference(gc.cfg, one, two), "") << name << " under " << plan;
      EXPECT_EQ(first_difference(gc.cfg, other, two), "")
          << name << " under " << plan << ": pdl or topk_bins off moved bits";
      EXPECT_EQ(forks_other, forks_two) << name << " under " << plan;
      EXPECT_EQ(leads_other, leads_two) << name << " under " << plan;
      EXPECT_EQ(forks_one, 0) << name << " under " << plan << ": overlap off forked";
      EXPECT_EQ(leads_one, 0) << name << " under " << plan << ": overlap off led";
      // Which plan runs a step: a dispatch plan's steps that are not a uniform decode run its
      // piecewise plan (or eagerly).
      const auto leads_under = [&](const boundary::Plan& q) {
        bool leads = !q.capture;
        for (int l = 0; l < gc.cfg.num_layers; ++l) {
          bool stretch = gc.cfg.is_full_layer(l);
          for (const Op op : {Op::norm_rope_cache, Op::q_b_proj, Op::uk_absorb, Op::indexer_wq_b,
                              Op::fused_q, Op::indexer_topk})
            stretch = stretch && q.at(l, op) == boundary::Placement::graph;
          leads = leads || stretch;
        }
        return leads;
      };
      const auto forks_under = [&](const boundary::Plan& q) {
        bool forks = !q.capture;
        for (int l = 0; l < gc.cfg.num_layers; ++l)
          forks = forks || (gc.cfg.is_full_layer(l) &&
                            q.at(l, Op::indexer_wq_b) == boundary::Placement::graph);
        return forks;
      };
      bool leads = false, forks = false;
      for (const StepInput& in : gc.steps) {
        leads = leads || leads_under(p.serving(in));
        forks = forks || forks_under(p.serving(in));
      }
      if (leads) {
        EXPECT_GT(leads_two, 0) << name << " under " << plan << ": indexer_wq_b never led";
      } else {
        EXPECT_EQ(leads_two, 0) << name << " under " << plan << ": indexer_wq_b led";
      }
      // An eager segment keeps one stream: the indexer forks eagerly, or where one of its ops
      // is captured (`breakable-eager` and `wide` run them all as eager segments).
      if (forks) {
        EXPECT_GT(forks_two, 0) << name << " under " << plan << ": the indexer never forked";
      } else {
        EXPECT_EQ(forks_two, 0) << name << " under " << plan << ": an eager segment forked";
      }
    }
  }
}

TEST(GpuHostCosts, AModelledDispatchCostChangesNoBits) {
  DSV32_REQUIRE_GPU();
  // bench-gpu --dispatch-us spends host time before eager ops and graph launches; the steps
  // must give the same bits as without, under a plan with eager ops, eager itself and the
  // dispatch mode.
  const golden::GoldenCase gc = golden::read(fixture("default"));
  for (const char* name : {"eager", "narrow", "full-and-piecewise"}) {
    const boundary::Plan plan = boundary::plan_preset(name, gc.cfg);
    const auto run = [&](double op_us, double graph_us) {
      gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, max_capture(gc));
      stack.lab().set_host_costs(op_us, graph_us);
      std::vector<StepTrace> out;
      for (const StepInput& in : gc.steps) out.push_back(stack.run(plan, in));
      return out;
    };
    EXPECT_EQ(first_difference(gc.cfg, run(0, 0), run(30, 10)), "") << name;
  }
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 8);
  EXPECT_THROW(stack.lab().set_host_costs(-1, 0), std::invalid_argument);
  EXPECT_THROW(stack.lab().set_host_costs(0, std::nan("")), std::invalid_argument);
}

TEST(GpuMemory, TheCopyFormLatentIsEachLayersStaticLatent) {
  DSV32_REQUIRE_GPU();
  // What bench-gpu --memory subtracts for a no-copy plan: one (max_tokens, H, Lkv) latent per
  // layer in the storage type (bf16 in bf16 precision, fp32 in fp32 precision).
  for (const char* name : {"default", "precision-fp32"}) {
    const golden::GoldenCase gc = golden::read(fixture(name));
    const Config& c = gc.cfg;
    gpu::Stack stack(c, gc.weights, gc.num_blocks, 24);
    const std::size_t storage = c.precision == Precision::bf16 ? 2 : 4;
    EXPECT_EQ(stack.report().copy_form_bytes,
              static_cast<std::size_t>(c.num_layers) * 24 * c.num_heads * c.kv_lora_rank * storage)
        << name;
  }
}

TEST(GpuErrors, BadInputsGiveClearErrors) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::read(fixture("default"));
  gpu::Stack stack(gc.cfg, gc.weights, gc.num_blocks, 4);
  try {
    stack.step(gc.steps.front());  // capture size 16 > 4
    FAIL() << "an oversized step was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds max_tokens"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv32

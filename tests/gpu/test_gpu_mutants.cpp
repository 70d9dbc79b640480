// The mutants of BOUNDARIES.md section 4: with each one on, the suite's checks fail (a plan
// differs from eager bitwise, or eager fails the oracle), and the bisect engine names the op
// whose capture breaks the run, or for data bugs the first failing stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "dsv32/boundary/mutants.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/bisect.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"

namespace dsv32 {
namespace {

/// A mutant, the plan it is run under, and what bisect must say.
struct Expect {
  std::string mutant;
  std::string plan;
  BisectVerdict verdict;
  std::vector<std::string> ops;  // the op named must be one of these (data bugs: the op of
                                 // the first failing stage)
};

void PrintTo(const Expect& e, std::ostream* os) {
  *os << e.mutant << " under " << e.plan;
}

const std::vector<Expect>& expectations() {
  using V = BisectVerdict;
  static const std::vector<Expect> e{
      {"fresh-output", "narrow", V::boundary, {"o_proj"}},
      {"capture-host-op", "narrow", V::boundary, {"sparse_mqa"}},
      {"baked-short-prefill", "narrow", V::eager_segment, {"indexer_topk"}},
      {"uv-captured-nocopy", "narrow", V::boundary, {"uv_proj"}},
      {"shared-layer-clears", "narrow", V::data, {"indexer_topk"}},
      {"no-topk-clear", "narrow", V::data, {"indexer_topk"}},
      {"double-rope", "narrow", V::data, {"fused_q"}},
      // Slot 0 holds a real token's key and latent: which read of it fails first depends
      // on a race in the first step (the real token and a padded row write it together).
      {"padded-cache-write", "narrow", V::data, {"norm_rope_cache", "indexer_topk", "sparse_mqa"}},
      {"stale-positions", "narrow", V::boundary, {"norm_rope_cache"}},
      {"unjoined-stream", "narrow", V::eager_segment, {"uv_proj"}},
      // The full graphs' mutants, under the dispatch mode (BOUNDARIES.md's catalogue, extended
      // in docs/GPU.md): a mixed step served by the full graph is named as such; the graph
      // reading the capture's device metadata or short-prefill flag by the first op that reads
      // them, layer 0's indexer_topk.
      {"full-for-mixed", "full-and-piecewise", V::dispatch, {""}},
      {"stale-full-metadata", "full-and-piecewise", V::boundary, {"indexer_topk"}},
      {"stale-short-prefill", "full-and-piecewise", V::boundary, {"indexer_topk"}},
      // Issue 41's classes, each on its family's case (boundary::mutant_bait). A verify batch
      // strided wrongly is the device-driven ops' own fault: wrong with every op eager too.
      {"verify-stride", "full-and-piecewise", V::eager_segment, {"indexer_topk"}},
      {"topk-bin-overflow", "narrow", V::data, {"indexer_topk"}},
      {"topk-edge", "narrow", V::data, {"indexer_topk"}},
      // The write that was skipped: the reused block's row of `c` holds nothing of the step's.
      {"reused-block-skip", "narrow", V::data, {"norm_rope_cache"}},
      // Run on far blocks: each write lands at a wrapped offset (or is skipped), the reads
      // follow the block table to the right one.
      {"int32-offset", "narrow", V::data, {"norm_rope_cache", "indexer_topk", "sparse_mqa"}},
      // The size map's, each on a case past its switch. The trace's `c` reads the cache with
      // the right scales (the trace's own read): the backend's output is the first wrong.
      {"fp8-tile-scale", "narrow", V::data, {"sparse_mqa"}},
      {"topk-long-row", "narrow", V::data, {"indexer_topk"}},
      // Decode context parallelism's: wrong under eager too, each first in the merged latent
      // of the backend (the GPU trace holds the merge, not the ranks' partials).
      {"dcp-lse-base2", "narrow", V::data, {"sparse_mqa"}},
      {"dcp-empty-rank-nan", "narrow", V::data, {"sparse_mqa"}},
      {"dcp-global-as-local", "narrow", V::data, {"sparse_mqa"}},
      {"dcp-share-prefix", "narrow", V::data, {"sparse_mqa"}},
  };
  return e;
}

/// The registry case that exposes `mutant` (mutant-bait unless it is a family's), made once.
const golden::GoldenCase& bait(const std::string& mutant = "") {
  static std::map<std::string, golden::GoldenCase> made;
  const std::string name = boundary::mutant_bait(mutant);
  auto it = made.find(name);
  if (it == made.end())
    it = made.emplace(name, golden::generate(golden::find_case(name), "test")).first;
  return it->second;
}

TEST(Mutants, EveryMutantOfTheSpecIsTested) {
  std::vector<std::string> tested;
  for (const Expect& e : expectations()) tested.push_back(e.mutant);
  EXPECT_EQ(tested, boundary::mutant_names());
}

TEST(Mutants, EveryBaitPassesWithoutAMutant) {
  DSV32_REQUIRE_GPU();
  std::set<std::string> checked;
  for (const Expect& e : expectations()) {
    if (!checked.insert(boundary::mutant_bait(e.mutant)).second) continue;
    const golden::GoldenCase& gc = bait(e.mutant);
    EXPECT_EQ(testing::check_plans(gc.cfg, std::make_shared<const Weights>(gc.weights),
                                   gc.num_blocks, gc.steps, boundary::plan_names()),
              "")
        << gc.case_id;
  }
}

class MutantCaught : public ::testing::TestWithParam<Expect> {};

TEST_P(MutantCaught, TheSuiteFailsAndBisectNamesTheOp) {
  DSV32_REQUIRE_GPU();
  const Expect& e = GetParam();
  const golden::GoldenCase& gc = bait(e.mutant);
  const auto w = std::make_shared<const Weights>(gc.weights);
  // The suite's checks, as the plan tests run them, on the mutated build.
  const boundary::Plan plan =
      boundary::mutate_plan(boundary::plan_preset(e.plan, gc.cfg), e.mutant);
  const std::string stack_mutant = boundary::stack_switch(e.mutant);
  const auto run = [&](const boundary::Plan& p) {
    return gpu::run_steps(gc.cfg, gc.weights, gc.num_blocks, gc.steps, p, stack_mutant);
  };
  const std::vector<StepTrace> eager = run(boundary::plan_preset("eager", gc.cfg));
  const std::vector<StepTrace> got = run(plan);
  const bool plan_differs = first_difference(gc.cfg, eager, got) != "";
  const bool oracle_fails = !judge(gc.cfg, w, gc.num_blocks, gc.steps, got).failures.empty();
  EXPECT_TRUE(plan_differs || oracle_fails) << e.mutant << " went unnoticed";

  const gpu::BisectReport r = gpu::bisect(gc.cfg, w, gc.num_blocks, gc.steps,
                                          boundary::plan_preset(e.plan, gc.cfg), e.mutant);
  EXPECT_EQ(r.verdict, e.verdict) << r.summary() << "\n" << r.detail;
  EXPECT_NE(std::find(e.ops.begin(), e.ops.end(), r.op), e.ops.end()) << r.summary() << "\n"
                                                                      << r.detail;
  if (e.verdict == BisectVerdict::boundary) {
    EXPECT_EQ(r.layer, 0) << r.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(Spec, MutantCaught, ::testing::ValuesIn(expectations()),
                         [](const ::testing::TestParamInfo<Expect>& p) {
                           std::string n = p.param.mutant;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Mutants, BisectFindsNothingWithoutAMutant) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase& gc = bait();
  const gpu::BisectReport r =
      gpu::bisect(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps,
                  boundary::plan_preset("narrow", gc.cfg));
  EXPECT_EQ(r.verdict, BisectVerdict::none) << r.summary() << "\n" << r.detail;
}

/// The longest top-k row a case's steps reach, in keys: a request's context after a step (its
/// given prefix and its new tokens so far), from the case's plan alone.
int longest_row(const golden::CaseSpec& c) {
  std::map<int, int> ctx;
  int longest = 0;
  for (const golden::StepPlan& step : c.steps)
    for (const StepRequest& r : step.requests)
      longest = std::max(longest, ctx[r.id] += r.given_prefix + r.q);
  return longest;
}

// The DCP mutants' bait: vLLM's deployed layout, rows whose selected keys straddle every rank
// (past K W keys) and prefills, whose first rows some ranks own nothing of. Without a GPU.
TEST(Mutants, TheDcpBaitHasRowsOnEveryRankAndEmptyRanks) {
  const golden::CaseSpec c = golden::find_case("dcp-bait");
  EXPECT_GT(c.cfg.dcp_size, 1);
  EXPECT_EQ(c.cfg.kv_cache, KvCache::fp8_ds_mla);
  EXPECT_EQ(c.cfg.block_size, 64);
  EXPECT_GT(longest_row(c), c.cfg.index_topk * c.cfg.dcp_size * c.cfg.dcp_interleave);
  EXPECT_GT(c.steps.front().requests.front().q, 1);  // a prefill: its first row is on rank 0
}

TEST(Mutants, EveryBaitIsARegistryCase) {
  for (const boundary::MutantInfo& m : boundary::kMutantTable)
    EXPECT_NO_THROW(golden::find_case(std::string(m.bait))) << m.name;
}

// The size map's mutants (docs/GPU.md) live past a switch: their baits are past it, and no
// committed case (what the plan tests run) and no other mutant's bait is, so none of those shows
// them. Without a GPU: the sizes are the cases'.
TEST(Mutants, TheSizeMapsMutantsLiveOnlyPastTheirSwitch) {
  using boundary::Mutant;
  const auto fp8_tiles = [](const golden::CaseSpec& c) {  // fp8_ds_mla, more than one tile
    return c.cfg.kv_cache == KvCache::fp8_ds_mla && c.cfg.kv_lora_rank > 128;
  };
  const auto past_registers = [](const golden::CaseSpec& c) { return longest_row(c) > 16384; };
  EXPECT_TRUE(fp8_tiles(golden::find_case(std::string(mutant_bait(Mutant::fp8_tile_scale)))));
  EXPECT_TRUE(past_registers(golden::find_case(std::string(mutant_bait(Mutant::topk_long_row)))));
  std::set<std::string> others;
  for (const boundary::MutantInfo& m : boundary::kMutantTable)
    if (m.mutant != Mutant::fp8_tile_scale && m.mutant != Mutant::topk_long_row)
      others.emplace(m.bait);
  for (const golden::CaseSpec& c : golden::registry()) {
    if (!c.committed && !others.contains(c.name)) continue;
    EXPECT_FALSE(fp8_tiles(c)) << c.name;
    EXPECT_FALSE(past_registers(c)) << c.name;
  }
}

TEST(Mutants, UnknownNamesAreRejected) {
  const Config cfg = preset("tiny-fs");
  EXPECT_THROW(boundary::mutate_plan(boundary::plan_preset("narrow", cfg), "no-such-bug"),
               boundary::PlanError);
  EXPECT_THROW(boundary::mutate_plan(boundary::plan_preset("eager", cfg), "capture-host-op"),
               boundary::PlanError);
  EXPECT_EQ(boundary::mutate_plan(boundary::plan_preset("narrow", cfg), "capture-host-op")
                .at(0, Op::sparse_mqa),
            boundary::Placement::graph);
}

}  // namespace
}  // namespace dsv32

// Decode context parallelism on one GPU (MATH.md, "Context-parallel shards"): the ranks emulated
// one after another (each rank's share of the rows, its partial attention, the LSE merge), every
// plan bitwise to eager and eager judged against the DCP oracle. vLLM's deployed layout first
// (fp8_ds_mla, block 64, interleave 1 and 64), then bf16 caches, fp32 precision and other
// interleaves; W = 2, 4, 8; a prefill, a decode beside a chunk (padded), uniform decodes.
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

struct DcpCase {
  const char* name;
  int world, interleave, block;
  KvCache kv;
  Precision precision;
};

golden::CaseSpec spec_of(const DcpCase& c) {
  golden::CaseSpec s;
  s.name = c.name;
  s.cfg = preset("tiny-fs");
  s.cfg.block_size = c.block;
  s.cfg.dcp_size = c.world;
  s.cfg.dcp_interleave = c.interleave;
  s.cfg.kv_cache = c.kv;
  s.cfg.precision = c.precision;
  s.seed = 21;
  s.num_blocks = 8 + 2 * (160 + c.block - 1) / c.block;
  s.dcp_tables = DcpTables::distinct;
  s.steps = {{{{0, 90}}, 0, {}},
             {{{0, 1}, {1, 7}}, 16, {}},
             {{{0, 1}, {1, 1}}, 0, {}},
             {{{0, 1}, {1, 1}}, 4, {}}};
  return s;
}

class GpuDcp : public ::testing::TestWithParam<DcpCase> {};

TEST_P(GpuDcp, EveryPlanGivesEagerBitsAndEagerPassesTheDcpOracle) {
  DSV32_REQUIRE_GPU();
  const golden::GoldenCase gc = golden::generate(spec_of(GetParam()), "test");
  const auto w = std::make_shared<const Weights>(gc.weights);
  EXPECT_EQ(testing::check_plans(gc.cfg, w, gc.num_blocks, gc.steps, boundary::plan_names()), "");
}

// The merged layer is the unsharded layer (MATH.md): eager under DCP, judged against the oracle
// with no DCP (the same weights, steps and tables), passes its gates.
TEST_P(GpuDcp, EagerPassesTheUnshardedOracle) {
  DSV32_REQUIRE_GPU();
  golden::CaseSpec plain = spec_of(GetParam());
  const golden::GoldenCase gc = golden::generate(plain, "test");
  plain.cfg.dcp_size = 1;
  plain.cfg.dcp_interleave = 1;
  const golden::GoldenCase one = golden::generate(plain, "test");
  const std::vector<StepTrace> eager =
      testing::run_plan(gc.cfg, gc.weights, gc.num_blocks, gc.steps, "eager");
  const Judgement j = judge(one.cfg, std::make_shared<const Weights>(one.weights), one.num_blocks,
                            one.steps, eager);
  EXPECT_GT(j.stages, 0);
  EXPECT_TRUE(j.failures.empty()) << j.failures.front() << " (" << j.failures.size()
                                  << " failures)";
}

TEST(GpuDcpRefusal, UnionIsRefusedByName) {
  DSV32_REQUIRE_GPU();
  Config c = preset("tiny-fs");
  c.dcp_size = 2;
  c.dcp_indexer_mode = DcpIndexerMode::union_;
  const Weights w = Weights::generate(c, 1);
  try {
    gpu::Stack s(c, w, 16, 8);
    FAIL() << "a union-mode stack was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("union"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dcp, GpuDcp,
    ::testing::Values(DcpCase{"vllm_fp8_i1_w2", 2, 1, 64, KvCache::fp8_ds_mla, Precision::bf16},
                      DcpCase{"vllm_fp8_i64_w4", 4, 64, 64, KvCache::fp8_ds_mla, Precision::bf16},
                      DcpCase{"vllm_fp8_i1_w8", 8, 1, 64, KvCache::fp8_ds_mla, Precision::bf16},
                      DcpCase{"bf16_i2_w4", 4, 2, 4, KvCache::bf16, Precision::bf16},
                      DcpCase{"fp32_i1_w8", 8, 1, 4, KvCache::bf16, Precision::fp32}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace dsv32

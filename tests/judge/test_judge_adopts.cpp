// What the judge adopts from a candidate it checks first, and what its report says of a failure:
// an fp8_ds_mla cache that holds no codes, a malformed top-k row in an S layer, and the gate
// ratio of a failing stage. Each was a silent pass once (the fp8 and S-layer ones were found
// with DeepSeek's reference code and Hugging Face's layer as candidates).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"
#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "support/golden_cases.hpp"
#include "support/judging.hpp"

namespace dsv32 {
namespace {

using testing::fixture;

using testing::judge_case;
using testing::stage_of;

const Judgement::Row* row_at(const Judgement& j, int step, int layer, const std::string& stage) {
  for (const Judgement::Row& r : j.rows)
    if (r.step == step && r.layer == layer && r.stage == stage) return &r;
  return nullptr;
}

// The oracle's own run of the fp8 case with a bf16 cache (an implementation that never
// quantizes its latent) is off the fp8 golden by less than a quantum in `c`, and the oracle
// once adopted its `c` into the cache: it passed.
TEST(JudgeAdopts, AnUnquantizedFp8CacheFailsAtC) {
  const golden::GoldenCase gc = golden::read(fixture("kv-fp8"));
  ASSERT_EQ(gc.cfg.kv_cache, KvCache::fp8_ds_mla);
  Config bf16 = gc.cfg;
  bf16.kv_cache = KvCache::bf16;
  Oracle run(bf16, std::make_shared<const Weights>(gc.weights), Mode::exact, gc.num_blocks);
  std::vector<StepTrace> cand;
  for (const StepInput& in : gc.steps) cand.push_back(run.step(in));
  const Judgement j = judge_case(gc, cand);
  ASSERT_FALSE(j.failures.empty()) << "a latent that was never quantized passed";
  EXPECT_EQ(j.first_stage, "c") << j.failures.front();
  EXPECT_EQ(j.first_step, 0);
  EXPECT_NE(j.failures.front().find("was the latent quantized"), std::string::npos)
      << j.failures.front();
  EXPECT_TRUE(std::isinf(j.worst)) << j.worst_where;
}

// A NaN the attention wrote in layer 0 reaches layer 1's cache as a value that is no code: the
// judge follows the candidate through layer 0 and names the attention's NaN first, not the
// spoilt cache entry downstream (the DCP mutant dcp-empty-rank-nan was once named as
// norm_rope_cache's).
TEST(JudgeAdopts, AnUpstreamNaNIsNamedBeforeTheCacheEntryItSpoilt) {
  const golden::GoldenCase gc = golden::read(fixture("kv-fp8"));
  ASSERT_GT(gc.cfg.num_layers, 1);
  std::vector<StepTrace> bad = gc.emulated;
  stage_of(bad.at(0).layers.at(0), "olat").data.at(0) = std::nan("");
  stage_of(bad.at(0).layers.at(1), "c").data.at(0) = std::nan("");
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty());
  EXPECT_EQ(j.first_step, 0);
  EXPECT_EQ(j.first_layer, 0) << j.failures.front();
  EXPECT_EQ(j.first_stage, "olat") << j.failures.front();
  // The spoilt entry is still reported, after it.
  EXPECT_TRUE(std::any_of(j.failures.begin(), j.failures.end(), [](const std::string& f) {
    return f.find("step0/layer1/c") != std::string::npos;
  }));
}

// Both tiers' read-back latents are codes times their tile's scale: T0's in fp32, T1's rounded
// to bf16 as a bf16 trace stores them.
TEST(JudgeAdopts, BothTiersReadBackCodes) {
  const golden::GoldenCase gc = golden::read(fixture("kv-fp8"));
  const int L = gc.cfg.kv_lora_rank;
  for (const auto* traces : {&gc.expected, &gc.emulated})
    for (const StepTrace& st : *traces)
      for (const LayerTrace& lt : st.layers) {
        const Tensor& c = lt.at("c");
        for (std::int64_t t = 0; t < c.shape.at(0); ++t) {
          const DsMlaGrid codes = ds_mla_grid({c.data.data() + t * L, std::size_t(L)});
          ASSERT_EQ(codes.off_grid, -1)
              << "row " << t << " value " << c.data[t * L + codes.off_grid];
        }
      }
}

// One value moved a third of the way to its neighbouring code is off the grid.
TEST(JudgeAdopts, AValueBetweenCodesFailsAtC) {
  const golden::GoldenCase gc = golden::read(fixture("kv-fp8"));
  std::vector<StepTrace> bad = gc.expected;
  Tensor& c = stage_of(bad.at(1).layers.at(1), "c");
  const int col = 5;
  double amax = 0.0;
  for (int i = 0; i < kDsMlaTile; ++i) amax = std::max(amax, std::fabs(c.data[i]));
  const double scale = ds_mla_tile_scale(amax);
  c.data[col] += e4m3_quantum(c.data[col] / scale) * scale / 3;
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty()) << "a value between two codes passed";
  EXPECT_EQ(j.first_step, 1);
  EXPECT_EQ(j.first_layer, 1);
  EXPECT_EQ(j.first_stage, "c") << j.failures.front();
}

/// An S layer's first token's row with `entry` written just after its last position, where
/// the row holds a -1 (the set of non-negative entries stays the same or loses nothing).
void plant_in_s_layer(const golden::GoldenCase& gc, std::vector<StepTrace>& cand, int entry,
                      int& layer, int& token) {
  const int K = gc.cfg.index_topk;
  for (int l = 0; l < gc.cfg.num_layers; ++l) {
    if (gc.cfg.is_full_layer(l)) continue;
    Tensor& topk = stage_of(cand[0].layers[l], "topk");
    for (int t = 0; t < gc.steps[0].num_tokens; ++t) {
      const int kt = gc.steps[0].positions[t] + 1;
      if (kt + 1 >= K) continue;
      const int v = entry == -2 ? -2 : static_cast<int>(topk.data[t * K]);
      topk.data[t * K + kt + 1] = v;  // after the -1 at kt
      layer = l;
      token = t;
      return;
    }
  }
  FAIL() << "no S-layer row with room after its last position";
}

TEST(JudgeAdopts, ADuplicateAfterMinusOneInAnSLayerFails) {
  const golden::GoldenCase gc = golden::read(fixture("fs-pattern"));
  std::vector<StepTrace> bad = gc.expected;
  int layer = -1, token = -1;
  plant_in_s_layer(gc, bad, 0, layer, token);
  ASSERT_FALSE(gc.cfg.is_full_layer(layer));
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty()) << "a duplicate after -1 in S layer " << layer << " passed";
  EXPECT_EQ(j.first_stage, "topk");
  EXPECT_EQ(j.first_layer, layer);
  EXPECT_NE(j.failures.front().find("token " + std::to_string(token)), std::string::npos)
      << j.failures.front();
}

TEST(JudgeAdopts, AMinusTwoInAnSLayerFails) {
  const golden::GoldenCase gc = golden::read(fixture("fs-pattern"));
  std::vector<StepTrace> bad = gc.expected;
  int layer = -1, token = -1;
  plant_in_s_layer(gc, bad, -2, layer, token);
  const Judgement j = judge_case(gc, bad);
  ASSERT_FALSE(j.failures.empty()) << "a -2 in S layer " << layer << " passed";
  EXPECT_EQ(j.first_stage, "topk");
  EXPECT_EQ(j.first_layer, layer);
}

/// `cand` with `drop` taken out of layer `layer` of every step and `keep` set to zero there.
std::vector<StepTrace> without(std::vector<StepTrace> cand, int layer,
                               const std::vector<std::string>& drop, const std::string& keep) {
  for (StepTrace& st : cand) {
    auto& ts = st.layers.at(layer).tensors;
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [&](const Tensor& t) {
                              return std::find(drop.begin(), drop.end(), t.name) != drop.end();
                            }),
             ts.end());
    std::fill(stage_of(st.layers.at(layer), keep).data.begin(),
              stage_of(st.layers.at(layer), keep).data.end(), 0.0);
  }
  return cand;
}

// A scale is judged only with its codes. A candidate with kI_scale and no kI8 (or qI_scale
// with neither qI8 nor omega) once had that scale neither judged nor reported: all-zero scales
// passed. Such a candidate is refused naming the stage, as is one with codes and no scale
// (once only "not provided").
TEST(JudgeAdopts, AStageJudgedOnlyWithAnotherIsRefusedWithoutIt) {
  const golden::GoldenCase gc = golden::read(fixture("default"));
  int f = 0;
  while (!gc.cfg.is_full_layer(f)) ++f;
  const std::string at = "step0/layer" + std::to_string(f) + "/";
  const struct {
    std::vector<std::string> drop;
    std::string keep, words;
  } cases[] = {
      {{"kI8"}, "kI_scale", "kI_scale: provided without kI8; a scale is judged with its codes"},
      {{"qI8", "omega"}, "qI_scale", "qI_scale: provided without qI8 and omega"},
      {{"kI_scale"}, "kI8", "kI8: provided without kI_scale"},
      {{"qI_scale"}, "omega", "qI8: provided without qI_scale"},
  };
  for (const auto& c : cases) {
    const std::vector<StepTrace> cand = without(gc.expected, f, c.drop, c.keep);
    try {
      const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks,
                                gc.steps, cand, 1, /*partial=*/true);
      ADD_FAILURE() << c.keep << " without " << c.drop.front() << " was judged: "
                    << (j.failures.empty() ? "pass, " + j.worst_text() : j.failures.front());
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(at + c.words), std::string::npos) << e.what();
    }
  }
  // Given with what it is judged through, a scale is judged: zero scales fail.
  const std::vector<StepTrace> zero = without(gc.expected, f, {}, "kI_scale");
  const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks,
                            gc.steps, zero, 1, /*partial=*/true);
  EXPECT_FALSE(j.failures.empty()) << "zero kI_scale with kI8 passed";
}

// A failing stage reports how far over its gate it is, and the run's worst names it: an output
// element moved far past its gate reports a finite ratio over 1, larger for a larger move.
TEST(JudgeReport, AFailingStageCarriesItsRatioAndIsTheWorst) {
  const golden::GoldenCase gc = golden::read(fixture("default"));
  const int last = static_cast<int>(gc.steps.size()) - 1;
  const Judgement clean = judge_case(gc, gc.expected);
  ASSERT_TRUE(clean.failures.empty());
  const Judgement::Row* r0 = row_at(clean, last, -1, "output");
  ASSERT_NE(r0, nullptr);
  ASSERT_LE(r0->ratio, 1.0);
  double prev = 1.0;
  for (const double move : {6.0, 12.0}) {
    std::vector<StepTrace> bad = gc.expected;
    bad.back().output.data[0] += move;
    const Judgement j = judge_case(gc, bad);
    ASSERT_FALSE(j.failures.empty());
    const Judgement::Row* r = row_at(j, last, -1, "output");
    ASSERT_NE(r, nullptr);
    EXPECT_FALSE(r->pass);
    EXPECT_TRUE(std::isfinite(r->ratio));
    EXPECT_GT(r->ratio, prev) << "a larger error reports a larger ratio";
    prev = r->ratio;
    EXPECT_EQ(j.worst, r->ratio);
    EXPECT_EQ(j.worst_where, "step" + std::to_string(last) + "/output");
  }
}

// A set rule has no finite ratio: a failing top-k set reports +inf, and it is the worst.
TEST(JudgeReport, AFailingSetIsTheWorstAtInfinity) {
  const golden::GoldenCase gc = golden::read(fixture("fs-pattern"));
  std::vector<StepTrace> bad = gc.expected;
  int layer = -1, token = -1;
  plant_in_s_layer(gc, bad, 0, layer, token);
  const Judgement j = judge_case(gc, bad);
  EXPECT_TRUE(std::isinf(j.worst));
  EXPECT_EQ(j.worst_where, "step0/layer" + std::to_string(layer) + "/topk");
  EXPECT_NE(j.worst_text().find("inf"), std::string::npos) << j.worst_text();
}

TEST(JudgeReport, AnExactCandidateSaysSo) {
  Judgement j;
  EXPECT_EQ(j.worst_text(), "every judged stage exact");
}

}  // namespace
}  // namespace dsv32

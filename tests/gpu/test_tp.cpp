// Tensor parallelism without a GPU: merging the ranks' traces (head-split stages joined in rank
// order, replicated stages checked bit for bit) and the refusals of a group that cannot run.
#include <gtest/gtest.h>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/golden_cases.hpp"

namespace dsv32 {
namespace {

/// What rank r of tp holds of a trace: its block of heads of each head-split stage, the rest
/// whole (the inverse of merge_rank_traces).
StepTrace rank_share(const StepTrace& full, int tp, int r) {
  StepTrace out = full;
  for (LayerTrace& lt : out.layers)
    for (Tensor& t : lt.tensors) {
      if (!is_head_split_stage(t.name)) continue;
      const std::int64_t rows = t.shape[0], per = t.numel() / rows / tp;
      std::vector<double> mine;
      for (std::int64_t i = 0; i < rows; ++i)
        mine.insert(mine.end(), t.data.begin() + (i * tp + r) * per,
                    t.data.begin() + (i * tp + r + 1) * per);
      t.data = std::move(mine);
      t.shape[1] /= tp;
    }
  return out;
}

std::vector<StepTrace> shares(const StepTrace& full, int tp) {
  std::vector<StepTrace> out;
  for (int r = 0; r < tp; ++r) out.push_back(rank_share(full, tp, r));
  return out;
}

class TpMerge : public ::testing::Test {
 protected:
  const golden::GoldenCase gc = golden::read(testing::fixture("default"));  // H = 4, F S F
  const StepTrace& full = gc.expected.back();
};

TEST_F(TpMerge, SharesMergeBackToTheWholeTrace) {
  for (int tp : {1, 2, 4}) {
    const StepTrace merged = gpu::merge_rank_traces(gc.cfg, shares(full, tp));
    EXPECT_EQ(first_difference(gc.cfg, {full}, {merged}), "") << "tp " << tp;
  }
}

TEST_F(TpMerge, AReplicatedStageThatDiffersNamesTheRankAndStage) {
  std::vector<StepTrace> ranks = shares(full, 2);
  Tensor& y = const_cast<Tensor&>(ranks[1].layers[1].at("y"));
  y.data[3] = std::nextafter(y.data[3], 1e9);
  try {
    gpu::merge_rank_traces(gc.cfg, ranks);
    FAIL() << "a differing replicated stage merged";
  } catch (const gpu::TpError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 layer1/y"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("differs from rank 0"), std::string::npos) << e.what();
  }
}

TEST_F(TpMerge, ADifferingOutputOrNaNPatternIsCaughtAndEqualNaNsAreNot) {
  std::vector<StepTrace> ranks = shares(full, 2);
  ranks[1].output.data[0] = std::nan("");
  EXPECT_THROW(gpu::merge_rank_traces(gc.cfg, ranks), gpu::TpError);
  ranks[0].output.data[0] = std::nan("");  // the same anomaly on both ranks merges
  EXPECT_TRUE(std::isnan(gpu::merge_rank_traces(gc.cfg, ranks).output.data[0]));
}

/// The message of the TpError that merging `ranks` throws ("" when it merges).
std::string merge_error(const Config& cfg, const std::vector<StepTrace>& ranks) {
  try {
    gpu::merge_rank_traces(cfg, ranks);
  } catch (const gpu::TpError& e) {
    return e.what();
  }
  return "";
}

TEST_F(TpMerge, TracesThatDoNotFitTogetherAreRefused) {
  EXPECT_NE(merge_error(gc.cfg, {}), "");
  EXPECT_NE(merge_error(gc.cfg, {full, full, full}).find("do not divide"), std::string::npos);
  std::vector<StepTrace> missing = shares(full, 2);
  auto& tensors = missing[1].layers[2].tensors;
  const std::string gone = tensors.front().name;
  tensors.erase(tensors.begin());
  EXPECT_NE(merge_error(gc.cfg, missing).find("rank 1 layer2/" + gone + ": stage missing"),
            std::string::npos);
  std::vector<StepTrace> short_rank = shares(full, 2);
  short_rank[1].layers.pop_back();
  EXPECT_NE(merge_error(gc.cfg, short_rank).find("rank 1 traced 2 layers"), std::string::npos);
  std::vector<StepTrace> shape = shares(full, 2);
  Tensor& ql = const_cast<Tensor&>(shape[1].layers[0].at("ql"));
  ql.shape[1] += 1;
  EXPECT_NE(merge_error(gc.cfg, shape).find("rank 1 layer0/ql: shape"), std::string::npos);
}

TEST(TpGroup, RefusesWhatItCannotRun) {
  const golden::GoldenCase gc = golden::read(testing::fixture("default"));  // H = 4
  EXPECT_THROW(gpu::TpGroup(gc.cfg, gc.weights, 3, gc.num_blocks, 8), ConfigError);
  EXPECT_NE(gpu::no_tp_reason(0).find(">= 1"), std::string::npos);
  // no machine has a million GPUs
  EXPECT_NE(gpu::no_tp_reason(1 << 20, gpu::TpTransport::nccl), "");
  // Ranks on one GPU need one GPU, whatever their number.
  EXPECT_EQ(gpu::no_tp_reason(8, gpu::TpTransport::one_gpu), gpu::no_tp_reason(1));
  const std::string why = gpu::no_tp_reason(2, gpu::TpTransport::nccl);
  if (why.empty()) GTEST_SKIP() << "two GPUs are visible: a group of 2 would run over NCCL";
  try {
    gpu::TpGroup group(gc.cfg, gc.weights, 2, gc.num_blocks, 8, {}, gpu::TpTransport::nccl);
    FAIL() << "a group of 2 was built where: " << why;
  } catch (const gpu::TpError& e) {
    EXPECT_EQ(std::string(e.what()), why);
  }
}

}  // namespace
}  // namespace dsv32

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "dsv32/oracle/rope.hpp"

namespace dsv32 {
namespace {

TEST(Yarn, SoftmaxScaleOfDsv32) {
  EXPECT_NEAR(preset("dsv32").softmax_scale(), 0.135233779, 1e-9);
  EXPECT_NEAR(preset("glm52").softmax_scale(), 1.0 / std::sqrt(256.0), 1e-15);
}

TEST(Yarn, Dsv32RampRunsFromDim10To23) {
  // corr(32) = 64 ln(4096 / 64pi) / (2 ln 1e4) = 10.47 -> lo 10; corr(1) = 22.5 -> hi 23.
  const std::vector<double> w = rope_frequencies_fp64(preset("dsv32"));
  ASSERT_EQ(w.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double f = std::pow(10000.0, -2.0 * i / 64.0);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    EXPECT_DOUBLE_EQ(w[i], f * (1 - ramp) + f / 40.0 * ramp) << "i = " << i;
  }
  EXPECT_DOUBLE_EQ(w[0], 1.0);
  EXPECT_DOUBLE_EQ(w[31], std::pow(10000.0, -62.0 / 64.0) / 40.0);
}

TEST(Yarn, TableIsFp32AngleThenFp64CosRounded) {
  const Config cfg = preset("dsv32");
  const Rope table(cfg);
  for (int p : {0, 1, 7, 4095, 4096, 65537, 163839})
    for (int i : {0, 5, 10, 16, 23, 31}) {
      const float w = static_cast<float>(rope_frequencies_fp64(cfg)[i]);
      const float angle = static_cast<float>(p) * w;
      EXPECT_EQ(table.cos(p, i), static_cast<float>(std::cos(static_cast<double>(angle))));
      EXPECT_EQ(table.sin(p, i), static_cast<float>(std::sin(static_cast<double>(angle))));
    }
  // At large positions the fp32 angle visibly departs from the fp64 one (deployed behaviour).
  const double w0 = rope_frequencies_fp64(cfg)[1];
  EXPECT_GT(std::fabs(table.cos(163839, 1) - std::cos(163839.0 * w0)), 1e-4);
}

TEST(Yarn, Bf16TableRoundsCosAndSin) {
  Config cfg = preset("dsv32");
  cfg.rope_table = RopeTable::bf16;
  const Rope bf(cfg);
  cfg.rope_table = RopeTable::fp32;
  const Rope fp(cfg);
  EXPECT_EQ(bf.cos(1000, 3), round_bf16(static_cast<float>(fp.cos(1000, 3))));
  EXPECT_NE(bf.cos(1000, 3), fp.cos(1000, 3));
}

TEST(Rope, LayoutsRotateTheRightPairs) {
  Config cfg = preset("tiny");  // dr = 8
  cfg.rope_scaling.reset();
  const Rope t(cfg);
  std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<double> a = x, b = x;
  t.apply(a, 0, RopeLayout::interleaved);
  EXPECT_EQ(a, x);  // position 0: identity
  t.apply(a, 3, RopeLayout::interleaved);
  const double c0 = t.cos(3, 0), s0 = t.sin(3, 0);
  EXPECT_DOUBLE_EQ(a[0], 1 * c0 - 2 * s0);
  EXPECT_DOUBLE_EQ(a[1], 1 * s0 + 2 * c0);
  t.apply(b, 3, RopeLayout::neox);
  EXPECT_DOUBLE_EQ(b[0], 1 * c0 - 5 * s0);
  EXPECT_DOUBLE_EQ(b[4], 1 * s0 + 5 * c0);
  // Rotations keep the norm of every pair.
  EXPECT_NEAR(a[6] * a[6] + a[7] * a[7], 7 * 7 + 8 * 8, 1e-5);
}

TEST(Hadamard, MatchesSylvesterMatrixAndIsAnInvolution) {
  std::vector<double> x(128), y(128, 0.0);
  const rng::Stream s(1, "hadamard");
  for (int i = 0; i < 128; ++i) x[i] = s.symmetric(i);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j)
      y[i] += ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) * x[j] /
              std::sqrt(128.0);
  std::vector<double> h = x;
  hadamard_transform(h);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(h[i], y[i], 1e-13);
  hadamard_transform(h);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(h[i], x[i], 1e-13);
}

TEST(Config, ValidationNamesTheField) {
  Config c = preset("tiny");
  c.qk_rope_head_dim = 7;
  EXPECT_THROW(
      {
        try {
          c.validate();
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("qk_rope_head_dim"), std::string::npos);
          throw;
        }
      },
      ConfigError);
  c = preset("tiny");
  c.index_head_dim = 64;
  EXPECT_THROW(c.validate(), ConfigError);
  c = preset("tiny");
  c.index_topk = 0;
  EXPECT_THROW(c.validate(), ConfigError);
  c = preset("tiny-fs");
  c.index_topk_pattern = "SFF";
  EXPECT_THROW(c.validate(), ConfigError);
  EXPECT_THROW(preset("nope"), ConfigError);
  EXPECT_THROW(parse_enum<KvCache>("kv_cache", "fp8"), ConfigError);
  EXPECT_EQ(parse_enum<KvCache>("kv_cache", "fp8_ds_mla"), KvCache::fp8_ds_mla);
}

TEST(Config, VllmSkipPattern) {
  EXPECT_EQ(topk_pattern_from_vllm(8, 4, 1), "FSSSFSSS");
  EXPECT_EQ(topk_pattern_from_vllm(6, 2, 2), "FFSFSF");
  EXPECT_EQ(topk_pattern_from_vllm(3, 1, 0), "FFF");
}

}  // namespace
}  // namespace dsv32

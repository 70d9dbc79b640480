#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "dsv32/gpu/device.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "support/gpu.hpp"
#include "support/gpu_probes.hpp"

namespace dsv32 {
namespace {

std::vector<float> probe_values() {
  std::vector<float> xs;
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi)
    for (std::uint32_t lo : lows) xs.push_back(std::bit_cast<float>((hi << 16) | lo));
  const rng::Stream s(9, "gpu-probe");
  for (std::uint64_t i = 0; i < 100000; ++i)
    xs.push_back(
        static_cast<float>(std::ldexp(s.symmetric(i), static_cast<int>(s.below(i + 7, 30)) - 15)));
  return xs;
}

TEST(GpuNumerics, Bf16ConversionIsBitExactWithTheOracle) {
  DSV32_REQUIRE_GPU();
  const std::vector<float> xs = probe_values();
  const std::vector<std::uint16_t> dev = gpu::device_bf16_bits(xs);
  for (std::size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(dev[i], bf16_bits(xs[i]))
        << "x bits 0x" << std::hex << std::bit_cast<std::uint32_t>(xs[i]);
}

TEST(GpuNumerics, E4m3ConversionIsBitExactWithTheOracle) {
  DSV32_REQUIRE_GPU();
  const std::vector<float> xs = probe_values();
  const std::vector<std::uint8_t> dev = gpu::device_e4m3_bits(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (std::isnan(xs[i])) {
      ASSERT_EQ(dev[i] & 0x7F, 0x7F) << "NaN must stay NaN";
      continue;
    }
    ASSERT_EQ(dev[i], e4m3_bits(xs[i])) << "x = " << xs[i];
  }
}

// indexer_topk picks one of two score kernels by how many blocks a step has; a key's score must
// not depend on which (a plan or a batch size would otherwise change the top-k sets).
TEST(GpuNumerics, BothIndexScoreKernelsGiveTheSameBits) {
  DSV32_REQUIRE_GPU();
  for (int heads : {1, 3, 8, 64})
    for (int keys : {1, 31, 200, 4099})
      EXPECT_EQ(gpu::index_score_kernels_disagree(heads, keys, 7), "")
          << heads << " heads, " << keys << " keys";
}

// The tensor-core score kernel sums in the tensor cores' order, the others sequentially: each
// must stay within the accumulation bound the top-k judge grants (a kernel outside it could
// pick a set the judge rejects on a near tie).
TEST(GpuNumerics, IndexScoresWithinTheirAccumulationBound) {
  DSV32_REQUIRE_GPU();
  for (int heads : {1, 3, 16, 17, 64})
    for (int keys : {1, 31, 200, 4099})
      for (std::uint64_t seed : {7u, 8u})
        EXPECT_EQ(gpu::index_scores_off_bound(heads, keys, seed), "")
            << heads << " heads, " << keys << " keys, seed " << seed;
}

// At prefill sizes a tensor-core score block takes several tokens (the keys staged once per
// request): a score's bits must not depend on how tokens were grouped (T_a picks the grouping,
// and the plans compare bitwise).
TEST(GpuNumerics, IndexScoresDoNotDependOnTokensPerBlock) {
  DSV32_REQUIRE_GPU();
  for (int tokens : {1, 7, 40})
    for (int keys : {2, 100, 1000})
      EXPECT_EQ(gpu::index_scores_blocking_disagrees(tokens, keys, 3), "")
          << tokens << " tokens, " << keys << " keys";
}

// indexer_topk's selection against the host's exact set, directly (the plan tests see it
// through the judge, which allows near-ties): rows shorter than K (the 0..p path), just over K,
// many keys per thread (past the short path's registers), heavy ties (the smaller position must
// win; a crowded threshold bin: the radix passes within it), both signs with +0 and -0,
// outliers and infinities, for the select with bins (its short path up to 16384 keys and the
// general one) and the radix one alone.
TEST(GpuNumerics, TopkSelectGivesTheExactSet) {
  DSV32_REQUIRE_GPU();
  const std::vector<int> lengths = {8192, 2049, 100, 5000, 2048, 40000, 2051, 7, 16384, 16385};
  for (int levels : {0, 1, 3, 1000, -1, -2, -3})
    for (std::uint64_t seed : {1u, 2u}) {
      EXPECT_EQ(gpu::topk_select_off(2048, lengths, levels, seed), "")
          << "K 2048, levels " << levels << ", seed " << seed;
      EXPECT_EQ(gpu::topk_select_off(64, {300, 65, 64, 1, 129}, levels, seed), "")
          << "K 64, levels " << levels << ", seed " << seed;
    }
}

}  // namespace
}  // namespace dsv32

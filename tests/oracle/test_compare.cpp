#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32 {
namespace {

Tensor random_tensor(const char* name, int n, std::uint64_t seed, double scale = 1.0) {
  const rng::Stream s(seed, name);
  std::vector<double> d(n);
  for (int i = 0; i < n; ++i) d[i] = scale * s.symmetric(i);
  return Tensor::from(name, {n}, d, DType::float64);
}

Tensor rounded(Tensor t, DType dt) {
  for (double& v : t.data) v = round_to(dt, v);
  return t;
}

TEST(Compare, Bf16GatePassesRoundingAndFailsABug) {
  const Tensor t0 = random_tensor("y", 4096, 1);
  const Tensor t1 = rounded(t0, DType::bfloat16);
  EXPECT_TRUE(compare_bf16(t1, t0, t1, DType::bfloat16).pass);
  Tensor bug = t1;
  bug.data[1234] += 0.05;
  const CompareResult r = compare_bf16(bug, t0, t1, DType::bfloat16);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.first_bad, 1234);
  EXPECT_EQ(r.count_over, 1);
  EXPECT_NE(r.summary().find("first bad flat 1234"), std::string::npos);
}

// A stage stored in fp32 (lse) whose T1 noise in this step is small by chance: the run's spread
// (diff_traces passes the stage's largest T1 - T0 over the steps) sets the gate, and the rule
// says so; a real error still fails, and a step's own larger spread still wins.
TEST(Compare, Bf16GateTakesTheRunSpreadWhereItIsLarger) {
  const Tensor t0 = random_tensor("lse", 4, 5, 2.0);
  Tensor t1 = t0, got = t0;
  for (double& v : t1.data) v += 1e-4;
  for (double& v : got.data) v -= 3e-4;  // 3x this step's spread: over its own gate
  const CompareResult own = compare_bf16(got, t0, t1, DType::float32);
  EXPECT_FALSE(own.pass);
  const CompareResult run = compare_bf16(got, t0, t1, DType::float32, DType::bfloat16, 2e-4);
  EXPECT_TRUE(run.pass) << run.summary();
  EXPECT_NE(run.rule.find("over the run"), std::string::npos);
  EXPECT_NEAR(run.tol, 4e-4, 1e-6);
  Tensor bug = got;
  bug.data[2] += 0.01;
  EXPECT_FALSE(compare_bf16(bug, t0, t1, DType::float32, DType::bfloat16, 2e-4).pass);
  const CompareResult smaller = compare_bf16(got, t0, t1, DType::float32, DType::bfloat16, 5e-5);
  EXPECT_FALSE(smaller.pass);
  EXPECT_EQ(smaller.rule.find("over the run"), std::string::npos);
  // A huge run spread widens the gate up to the vacuity cap, not past it (no refusal).
  const CompareResult capped = compare_bf16(got, t0, t1, DType::float32, DType::bfloat16, 10.0);
  EXPECT_FALSE(capped.refused) << capped.summary();
  EXPECT_DOUBLE_EQ(capped.tol, vacuity_cap(t0, DType::bfloat16));
}

TEST(Compare, NanNeverPasses) {
  const Tensor t0 = random_tensor("y", 256, 2);
  Tensor got = t0;
  got.data[7] = std::nan("");
  EXPECT_FALSE(compare_bf16(got, t0, t0, DType::bfloat16).pass);
  EXPECT_FALSE(compare_fp32(got, t0, 64).pass);
  EXPECT_FALSE(compare_abs(got, t0, 1e9).pass);
  // The same anomaly at the same place in both is not a mismatch.
  Tensor both = t0;
  both.data[7] = std::nan("");
  EXPECT_TRUE(compare_abs(both, both, 0.0).pass);
}

TEST(Compare, Fp8CacheEntriesAllowOneQuantumAtTheTileScale) {
  // Two rows of a 256-wide latent (two 128-column tiles), as an fp8_ds_mla cache holds it:
  // codes times a tile scale amax / 448.
  const int cols = 256;
  std::vector<double> v(2 * cols);
  const rng::Stream s(5, "c");
  for (int i = 0; i < 2 * cols; ++i) v[i] = s.symmetric(i);
  Tensor t0 = Tensor::from("c", {2, cols}, v, DType::bfloat16);
  std::vector<double> scale(4);
  for (int b = 0; b < 4; ++b) {
    double amax = 0;
    for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[b * 128 + i]));
    scale[b] = amax / kE4m3Max;
    for (int i = 0; i < 128; ++i)
      t0.data[b * 128 + i] = round_e4m3(v[b * 128 + i] / scale[b]) * scale[b];
  }
  const int k = 300;  // tile 2
  const double q = e4m3_quantum(std::fabs(t0.data[k]) / scale[2]) * scale[2];
  Tensor flipped = t0;
  flipped.data[k] += q;  // the neighbouring code
  EXPECT_TRUE(compare_fp8_cache(flipped, t0, t0, 128).pass);
  Tensor two = t0;
  two.data[k] += 2 * q;
  const CompareResult r = compare_fp8_cache(two, t0, t0, 128);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.first_bad, k);
  // A T1 spread in the tile widens it by twice the spread.
  Tensor t1 = t0;
  t1.data[k + 1] += q;
  EXPECT_TRUE(compare_fp8_cache(two, t0, t1, 128).pass);
  Tensor nan = t0;
  nan.data[7] = std::nan("");
  EXPECT_FALSE(compare_fp8_cache(nan, t0, t0, 128).pass);
}

TEST(Compare, Fp8CacheAllowsTheCandidatesOwnTileScale) {
  // fp32 precision (T1 = T0): a candidate whose tile amax came out one part in 10^7 larger
  // quantizes on a grid that much coarser; a code that flips at a rounding boundary then
  // differs by a hair over one quantum at T0's scale (GpuPlanProperty found 1 + 1e-7). The
  // fp32 bound of the norm's reduction admits it; two quanta still fail.
  const int cols = 256;
  const rng::Stream s(7, "c");
  std::vector<double> v(cols);
  for (int i = 0; i < cols; ++i) v[i] = s.symmetric(i);
  Tensor t0 = Tensor::from("c", {1, cols}, v, DType::bfloat16);
  double amax = 0;
  for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(v[i]));
  const double scale = amax / kE4m3Max, theirs = scale * (1 + 1e-7);
  const int k = 5;
  const double code = round_e4m3(v[k] / scale), q = e4m3_quantum(std::fabs(code)) * scale;
  Tensor got = t0;
  for (int i = 0; i < 128; ++i) {
    t0.data[i] = round_e4m3(v[i] / scale) * scale;
    got.data[i] = round_e4m3(v[i] / scale) * theirs;
  }
  got.data[k] = (code + (code >= 0 ? 1 : -1) * q / scale) * theirs;  // the neighbouring code
  ASSERT_GT(std::fabs(got.data[k] - t0.data[k]), q);
  EXPECT_FALSE(compare_fp8_cache(got, t0, t0, 128).pass);
  const double rel = 2 * gamma_fp32(cols);
  EXPECT_TRUE(compare_fp8_cache(got, t0, t0, 128, rel).pass);
  Tensor two = got;
  two.data[k] += (code >= 0 ? 1 : -1) * q;
  EXPECT_FALSE(compare_fp8_cache(two, t0, t0, 128, rel).pass);
}

TEST(Compare, Fp8CacheStepsUpFromABinadesBottomByItsQuantum) {
  // GpuPlanStateful (L = 10, bf16): T0's code 64 (a binade's bottom) against the
  // GPU's 72, one code up, the value before quantizing near their midpoint 68. T1's tile amax
  // came out a little larger than T0's, so 64 on T0's scale read 63.9 on the tile scale, whose
  // quantum there (4) is half the step actually taken.
  const int cols = 10;
  std::vector<double> codes = {448, 64, -64, 3, 100, -20, 7.5, 0.25, -448, 12};
  const double scale0 = 3.5 / kE4m3Max;
  std::vector<double> v(cols);
  for (int i = 0; i < cols; ++i) v[i] = codes[i] * scale0;
  const Tensor t0 = Tensor::from("c", {1, cols}, v, DType::bfloat16);
  Tensor t1 = t0;
  t1.data[0] *= 1 + 0x1p-9;  // T1's amax (so the tile scale) a bit larger; spread 3.5 * 2^-9
  const int k = 1;
  Tensor up = t0;
  up.data[k] = 72 * scale0;  // the neighbouring code above 64
  EXPECT_TRUE(compare_fp8_cache(up, t0, t1, cols).pass);
  Tensor down = t0;
  down.data[k] = 60 * scale0;  // the neighbouring code below
  EXPECT_TRUE(compare_fp8_cache(down, t0, t1, cols).pass);
  Tensor two = t0;
  two.data[k] = 80 * scale0;  // two codes up
  const CompareResult r = compare_fp8_cache(two, t0, t1, cols);
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.first_bad, k);
  Tensor two_down = t0;
  two_down.data[k] = 56 * scale0;  // two codes down
  EXPECT_FALSE(compare_fp8_cache(two_down, t0, t1, cols).pass);
}

TEST(Compare, Fp8CacheTakesTheRunsSpreadAsTheTilesFloor) {
  // GpuPlanStateful, plan narrow (L = 10, bf16, fp8 cache, step 5 of 6, layer 1): one latent
  // value cancelled in its projection (T0 -0.034 with the row's amax 1.9), the GPU 3 quanta
  // from T0 while that row's T1 - T0 spread was a fraction of a quantum; the run's spread for
  // the stage (another row's 0.06) is the noise T1 shows, and the floor of every tile's.
  const int cols = 10;
  const std::vector<double> codes = {448, 64, -64, 3, 100, -20, 8, 0.25, -448, 12};
  const double scale = 1.9 / kE4m3Max;
  std::vector<double> v(cols);
  for (int i = 0; i < cols; ++i) v[i] = codes[i] * scale;
  const Tensor t0 = Tensor::from("c", {1, cols}, v, DType::bfloat16);
  Tensor t1 = t0;
  t1.data[6] += 0.25 * scale;  // the row's own spread: a quarter of a quantum at code 8
  Tensor got = t0;
  got.data[6] = 11 * scale;  // three codes up from 8
  EXPECT_FALSE(compare_fp8_cache(got, t0, t1, cols).pass);
  const double run_spread = 0.06;  // 14 quanta at code 8: 2x covers three codes
  EXPECT_TRUE(compare_fp8_cache(got, t0, t1, cols, 0.0, run_spread).pass);
  Tensor far = t0;
  far.data[6] = 8 * scale + 2 * run_spread + 2 * scale;  // two quanta past the widened slack
  EXPECT_FALSE(compare_fp8_cache(far, t0, t1, cols, 0.0, run_spread).pass);
  Tensor nan = t0;
  nan.data[6] = std::nan("");
  EXPECT_FALSE(compare_fp8_cache(nan, t0, t1, cols, 0.0, run_spread).pass);
}

TEST(Compare, Fp8CacheStepsUpFromABinadesBottomRoundedToFp32) {
  // GpuPlanProperty (L = 8 and 14): T0's code 64 against the GPU's 72 (and 2 against
  // 2.25), T1 = T0. T0's values are codes times the tile scale rounded to fp32, so the scale the
  // comparer recovers (amax / 448, amax = fp32(448 s)) can exceed s by up to 2^-24 and 64 s
  // read 64 (1 - 2^-24) on it: the quantum below the binade (4), half the step taken.
  float s = 3.5f / 448.f;
  while (static_cast<double>(static_cast<float>(448.0 * s)) <= 448.0 * s)  // amax rounds up
    s = std::nextafter(s, 1.f);
  const std::vector<double> codes = {448, 64, -64, 3, 2, -20, 7.5, 0.25};
  const int cols = static_cast<int>(codes.size());
  std::vector<double> v(cols);
  for (int i = 0; i < cols; ++i) v[i] = static_cast<float>(codes[i] * s);
  const Tensor t0 = Tensor::from("c", {1, cols}, v, DType::float32);
  ASSERT_LT(std::fabs(t0.data[1]) / (std::fabs(t0.data[0]) / kE4m3Max), 64.0);
  for (const auto& [k, up, two] : {std::tuple{1, 72.0, 80.0}, std::tuple{4, 2.25, 2.5}}) {
    Tensor got = t0;
    got.data[k] = static_cast<float>(up * s);  // the neighbouring code above
    EXPECT_TRUE(compare_fp8_cache(got, t0, t0, cols).pass) << "code " << codes[k];
    got.data[k] = static_cast<float>(two * s);  // two codes up
    const CompareResult r = compare_fp8_cache(got, t0, t0, cols);
    EXPECT_FALSE(r.pass) << "code " << codes[k];
    EXPECT_EQ(r.first_bad, k);
  }
}

// Any tile of codes times an fp32 scale, read back in fp32 as T0 is (MATH.md section 4): one
// code either way at any entry passes with the slack trace_diff gives it (the fp32 bound of the
// norm), three codes' steps fail. The two cases above are instances; this covers every code.
RC_GTEST_PROP(CompareProperty, Fp8CacheTakesOneCodeAndRejectsThreeSteps, ()) {
  const int n = *rc::gen::inRange(2, 17);
  const int e = *rc::gen::inRange(-20, 8);
  const float s = std::ldexp(1.f + static_cast<float>(*rc::gen::inRange(0, 1 << 23)) * 0x1p-23f, e);
  std::vector<double> codes(n);
  codes[0] = kE4m3Max;  // the tile's amax
  for (int i = 1; i < n; ++i)
    codes[i] = (*rc::gen::arbitrary<bool>() ? -1 : 1) *
               e4m3_value(static_cast<std::uint8_t>(*rc::gen::inRange(0, 0x7F)));
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(codes[i] * s);
  const Tensor t0 = Tensor::from("c", {1, n}, v, DType::float32);
  const int k = *rc::gen::inRange(1, n);
  const double c = codes[k], sign = c < 0 ? -1 : 1;
  const int bits = e4m3_bits(std::fabs(c));
  const bool up = bits == 0 || (bits < 0x7E && *rc::gen::arbitrary<bool>());
  const double next = sign * e4m3_value(static_cast<std::uint8_t>(up ? bits + 1 : bits - 1));
  const double rel = 2.0 * gamma_fp32(n);
  Tensor got = t0;
  got.data[k] = static_cast<float>(next * s);
  RC_LOG() << "s " << s << " code " << c << " -> " << next << "\n";
  RC_ASSERT(compare_fp8_cache(got, t0, t0, n, rel).pass);
  const double step = e4m3_quantum(std::fabs(c) * (1 + 0x1p-10));  // the larger neighbour step
  got.data[k] = static_cast<float>((c + sign * 3 * step) * s);
  const CompareResult r = compare_fp8_cache(got, t0, t0, n, rel);
  RC_ASSERT(!r.pass);
  RC_ASSERT(r.first_bad == k);
}

TEST(Compare, VacuousGatesAreRefused) {
  const Tensor t0 = random_tensor("y", 256, 3);
  const Tensor far = random_tensor("y", 256, 4);  // unrelated "T1": 2 max|T1-T0| ~ 4
  const CompareResult r = compare_bf16(t0, t0, far, DType::bfloat16);
  EXPECT_TRUE(r.refused);
  EXPECT_FALSE(r.pass);
  const Tensor zero = Tensor::from("z", {4}, {0, 0, 0, 0}, DType::float64);
  EXPECT_TRUE(compare_fp32(zero, zero, 16).refused);
  EXPECT_TRUE(compare_abs(random_tensor("y", 3, 1), t0, 0).refused);  // shape mismatch
}

TEST(Compare, Fp32GateUsesGammaOfItsDotLength) {
  EXPECT_NEAR(gamma_fp32(1024), 1024 * 0x1p-24 / (1 - 1024 * 0x1p-24), 1e-18);
  const Tensor t0 = random_tensor("y", 1000, 5);
  const Tensor f = rounded(t0, DType::float32);
  EXPECT_TRUE(compare_fp32(f, t0, 64).pass);
  Tensor off = f;
  off.data[3] *= 1 + 1e-4;
  EXPECT_FALSE(compare_fp32(off, t0, 64).pass);
}

TEST(Compare, Fp32GateOfACancelledStepTakesTheStagesRunScale) {
  // One value far below its stage's usual magnitude (terms that cancelled): its fp32 error is
  // the terms', judged at the run's scale; at its own scale the same error would fail.
  const Tensor t0 = Tensor::from("omega", {1}, {-8.96543e-05}, DType::float32);
  const Tensor got = Tensor::from("omega", {1}, {-8.96595e-05}, DType::float32);
  EXPECT_FALSE(compare_fp32(got, t0, 193).pass);
  EXPECT_TRUE(compare_fp32(got, t0, 193, 0.05).pass);
  EXPECT_FALSE(compare_fp32(got, t0, 193, 0.0001).pass);  // the run's scale still bounds it
}

TEST(Compare, QuantizedValuesWithinOneQuantumAndLegalScaleFlips) {
  // Two blocks of 4: same scales, one element off by one code.
  const Tensor vals =
      Tensor::from("kI8", {2, 4}, {1, 2, 3, 448, -4, 5, 6, 6.5}, DType::float8_e4m3fn);
  const Tensor sc = Tensor::from("kI_scale", {2}, {0.25, 0.5}, DType::float32);
  Tensor v2 = vals;
  v2.data[5] = 5.5;  // adjacent e4m3 code
  EXPECT_TRUE(compare_quantized(v2, sc, vals, sc, 4).pass);
  v2.data[5] = 6.5;  // two codes away
  EXPECT_FALSE(compare_quantized(v2, sc, vals, sc, 4).pass);
  // Block 0 amax = 448 * 0.25 = 112 = 448 * 2^-2: a power-of-two boundary, a 2x flip is legal.
  const Tensor sc2 = Tensor::from("kI_scale", {2}, {0.5, 0.5}, DType::float32);
  const Tensor half =
      Tensor::from("kI8", {2, 4}, {0.5, 1, 1.5, 224, -4, 5, 6, 6.5}, DType::float8_e4m3fn);
  const CompareResult r = compare_quantized(half, sc2, vals, sc, 4);
  EXPECT_TRUE(r.pass) << r.summary();
  EXPECT_NE(r.note.find("2x"), std::string::npos);
  // Block 1 amax = 6.5 * 0.5: no boundary, a 2x flip is illegal.
  const Tensor sc3 = Tensor::from("kI_scale", {2}, {0.25, 1.0}, DType::float32);
  const Tensor v3 =
      Tensor::from("kI8", {2, 4}, {1, 2, 3, 448, -2, 2.5, 3, 3.25}, DType::float8_e4m3fn);
  EXPECT_FALSE(compare_quantized(v3, sc3, vals, sc, 4).pass);
}

TEST(Compare, QuantizedGateWidensByTheBlocksT1Spread) {
  const Tensor t0 = Tensor::from("qI8", {1, 4}, {0.5, -2, 3, 448}, DType::float8_e4m3fn);
  const Tensor sc = Tensor::from("qI_scale", {1}, {1.0}, DType::float32);
  Tensor got = t0;
  got.data[0] = 1.0;  // 0.5 off: more than a quantum (0.0625) at 0.5
  EXPECT_FALSE(compare_quantized(got, sc, t0, sc, 4).pass);
  Tensor t1 = t0;
  t1.data[1] = -2.25;  // T1 itself sits 0.25 from T0 in this block: 2 * 0.25 + quantum covers 0.5
  EXPECT_TRUE(compare_quantized(got, sc, t0, sc, 4, &t1, &sc).pass);
  got.data[0] = 1.5;  // 1.0 off: beyond the widened gate
  EXPECT_FALSE(compare_quantized(got, sc, t0, sc, 4, &t1, &sc).pass);
}

TEST(TopkCheck, AcceptsValidRowsAndNamesWhatIsWrong) {
  const std::vector<double> s{0.1, 0.9, 0.5, 0.7, 0.2};
  EXPECT_NE(check_topk_row({1, 0, -1}, {0.1, 0.9}, 3, 0).find("in order"), std::string::npos);
  EXPECT_EQ(check_topk_row({0, 1, -1}, {0.1, 0.9}, 3, 0), "");
  EXPECT_EQ(check_topk_row({3, 1}, s, 2, 0), "");
  EXPECT_NE(check_topk_row({1, 2}, s, 2, 0).find("worse than unchosen 3"), std::string::npos);
  EXPECT_EQ(check_topk_row({1, 2}, s, 2, 0.25), "");  // within eps: a legal near-tie swap
  EXPECT_NE(check_topk_row({1, 1}, s, 2, 0).find("twice"), std::string::npos);
  EXPECT_NE(check_topk_row({1, 7}, s, 2, 0).find("outside"), std::string::npos);
  EXPECT_NE(check_topk_row({0, 1, 5}, {0.1, 0.9}, 3, 0).find("expected -1"), std::string::npos);
}

}  // namespace
}  // namespace dsv32

// The gates of TESTING.md under NaN and Inf (docs/BAD_INPUT.md): a property over every place
// and kind of non-finite value, and the exhaustive table of them.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dsv32/oracle/compare.hpp"

namespace dsv32 {
namespace {

// --- gates: never infinite, never NaN (docs/BAD_INPUT.md) --------------------------------------

/// One NaN or Inf placed in T0, T1, a scale or the candidate of every gate of TESTING.md: the gate
/// is refused (never passing) when a reference holds it, and a candidate's fails; otherwise the
/// gate is finite. One Inf in a reference once turned a gate off (tolerance and cap infinite).
std::string check_gates_stay_finite(int rows, int cols, const std::vector<int>& ints, int where,
                                    int which, std::size_t at) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const auto tensor = [&](const char* name, int offset) {
    Tensor t;
    t.name = name;
    t.shape = {rows, cols};
    for (std::size_t i = 0; i < n; ++i)
      t.data.push_back((ints[(i + offset) % ints.size()] + (i % 5 == 0 ? 1 : 0)) / 64.0);
    return t;
  };
  Tensor t0 = tensor("t0", 0), t1 = tensor("t1", 1), got = tensor("got", 2);
  Tensor s0, s1, sg;
  for (Tensor* s : {&s0, &s1, &sg}) {
    s->name = "scale";
    s->shape = {rows};
    s->data.assign(static_cast<std::size_t>(rows), 0.25);
  }
  const double bad[] = {std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::quiet_NaN()};
  const double v = bad[which % 3];
  // where: 0 none, 1 T0, 2 T1, 3 candidate, 4 T0's scale
  Tensor* target = where == 1   ? &t0
                   : where == 2 ? &t1
                   : where == 3 ? &got
                   : where == 4 ? &s0
                                : nullptr;
  if (target) target->data[at % target->data.size()] = v;
  const std::vector<std::pair<std::string, CompareResult>> results = {
      {"bf16", compare_bf16(got, t0, t1, DType::bfloat16)},
      {"bf16 run spread", compare_bf16(got, t0, t1, DType::float32, DType::bfloat16, 1e300)},
      {"fp32", compare_fp32(got, t0, 64, 1e300)},
      {"quantized", compare_quantized(got, sg, t0, s0, cols, &t1, &s1)},
      {"fp8 cache", compare_fp8_cache(got, t0, t1, cols)}};
  for (const auto& [name, r] : results) {
    // The references each gate reads: T0 always, T1 but in fp32, the scales in quantized.
    const bool reads =
        where == 1 || (where == 2 && name != "fp32") || (where == 4 && name == "quantized");
    if (!r.refused && !std::isfinite(r.tol)) return name + ": a gate of " + std::to_string(r.tol);
    if (reads && (r.pass || !r.refused))
      return name + ": a poisoned reference was not refused: " + r.summary();
    if (where == 3 && r.pass)
      return name + ": a candidate holding " + std::to_string(v) + " passed: " + r.summary();
  }
  return "";
}

RC_GTEST_PROP(GateProperty, NoNanOrInfMakesAGateInfiniteOrPassing, ()) {
  const int rows = *rc::gen::inRange(1, 5), cols = *rc::gen::inRange(1, 9);
  const auto ints =
      *rc::gen::nonEmpty(rc::gen::container<std::vector<int>>(rc::gen::inRange(-900, 900)));
  RC_ASSERT(check_gates_stay_finite(rows, cols, ints, *rc::gen::inRange(0, 5),
                                    *rc::gen::inRange(0, 3),
                                    *rc::gen::inRange<std::size_t>(0, 64)) == "");
}

TEST(GateProperty, EveryPlaceAndKindOfNanOrInfIsRefusedOrFails) {
  // Every place (T0, T1, the candidate, a scale) and kind (+Inf, -Inf, NaN) once, and no poison.
  const std::vector<int> ints{3, -7, 11, 64, -200, 5};
  EXPECT_EQ(check_gates_stay_finite(2, 4, ints, 0, 0, 0), "");
  for (int where = 1; where <= 4; ++where)
    for (int which = 0; which < 3; ++which)
      EXPECT_EQ(check_gates_stay_finite(2, 4, ints, where, which, 5), "") << where << " " << which;
}

}  // namespace
}  // namespace dsv32

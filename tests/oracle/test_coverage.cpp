// Coverage (docs/COVERAGE.md): what a run exercised, on tiny rows whose answers are known by
// hand, and the requirements that turn a claim into a check.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/oracle/coverage.hpp"

namespace dsv32 {
namespace {

TEST(Coverage, ARowWithinKIsScoredButNotPruned) {
  Coverage c;
  c.add_scores({3, 1, 2}, 8);
  EXPECT_EQ(c.scored, 1);
  EXPECT_EQ(c.pruned, 0);
  EXPECT_EQ(c.ties, 0);
  EXPECT_EQ(c.max_keys, 3);
}

TEST(Coverage, ATieGroupStraddlingTheCutIsCounted) {
  Coverage c;
  c.add_scores({5, 4, 4, 4, 1}, 2);  // the 2nd score, 4, is shared by three keys: one fits
  EXPECT_EQ(c.pruned, 1);
  EXPECT_EQ(c.ties, 1);
  EXPECT_EQ(c.largest_tie, 3);
}

TEST(Coverage, ATieGroupThatFitsWhollyIsNoTie) {
  Coverage c;
  c.add_scores({5, 4, 4, 1}, 3);  // both 4s are in: the tie rule decides nothing
  c.add_scores({5, 4, 3, 2}, 2);
  EXPECT_EQ(c.pruned, 2);
  EXPECT_EQ(c.ties, 0);
  EXPECT_EQ(c.largest_tie, 0);
}

TEST(Coverage, CoarseBinsAreSignExponentAndThreeMantissaBits) {
  Coverage c;
  c.add_scores({1.0, 1.01, 1.1, 1.2, -1.0, 100.0}, 8);  // [1, 1.125) shares a bin; 1.2 does not
  EXPECT_EQ(c.largest_bin, 3);
}

TEST(Coverage, StepsCountPaddedMultiTokenAndLongContextRows) {
  StepInput in;
  in.requests = {{0, 20, 1, {}}, {1, 5, 3, {}}, {2, 0, 4, {}}};
  in.num_tokens = 8;
  in.capture_size = 16;
  Coverage c;
  c.add_step(in, 8);
  EXPECT_EQ(c.rows, 8);
  EXPECT_EQ(c.padded, 8);
  EXPECT_EQ(c.multi_token, 3);  // request 1: three new tokens after a context; 2 is a prefill
  EXPECT_EQ(c.over_k, 1);       // request 0's context of 20 exceeds K = 8
}

TEST(Coverage, RowsAtTheShortcutsEdgeAreCounted) {
  Coverage c;
  for (const int n : {6, 7, 8, 9, 10}) c.add_scores(std::vector<double>(n, 1.0), 8);
  EXPECT_EQ(c.k_edge, 3);  // 7, 8 and 9 candidates: K - 1, K and K + 1
}

TEST(Coverage, ABlockServingASecondRequestIsReused) {
  StepInput a, b;
  a.requests = {{0, 0, 4, {3, 7}}, {1, 0, 2, {5}}};
  b.requests = {{1, 2, 1, {5}}, {2, 0, 3, {7, -1}}};  // -1: a golden's table padding
  Coverage c;
  c.add_step(a, 8);
  c.add_step(b, 8);
  EXPECT_EQ(c.reused_blocks, 1);  // block 7, request 0's, now request 2's; 5 stays request 1's
}

TEST(Coverage, MergeAddsCountsAndKeepsLargest) {
  Coverage a, b;
  a.add_scores({5, 4, 4, 4, 1}, 2);
  b.add_scores({2, 2, 1}, 1);
  a.merge(b);
  EXPECT_EQ(a.scored, 2);
  EXPECT_EQ(a.ties, 2);
  EXPECT_EQ(a.largest_tie, 3);
}

TEST(Requirement, AShareOrACountIsCheckedWithTheNumbersInTheMessage) {
  Coverage c;
  c.add_scores({5, 4, 3}, 2);
  c.add_scores({1, 2}, 2);
  EXPECT_EQ(Requirement::parse("pruned>=50%").check(c), "");
  EXPECT_EQ(Requirement::parse("pruned>=1").check(c), "");
  EXPECT_EQ(Requirement::parse("ties==0").check(c), "");
  EXPECT_EQ(Requirement::parse("pruned>60%").check(c), "pruned>60%: pruned is 1 of 2 (50%)");
  EXPECT_EQ(Requirement::parse("largest_tie>=2").check(c), "largest_tie>=2: largest_tie is 0");
}

TEST(Requirement, ABadRequirementIsRefusedNamingThePart) {
  const auto why = [](const std::string& text) {
    try {
      Requirement::parse(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(why("pruned"), "pruned: give METRIC OP VALUE, e.g. pruned>=50%");
  EXPECT_NE(why("prune>=1").find("no metric prune (rows, padded,"), std::string::npos);
  EXPECT_EQ(why("pruned=>1"), "pruned=>1: comparison => (one of >=, >, <=, <, ==)");
  EXPECT_EQ(why("largest_tie>=5%"),
            "largest_tie>=5%: largest_tie is a count, not a share (give a number)");
  EXPECT_EQ(why("pruned>=150%"), "pruned>=150%: value 150 (a percentage, 0..100)");
  EXPECT_EQ(why("pruned>=x"), "pruned>=x: value x (a count >= 0)");
  EXPECT_EQ(why("pruned>=nan"), "pruned>=nan: value nan (a count >= 0)");
}

}  // namespace
}  // namespace dsv32

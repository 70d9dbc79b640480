// Judging a DCP candidate's ranks (diff_dcp): the oracle's own emulated ranks pass, and each
// field class of MATH.md's DCP faults fails with its name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dsv32/oracle/trace_diff.hpp"
#include "support/runs.hpp"

namespace dsv32 {
namespace {

/// T0, T1 (following T0's rows) and the steps of a DCP case with a decode past K, a prefill
/// and a short request (rows some ranks own nothing of).
struct Case {
  Config cfg;
  std::vector<StepInput> steps;
  std::vector<StepTrace> t0, t1;
};

Case make(Precision p, DcpIndexerMode mode = DcpIndexerMode::exact,
          DcpTables tables = DcpTables::distinct) {
  Case c;
  c.cfg = preset("tiny-fs");
  c.cfg.num_heads = 4;
  c.cfg.block_size = 4;
  c.cfg.dcp_size = 4;
  c.cfg.dcp_interleave = 2;
  c.cfg.precision = p;
  c.cfg.dcp_indexer_mode = mode;
  const std::vector<gen::Req> reqs{{40, 1}, {3, 4}, {0, 20}};
  const auto w = std::make_shared<const Weights>(Weights::generate(c.cfg, 41));
  const int blocks = testing::blocks_for(c.cfg, reqs);
  Oracle t0(c.cfg, w, Mode::exact, blocks), t1(c.cfg, w, Mode::emulated, blocks);
  StepOptions opts;
  opts.dcp_tables = tables;
  c.steps = testing::batch_inputs(c.cfg, 41, reqs, {});
  for (StepInput& in : c.steps) {
    in.dcp_tables = dcp_tables(in, c.cfg, tables, blocks);
    c.t0.push_back(t0.step(in, opts));
    c.t1.push_back(t1.step(in, StepOptions::follow(c.cfg, c.t0.back())));
  }
  return c;
}

/// The failing diffs' "where: note" lines, or "" when every diff passes.
std::string failures(const std::vector<StageDiff>& d) {
  std::string out;
  for (const StageDiff& x : d)
    if (!x.result.pass) out += x.where() + ": " + x.result.summary() + " | " + x.result.note + "\n";
  return out;
}

TEST(DcpJudge, TheOraclesOwnRanksPass) {
  for (const Precision p : {Precision::bf16, Precision::fp32})
    for (const DcpIndexerMode m : {DcpIndexerMode::exact, DcpIndexerMode::union_}) {
      const Case c = make(p, m);
      const auto d = diff_dcp(c.cfg, c.steps, c.t1, c.t0, c.t1);
      EXPECT_EQ(failures(d), "") << to_string(p) << " " << to_string(m);
      // Every rank's four stages and the merge, on every layer of every step.
      EXPECT_EQ(d.size(), c.steps.size() * c.cfg.num_layers * (4 * c.cfg.dcp_size + 1));
    }
}

TEST(DcpJudge, EachFieldFaultFailsWithItsName) {
  const Case c = make(Precision::bf16);
  const auto judged = [&](const std::vector<StepTrace>& cand, LseBase base = LseBase::e) {
    return failures(diff_dcp(c.cfg, c.steps, cand, c.t0, c.t1, base));
  };
  const auto has = [](const std::string& f, const std::string& what) {
    return f.find(what) != std::string::npos;
  };
  const int last = static_cast<int>(c.steps.size()) - 1;

  // An LSE in base 2 judged as natural log; stated, it passes.
  std::vector<StepTrace> base2 = c.t1;
  for (StepTrace& st : base2)
    for (LayerTrace& lt : st.layers)
      for (Mat& lse : lt.dcp->lse) lse /= std::log(2.0);
  EXPECT_TRUE(has(judged(base2), "base 2 judged as natural log")) << judged(base2);
  EXPECT_EQ(judged(base2, LseBase::two), "");

  // Each rank its own top-k where exact was asked.
  const Case u = make(Precision::bf16, DcpIndexerMode::union_);
  std::vector<StepTrace> union_rows = c.t1;
  for (std::size_t s = 0; s < c.t1.size(); ++s)
    for (std::size_t l = 0; l < c.t1[s].layers.size(); ++l)
      union_rows[s].layers[l].dcp->rows = u.t0[s].layers[l].dcp->rows;
  EXPECT_TRUE(has(judged(union_rows), "union) where exact was asked")) << judged(union_rows);

  // Ranks that disagree: rank 1 picks another key of a row past K.
  std::vector<StepTrace> disagree = c.t1;
  IndexRows& r1 = disagree[last].layers[0].dcp->rows[1];
  r1(0, 0) = r1(0, 0) == 0 ? 1 : 0;
  ASSERT_TRUE(c.t0[last].layers[0].dcp->rows[1](0, c.cfg.index_topk - 1) >= 0);
  EXPECT_TRUE(has(judged(disagree), "the ranks disagree")) << judged(disagree);

  // Global positions read through the rank's table as local ones.
  std::vector<StepTrace> as_local = c.t1;
  const int B = c.cfg.block_size;
  for (std::size_t s = 0; s < c.steps.size(); ++s)
    for (LayerTrace& lt : as_local[s].layers)
      for (int r = 0; r < c.cfg.dcp_size; ++r)
        for (Eigen::Index t = 0; t < lt.dcp->share[r].rows(); ++t) {
          const auto& table = c.steps[s].dcp_tables[r][c.steps[s].request_of_token[t]];
          int n = 0;
          lt.dcp->share[r].row(t).setConstant(-1);
          for (Eigen::Index k = 0; k < lt.dcp->rows[r].cols(); ++k)
            if (const auto p = lt.dcp->rows[r](t, k);
                p >= 0 && p / B < static_cast<std::int64_t>(table.size()))
              lt.dcp->share[r](t, n++) = std::int64_t{table[p / B]} * B + p % B;
        }
  EXPECT_TRUE(has(judged(as_local), "global positions read through its table as local"))
      << judged(as_local);

  // A NaN lse from a rank that owns none of a row; a NaN it adds to the merge.
  int rank = -1, row = -1;
  for (int r = 0; r < c.cfg.dcp_size && rank < 0; ++r)
    for (Eigen::Index t = 0; t < c.t0[last].layers[0].dcp->share[r].rows(); ++t)
      if (c.t0[last].layers[0].dcp->share[r](t, 0) < 0) {
        rank = r;
        row = static_cast<int>(t);
        break;
      }
  ASSERT_GE(rank, 0) << "the case has no rank owning nothing of a row";
  std::vector<StepTrace> nan_lse = c.t1;
  nan_lse[last].layers[0].dcp->lse[rank](row, 0) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(has(judged(nan_lse), "NaN lse from a rank that owns none")) << judged(nan_lse);
  std::vector<StepTrace> plus_inf = c.t1;  // FlashMLA's +inf for an empty row is legal
  plus_inf[last].layers[0].dcp->lse[rank](row, 0) = std::numeric_limits<double>::infinity();
  EXPECT_EQ(judged(plus_inf), "");
  std::vector<StepTrace> nan_merge = c.t1;
  const_cast<Tensor&>(nan_merge[last].layers[0].at(Stage::olat))
      .data[static_cast<std::size_t>(row) * c.cfg.num_heads * c.cfg.kv_lora_rank] =
      std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(has(judged(nan_merge), "0 x NaN in the merge")) << judged(nan_merge);

  // An in-place share read as a prefix: rank 0's share of the decode row spread out with -1
  // holes (a legal layout), its partial computed over the first entries only (keys lost).
  std::vector<StepTrace> prefix = c.t1;
  {
    LayerTrace& lt = prefix[last].layers[0];
    IndexRows& sh = lt.dcp->share[0];
    int n = 0;
    while (n < sh.cols() && sh(0, n) >= 0) ++n;
    ASSERT_GE(n, 2) << "rank 0 holds two keys of the decode row";
    ASSERT_LT(2 * n - 1, sh.cols());
    for (int k = n - 1; k >= 0; --k) {  // slot k to position 2k, holes between
      sh(0, 2 * k) = sh(0, k);
      if (k > 0) sh(0, 2 * k - 1) = -1;
    }
    lt.dcp->olat[0].row(0) *= 0.5;  // a partial over fewer keys
  }
  EXPECT_EQ(failures(diff_dcp(c.cfg, c.steps, prefix, c.t0, c.t1)).find("rank0/share"),
            std::string::npos)
      << "an in-place share is the same set";
  EXPECT_TRUE(has(judged(prefix), "reads its valid count as a prefix")) << judged(prefix);

  // A partial off by far more than its rounding.
  std::vector<StepTrace> bumped = c.t1;
  bumped[last].layers[0].dcp->olat[0](0, 3) += 0.25;
  EXPECT_TRUE(has(judged(bumped), "rank0/olat")) << judged(bumped);
}

}  // namespace
}  // namespace dsv32

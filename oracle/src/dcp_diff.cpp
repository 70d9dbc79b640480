// Judging a DCP candidate's ranks (MATH.md, "Context-parallel shards"): each rank's rows and
// share as sets, its partial olat and lse through the stage gates, each failure named by its
// class where it is one the field has met.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

using RowSets = std::vector<std::set<std::int64_t>>;

RowSets row_sets(const IndexRows& m) {
  RowSets out(m.rows());
  for (Eigen::Index t = 0; t < m.rows(); ++t)
    for (Eigen::Index k = 0; k < m.cols(); ++k)
      if (m(t, k) >= 0) out[t].insert(m(t, k));
  return out;
}

/// Rows as sets: max_err counts rows whose sets differ; `note` says which row first.
CompareResult compare_sets(const std::string& name, const IndexRows& got, const IndexRows& want) {
  CompareResult r;
  r.tensor = name;
  r.rule = "same set per row";
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    r.refused = true;
    r.note = "shape " + std::to_string(got.rows()) + "x" + std::to_string(got.cols()) +
             ", expected " + std::to_string(want.rows()) + "x" + std::to_string(want.cols());
    return r;
  }
  const RowSets a = row_sets(got), b = row_sets(want);
  r.count = static_cast<std::int64_t>(a.size());
  for (std::size_t t = 0; t < a.size(); ++t)
    if (a[t] != b[t]) {
      if (r.count_over++ == 0) {
        r.first_bad = static_cast<std::int64_t>(t) * want.cols();
        r.note = "row " + std::to_string(t) + " differs";
      }
    }
  r.max_err = static_cast<double>(r.count_over);
  r.pass = r.count_over == 0;
  return r;
}

Tensor tensor_of(const std::string& name, const Mat& m) {
  return Tensor::from(name, {m.rows(), m.cols()},
                      std::vector<double>(m.data(), m.data() + m.size()), DType::float64);
}

/// The class of a failed rank's rows under `exact` (every rank must hold S_t).
std::string rows_class(const DcpLayerTrace& cand, int rank, const DcpLayout& lay,
                       DcpIndexerMode mode) {
  const RowSets mine = row_sets(cand.rows[rank]);
  if (mode == DcpIndexerMode::exact) {
    bool own_only = true;
    for (const auto& row : mine)
      for (std::int64_t p : row) own_only = own_only && lay.owner(p) == rank;
    if (own_only)
      return "rank " + std::to_string(rank) +
             " holds only keys it owns: each rank its own top-k (union) where exact was asked";
    for (int other = 0; other < static_cast<int>(cand.rows.size()); ++other)
      if (other != rank && row_sets(cand.rows[other]) != mine)
        return "ranks " + std::to_string(other) + " and " + std::to_string(rank) +
               " hold different sets: the ranks disagree (ties broken per rank?)";
  }
  return "";
}

/// The class of a failed share: the rank's own table read with global positions as local ones.
std::string share_class(const IndexRows& cand, const IndexRows& s_t, int rank, const StepInput& in,
                        const std::vector<std::vector<int>>& tables, int B) {
  const RowSets got = row_sets(cand);
  bool any = false;
  for (Eigen::Index t = 0; t < cand.rows(); ++t) {
    const int req = in.request_of_token.at(t);
    const std::vector<int>& table = tables.at(req);
    std::set<std::int64_t> as_local;
    for (Eigen::Index k = 0; k < s_t.cols(); ++k)
      if (const std::int64_t p = s_t(t, k);
          p >= 0 && p / B < static_cast<std::int64_t>(table.size()))
        as_local.insert(std::int64_t{table[p / B]} * B + p % B);
    if (got[t].empty()) continue;
    if (!std::includes(as_local.begin(), as_local.end(), got[t].begin(), got[t].end())) return "";
    any = true;
  }
  return any ? "rank " + std::to_string(rank) +
                   "'s slots are global positions read through its table as local ones"
             : "";
}

}  // namespace

std::vector<StageDiff> diff_dcp(const Config& cfg, const std::vector<StepInput>& steps,
                                const std::vector<StepTrace>& cand,
                                const std::vector<StepTrace>& t0, const std::vector<StepTrace>& t1,
                                LseBase base) {
  std::vector<StageDiff> out;
  const DcpLayout lay = DcpLayout::of(cfg);
  const int W = cfg.dcp_size, B = cfg.block_size;
  const std::size_t n = std::min({cand.size(), t0.size(), t1.size(), steps.size()});
  // Per (layer, rank, stage): the run's largest T1 - T0 (bf16) or |T0| (fp32), as diff_traces.
  std::map<std::tuple<int, int, int>, double> run;
  // m with the rows where `share` is empty zeroed (not judged there).
  const auto masked = [&](const Mat& m, const IndexRows& share) {
    Mat kept = m;
    for (Eigen::Index t = 0; t < m.rows(); ++t)
      if (share(t, 0) < 0) kept.row(t).setZero();
    return kept;
  };
  for (std::size_t s = 0; s < n; ++s)
    for (int l = 0; l < cfg.num_layers; ++l) {
      const auto &a = t0[s].layers.at(l).dcp, &b = t1[s].layers.at(l).dcp;
      if (!a || !b) continue;
      for (int r = 0; r < W; ++r)
        for (int which = 0; which < 2; ++which) {
          const Mat x0 = masked(which ? a->lse[r] : a->olat[r], a->share[r]);
          const Mat x1 = masked(which ? b->lse[r] : b->olat[r], a->share[r]);
          double& m = run[{l, r, which}];
          m = std::max(m, cfg.precision == Precision::fp32 ? x0.cwiseAbs().maxCoeff()
                                                           : (x1 - x0).cwiseAbs().maxCoeff());
        }
    }
  for (std::size_t s = 0; s < n; ++s)
    for (int l = 0; l < cfg.num_layers; ++l) {
      const auto &c = cand[s].layers.at(l).dcp, &a = t0[s].layers.at(l).dcp,
                 &b = t1[s].layers.at(l).dcp;
      if (!c || !a || !b) continue;  // a candidate may give its merge alone
      const StepInput& in = steps[s];
      for (int r = 0; r < W; ++r) {
        const std::string rank = "rank" + std::to_string(r) + "/";
        const auto push = [&](const std::string& stage, CompareResult res, std::string cls) {
          if (!res.pass && !cls.empty()) res.note += (res.note.empty() ? "" : "; ") + cls;
          out.push_back({static_cast<int>(s), l, rank + stage, std::move(res)});
        };
        if (static_cast<int>(c->rows.size()) <= r) {
          CompareResult res;
          res.tensor = rank;
          res.refused = true;
          res.note = "candidate has " + std::to_string(c->rows.size()) + " ranks, dcp_size " +
                     std::to_string(W);
          push("topk", res, "");
          continue;
        }
        CompareResult rows = compare_sets(rank + "topk", c->rows[r], a->rows[r]);
        push("topk", rows, rows.pass ? "" : rows_class(*c, r, lay, cfg.dcp_indexer_mode));
        CompareResult share = compare_sets(rank + "share", c->share[r], a->share[r]);
        push("share", share,
             share.pass || in.dcp_tables.empty()
                 ? ""
                 : share_class(c->share[r], a->rows[r], r, in, in.dcp_tables.at(r), B));

        // lse: natural log; an empty share's lse -inf or +inf; a base-2 candidate converted.
        Mat lse = c->lse[r];
        if (base == LseBase::two) lse *= std::log(2.0);
        std::string empty_nan;
        for (Eigen::Index t = 0; t < lse.rows(); ++t) {
          if (a->share[r](t, 0) >= 0) continue;
          for (Eigen::Index h = 0; h < lse.cols(); ++h)
            if (std::isnan(lse(t, h)) && empty_nan.empty())
              empty_nan = "row " + std::to_string(t) +
                          ": NaN lse from a rank that owns none of "
                          "the row's keys (-inf or +inf expected)";
          lse.row(t).setConstant(0.0);  // ±inf accepted there
        }
        const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
        const auto gate = [&](const std::string& name, const Mat& got, const Mat& x0, const Mat& x1,
                              Stage st, int which) {
          const Tensor g = tensor_of(name, got), w0 = tensor_of(name, x0), w1 = tensor_of(name, x1);
          if (cfg.precision == Precision::fp32)
            return compare_fp32(g, w0, fp32_chain_dot(cfg, l), run[{l, r, which}]);
          return compare_bf16(g, w0, w1, storage_dtype(cfg, st),
                              fp8 ? DType::float8_e4m3fn : DType::bfloat16, run[{l, r, which}]);
        };
        const Mat l0 = masked(a->lse[r], a->share[r]), l1 = masked(b->lse[r], a->share[r]);
        CompareResult lr = gate(rank + "lse", lse, l0, l1, Stage::lse, 1);
        if (!empty_nan.empty()) {
          lr.pass = false;
          lr.note = empty_nan;
        }
        std::string base_class;
        if (!lr.pass) {
          // An LSE off by a constant factor: log2(e) (base 2 read as natural), or ln 2.
          double num = 0, den = 0;
          for (Eigen::Index i = 0; i < lse.size(); ++i) {
            num += lse.data()[i] * l0.data()[i];
            den += l0.data()[i] * l0.data()[i];
          }
          const double f = den > 0 ? num / den : 0;
          if (std::fabs(f - 1 / std::log(2.0)) < 1e-2)
            base_class =
                "lse is T0's times log2(e): base 2 judged as natural log (state the "
                "candidate's LSE base)";
          else if (std::fabs(f - std::log(2.0)) < 1e-2)
            base_class = "lse is T0's times ln 2: natural log judged as base 2";
        }
        // A share left in place (-1 holes before valid slots) beside a failing partial: the
        // kernel may have read the valid count as a prefix of the row.
        std::string holes;
        for (Eigen::Index t = 0; t < c->share[r].rows() && holes.empty(); ++t)
          for (Eigen::Index k = 1; k < c->share[r].cols(); ++k)
            if (c->share[r](t, k) >= 0 && c->share[r](t, k - 1) < 0) {
              holes = "rank " + std::to_string(r) + "'s share is in place (row " +
                      std::to_string(t) +
                      " has -1 holes): a kernel that reads its valid count as a prefix of the "
                      "row loses keys";
              break;
            }
        push("lse", lr, base_class.empty() ? holes : base_class);
        const Mat o = masked(c->olat[r], a->share[r]);
        push("olat",
             gate(rank + "olat", o, masked(a->olat[r], a->share[r]),
                  masked(b->olat[r], a->share[r]), Stage::olat, 0),
             holes);
      }
      // The merge: a NaN in the merged olat of a row some rank owns none of is that rank's
      // 0 x NaN (an empty rank must add exactly nothing).
      const Tensor* merged = cand[s].layers.at(l).find(Stage::olat);
      if (!merged) continue;
      const std::int64_t width = merged->shape.size() > 1 ? merged->numel() / merged->shape[0] : 1;
      CompareResult m;
      m.tensor = "merge";
      m.rule = "no NaN from an empty rank";
      m.pass = true;
      for (Eigen::Index t = 0; t < a->share[0].rows() && m.pass; ++t) {
        int empty = -1;
        for (int r = 0; r < W && empty < 0; ++r)
          if (a->share[r](t, 0) < 0) empty = r;
        if (empty < 0) continue;
        for (std::int64_t e = t * width; e < (t + 1) * width; ++e)
          if (std::isnan(merged->data.at(e))) {
            m.pass = false;
            m.first_bad = e;
            m.count_over = 1;
            m.note = "row " + std::to_string(t) + ": NaN in the merged olat where rank " +
                     std::to_string(empty) +
                     " owns none of the row's keys: 0 x NaN in the merge (an empty rank must add "
                     "exactly nothing)";
            break;
          }
      }
      m.count = a->share[0].rows();
      out.push_back({static_cast<int>(s), l, "merge", std::move(m)});
    }
  return out;
}

}  // namespace dsv32

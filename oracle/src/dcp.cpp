#include "dsv32/oracle/dcp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "dsv32/oracle/numerics.hpp"

namespace dsv32 {

std::int64_t DcpLayout::owned(std::int64_t n, int r) const {
  const std::int64_t run = std::int64_t{interleave} * world;  // one round over the ranks
  const std::int64_t full = n / run * interleave;
  const std::int64_t rest = n % run - std::int64_t{r} * interleave;  // the last, partial round
  return full + std::clamp<std::int64_t>(rest, 0, interleave);
}

std::vector<int> dcp_block_table(const std::vector<int>& request_table, int seq_len,
                                 const Config& cfg, DcpTables tables, int num_blocks, int rank) {
  const DcpLayout lay = DcpLayout::of(cfg);
  const int B = cfg.block_size;
  const std::int64_t local_blocks = (lay.owned(seq_len, 0) + B - 1) / B;  // rank 0 owns the most
  if (local_blocks > static_cast<std::int64_t>(request_table.size()))
    throw std::invalid_argument("dcp_block_table: the request's table has " +
                                std::to_string(request_table.size()) + " blocks, " +
                                std::to_string(local_blocks) + " needed");
  std::vector<int> out(request_table.begin(), request_table.begin() + local_blocks);
  if (tables == DcpTables::distinct)
    for (int& id : out) id = static_cast<int>((std::int64_t{id} + rank) % num_blocks);
  return out;
}

std::vector<std::vector<std::vector<int>>> dcp_tables(const StepInput& in, const Config& cfg,
                                                      DcpTables tables, int num_blocks) {
  std::vector<std::vector<std::vector<int>>> out(cfg.dcp_size);
  for (int rank = 0; rank < cfg.dcp_size; ++rank)
    for (const RequestStep& r : in.requests)
      out[rank].push_back(
          dcp_block_table(r.block_table, r.seq_len(), cfg, tables, num_blocks, rank));
  return out;
}

void check_dcp_tables(const StepInput& in, const Config& cfg,
                      const std::vector<std::vector<std::vector<int>>>& tables, int num_blocks) {
  const DcpLayout lay = DcpLayout::of(cfg);
  const auto fail = [](const std::string& why) { throw ScenarioError("DCP block tables: " + why); };
  if (static_cast<int>(tables.size()) != cfg.dcp_size)
    fail(std::to_string(tables.size()) + " ranks, the config has dcp_size " +
         std::to_string(cfg.dcp_size));
  for (int rank = 0; rank < cfg.dcp_size; ++rank) {
    if (tables[rank].size() != in.requests.size())
      fail("rank " + std::to_string(rank) + " has " + std::to_string(tables[rank].size()) +
           " tables for " + std::to_string(in.requests.size()) + " requests");
    std::vector<int> holder(num_blocks, -1);  // the request holding each id on this rank
    for (std::size_t r = 0; r < in.requests.size(); ++r) {
      const std::string who =
          "rank " + std::to_string(rank) + " request " + std::to_string(in.requests[r].id);
      const std::int64_t owned = lay.owned(in.requests[r].seq_len(), rank);
      const std::int64_t need = (owned + cfg.block_size - 1) / cfg.block_size;
      if (static_cast<std::int64_t>(tables[rank][r].size()) < need)
        fail(who + ": " + std::to_string(tables[rank][r].size()) + " blocks, its " +
             std::to_string(owned) + " owned positions need " + std::to_string(need));
      for (int id : tables[rank][r]) {
        if (id < 0 || id >= num_blocks)
          fail(who + ": block id " + std::to_string(id) + " outside [0, " +
               std::to_string(num_blocks) + ")");
        if (holder[id] >= 0 && holder[id] != static_cast<int>(r))
          fail(who + ": block id " + std::to_string(id) + " is also request " +
               std::to_string(in.requests[holder[id]].id) + "'s");
        holder[id] = static_cast<int>(r);
      }
    }
  }
}

std::vector<int> dcp_select_topk(const std::vector<double>& scores, int K, const DcpLayout& lay,
                                 DcpIndexerMode mode, int rank) {
  const int n = static_cast<int>(scores.size());
  std::vector<int> out(K, -1);
  const auto better = [&](int a, int b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  };
  // The best min(K, |pool|) of `pool` by step 7's rule, ascending.
  const auto best = [&](std::vector<int> pool) {
    if (static_cast<int>(pool.size()) > K) {
      for (int j : pool)
        if (std::isnan(scores[j]))
          throw std::runtime_error("dcp_select_topk: NaN index score at position " +
                                   std::to_string(j));
      std::nth_element(pool.begin(), pool.begin() + K, pool.end(), better);
      pool.resize(K);
    }
    std::sort(pool.begin(), pool.end());
    return pool;
  };
  std::vector<int> chosen;
  if (mode == DcpIndexerMode::union_) {
    std::vector<int> mine;
    for (int j = 0; j < n; ++j)
      if (lay.owner(j) == rank) mine.push_back(j);
    chosen = best(std::move(mine));
  } else {
    // Every rank's local top-K, exchanged; every global winner is in its owner's local top-K.
    std::vector<std::vector<int>> owned(lay.world);
    for (int j = 0; j < n; ++j) owned[lay.owner(j)].push_back(j);
    std::vector<int> candidates;
    for (auto& o : owned)
      for (int j : best(std::move(o))) candidates.push_back(j);
    chosen = best(std::move(candidates));
  }
  std::copy(chosen.begin(), chosen.end(), out.begin());
  return out;
}

void dcp_merge_row(const std::vector<const double*>& part_olat,
                   const std::vector<const double*>& part_lse, int H, int L, bool round,
                   double* olat, double* lse) {
  const int W = static_cast<int>(part_olat.size());
  const double inf = std::numeric_limits<double>::infinity();
  const auto empty = [](double v) { return !std::isfinite(v); };  // -inf, +inf (FlashMLA), NaN
  for (int h = 0; h < H; ++h) {
    double m = -inf;
    for (int r = 0; r < W; ++r)
      if (!empty(part_lse[r][h])) m = std::max(m, part_lse[r][h]);
    double* out = olat + static_cast<std::ptrdiff_t>(h) * L;
    std::fill(out, out + L, 0.0);
    if (m == -inf) {  // no rank holds a key of this row
      lse[h] = -inf;
      continue;
    }
    double s = 0.0;
    for (int r = 0; r < W; ++r)
      if (!empty(part_lse[r][h])) s += std::exp(part_lse[r][h] - m);
    lse[h] = m + std::log(s);  // one rank: m + log(1) = m exactly
    bool first = true;
    for (int r = 0; r < W; ++r) {
      if (empty(part_lse[r][h])) continue;
      const double w = std::exp(part_lse[r][h] - lse[h]);
      const double* in = part_olat[r] + static_cast<std::ptrdiff_t>(h) * L;
      for (int i = 0; i < L; ++i) {
        double v = w * in[i];
        if (round) v = round_bf16(v);
        out[i] = first ? v : round ? round_bf16(out[i] + v) : out[i] + v;
      }
      first = false;
    }
  }
}

}  // namespace dsv32

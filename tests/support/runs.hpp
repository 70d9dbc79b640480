// Scenario runs for the oracle's metamorphic properties: one prefill step for the requests that
// have context, then a final step in a chosen order, padding and poison; outputs by position.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "dsv32/oracle/oracle.hpp"
#include "support/generators.hpp"

namespace dsv32::testing {

/// Applied to the variant run's traces before comparing: the can-fail tests corrupt them.
using Corrupt = std::function<void(std::vector<StepTrace>&)>;

struct Run {
  std::vector<StepInput> inputs;
  std::vector<StepTrace> traces;
};

/// Every real row of a stage, keyed by (request id, position).
using Rows = std::map<std::pair<int, int>, std::vector<double>>;

inline Rows rows_of(const Run& run, int layer, const std::string& stage) {
  Rows rows;
  for (std::size_t s = 0; s < run.inputs.size(); ++s) {
    const StepInput& in = run.inputs[s];
    const Tensor& t = layer < 0 ? run.traces[s].output : run.traces[s].layers.at(layer).at(stage);
    const std::int64_t width = t.numel() / std::max(1, in.num_tokens);
    for (int tok = 0; tok < in.num_tokens; ++tok) {
      const int id = in.requests[in.request_of_token[tok]].id;
      rows[{id, in.positions[tok]}] =
          std::vector<double>(t.data.begin() + tok * width, t.data.begin() + (tok + 1) * width);
    }
  }
  return rows;
}

/// "" when every row of `b` present in `a` agrees within rel * (1 + max|a|), else the first
/// disagreement; refuses vacuous comparisons (nothing shared, or an all-zero reference).
inline std::string compare_rows(const Rows& a, const Rows& b, double rel) {
  double scale = 0;
  for (const auto& [k, v] : a)
    for (double x : v) scale = std::max(scale, std::fabs(x));
  if (!(scale > 0)) return "reference rows are all zero: vacuous comparison";
  int shared = 0;
  for (const auto& [k, vb] : b) {
    auto it = a.find(k);
    if (it == a.end()) continue;
    ++shared;
    for (std::size_t i = 0; i < vb.size(); ++i) {
      const double d = std::fabs(vb[i] - it->second[i]);
      if (!(d <= rel * (1 + scale))) {
        std::ostringstream s;
        s << "request " << k.first << " position " << k.second << " element " << i << ": " << vb[i]
          << " vs " << it->second[i] << " (diff " << d << ", tol " << rel * (1 + scale) << ")";
        return s.str();
      }
    }
  }
  return shared ? "" : "no rows in common: vacuous comparison";
}

/// Blocks enough for the batch, with slack so block tables are permuted across the pool.
inline int blocks_for(const Config& cfg, const std::vector<gen::Req>& reqs) {
  int n = 4;
  for (const gen::Req& r : reqs) n += (r.prefill + r.q + cfg.block_size - 1) / cfg.block_size + 1;
  return n;
}

/// The batch's steps: step 0 prefills the requests with context (in `order`), step 1 runs every
/// request's q tokens in `order`, padded by `pad` rows filled with `poison` (and step 0 padded to
/// `prefill_size` rows, 0: not). Request r keeps id r (its inputs are keyed by it); an `order`
/// naming a subset has only those requests.
inline std::vector<StepInput> batch_inputs(const Config& cfg, std::uint64_t seed,
                                           const std::vector<gen::Req>& reqs,
                                           std::vector<int> order, int pad = 0,
                                           Poison poison = Poison::nan, int prefill_size = 0) {
  if (order.empty()) {
    order.resize(reqs.size());
    std::iota(order.begin(), order.end(), 0);
  }
  ScenarioBuilder builder(cfg, seed, blocks_for(cfg, reqs));
  std::vector<StepInput> steps;
  std::vector<StepRequest> pre, fin;
  for (int r : order) {
    if (reqs[r].prefill > 0) pre.push_back({r, reqs[r].prefill});
    fin.push_back({r, reqs[r].q});
  }
  if (!pre.empty()) steps.push_back(builder.step(pre, prefill_size, poison));
  int Ta = 0;
  for (const StepRequest& s : fin) Ta += s.q;
  steps.push_back(builder.step(fin, Ta + pad, poison));
  return steps;
}

/// Runs batch_inputs(...) on a fresh exact oracle.
inline Run run_batch(const Config& cfg, std::shared_ptr<const Weights> w, std::uint64_t seed,
                     const std::vector<gen::Req>& reqs, const std::vector<int>& order, int pad = 0,
                     Poison poison = Poison::nan, const std::vector<StepOptions>& step_opts = {}) {
  Oracle oracle(cfg, std::move(w), Mode::exact, blocks_for(cfg, reqs));
  Run run;
  run.inputs = batch_inputs(cfg, seed, reqs, order, pad, poison);
  for (std::size_t s = 0; s < run.inputs.size(); ++s)
    run.traces.push_back(
        oracle.step(run.inputs[s], s < step_opts.size() ? step_opts[s] : StepOptions{}));
  return run;
}

}  // namespace dsv32::testing

// Cross-rank agreement (issue 56): the indexer is replicated, so every rank of a group must select
// the same top-k row, set and order, for every token; under DCP the ranks' shares are cut from
// that one row, and ranks that disagree on ties (ROCm/ATOM#1832) or order (ROCm/aiter#4415) lay
// out different keys. RapidCheck over tie-heavy inputs (layer 0's index keys without their rotary
// part, hidden rows repeating a phrase of 1 to 3 tokens: tie groups straddling the K-th place):
// - every rank of a tensor-parallel group on one GPU (tp 2 or 4, DCP 1 or 2 inside it), under a
//   random plan, holds the same rows bit for bit;
// - the same requests in another batch order, in another group of the same size under eager,
//   give each request the same rows as the first group's rank 0 (the same capture sizes: across
//   sizes, or group sizes, the build's products round otherwise, so a later layer's input may
//   differ by design);
// - that run passes the oracle (its rows a valid top-k under the tie rule).
// A test that feeds the check a rank with two tied entries swapped expects it to fail.
//
// The name ends in _one_gpu: ctest loads CUDA's kernels eagerly for it (gpu/tp.hpp). Reproduce a
// failure with the RC_PARAMS line RapidCheck prints; RC_PARAMS="max_success=N" sets the count.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "dsv32/golden/golden.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/gpu.hpp"

namespace dsv32 {
namespace {

/// One request of a case: its prefill, its second step's tokens and how its hidden rows repeat.
struct Req {
  int prefill, q, repeat;
};

/// The case's two steps (every prefill, then every request's q tokens) in `order`, padded by
/// `pad0` and `pad1` rows.
golden::CaseSpec spec_of(const Config& cfg, const std::vector<Req>& reqs,
                         const std::vector<int>& order, int pad0, int pad1) {
  golden::CaseSpec s;
  s.name = "rank-agreement";
  s.cfg = cfg;
  s.seed = 56;
  s.zero_index_key_rope = {0};
  golden::StepPlan first, second;
  int t0 = 0, t1 = 0, blocks = 0;
  for (int i : order) {
    const Req& r = reqs[static_cast<std::size_t>(i)];
    first.requests.push_back({i, r.prefill});
    second.requests.push_back({i, r.q});
    t0 += r.prefill, t1 += r.q;
    blocks += (r.prefill + r.q + cfg.block_size - 1) / cfg.block_size + 1;
    s.hidden[i] = HiddenShape{r.repeat, {}};
  }
  first.capture_size = t0 + pad0;
  second.capture_size = t1 + pad1;
  s.steps = {first, second};
  s.num_blocks = blocks * cfg.dcp_size + 4;  // distinct tables shift ids by the rank
  s.dcp_tables = DcpTables::distinct;
  return s;
}

using RowKey = std::tuple<int, int, int>;  // layer, request id, position

/// Every real token's top-k row of every layer, keyed by (layer, request, position).
std::map<RowKey, std::vector<double>> topk_by_request(const std::vector<StepInput>& steps,
                                                      const std::vector<StepTrace>& traces) {
  std::map<RowKey, std::vector<double>> out;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const StepInput& in = steps[s];
    for (std::size_t l = 0; l < traces[s].layers.size(); ++l) {
      const Tensor* found = traces[s].layers[l].find("topk");
      if (found == nullptr) continue;
      const Tensor& t = *found;
      const std::int64_t width = t.numel() / t.shape[0];
      for (int tok = 0; tok < in.num_tokens; ++tok)
        out[{static_cast<int>(l), in.requests[in.request_of_token[tok]].id, in.positions[tok]}] =
            std::vector<double>(t.data.begin() + tok * width, t.data.begin() + (tok + 1) * width);
    }
  }
  return out;
}

/// "" when every rank's top-k rows equal rank 0's bit for bit, at every step and layer; else the
/// first rank, step, layer and token that differ.
std::string ranks_agree(const std::vector<std::vector<StepTrace>>& by_step) {
  for (std::size_t s = 0; s < by_step.size(); ++s) {
    const std::vector<StepTrace>& ranks = by_step[s];
    for (std::size_t r = 1; r < ranks.size(); ++r)
      for (std::size_t l = 0; l < ranks[0].layers.size(); ++l) {
        const Tensor *pa = ranks[0].layers[l].find("topk"), *pb = ranks[r].layers[l].find("topk");
        if (pa == nullptr && pb == nullptr) continue;
        if (pa == nullptr || pb == nullptr || pa->shape != pb->shape)
          return "rank " + std::to_string(r) + ", layer " + std::to_string(l) +
                 ": another top-k shape";
        const Tensor &a = *pa, &b = *pb;
        const auto [ia, ib] = std::mismatch(a.data.begin(), a.data.end(), b.data.begin());
        if (ia != a.data.end())
          return "step " + std::to_string(s) + ", layer " + std::to_string(l) + ", token " +
                 std::to_string((ia - a.data.begin()) / a.shape[1]) + ": rank " +
                 std::to_string(r) + " selects " + std::to_string(*ib) + " where rank 0 selects " +
                 std::to_string(*ia);
      }
  }
  return "";
}

TEST(GpuRankAgreement, EveryRankAndEveryBatchSelectTheSameTiedRows_one_gpu) {
  DSV32_REQUIRE_GPU();
  if (const std::string why = gpu::no_tp_reason(4, gpu::TpTransport::one_gpu); !why.empty())
    GTEST_SKIP() << why;
  const bool ok = rc::check("ties x ranks x plan x batch order", [] {
    Config cfg = preset("tiny-fs");
    cfg.index_topk = *rc::gen::element(8, 16);
    const int tp = *rc::gen::element(2, 4);
    cfg.dcp_size = *rc::gen::element(1, 2);
    if (cfg.dcp_size > 1) cfg.dcp_interleave = *rc::gen::element(1, cfg.block_size);
    const int n = *rc::gen::inRange(1, 4);
    std::vector<Req> reqs;
    for (int i = 0; i < n; ++i)
      reqs.push_back({*rc::gen::inRange(1, 3 * cfg.index_topk + 16), *rc::gen::inRange(1, 4),
                      *rc::gen::inRange(1, 4)});
    std::vector<int> own(reqs.size());
    std::iota(own.begin(), own.end(), 0);
    std::vector<int> other = own;
    const int shift = *rc::gen::inRange(0, n);
    std::rotate(other.begin(), other.begin() + shift, other.end());
    if (*rc::gen::arbitrary<bool>()) std::reverse(other.begin(), other.end());
    const std::string plan =
        *rc::gen::element<std::string>("eager", "narrow", "wide", "full-and-piecewise");
    RC_LOG() << "tp " << tp << ", dcp " << cfg.dcp_size << " interleave " << cfg.dcp_interleave
             << ", K " << cfg.index_topk << ", plan " << plan << "\n";

    // Both orders padded to the same capture sizes: across sizes the build's products may pick
    // other kernels, and a later layer's input other bits (docs/DECISIONS.md).
    const int pad0 = *rc::gen::inRange(0, 5), pad1 = *rc::gen::inRange(0, 9);
    const golden::GoldenCase a = golden::generate(spec_of(cfg, reqs, own, pad0, pad1), "test");
    const golden::GoldenCase b = golden::generate(spec_of(cfg, reqs, other, pad0, pad1), "test");
    // Each step's rank traces and the group's merged trace.
    const auto run_group = [&](const golden::GoldenCase& gc, const std::string& plan_name,
                               std::vector<std::vector<StepTrace>>& ranks) {
      int max_tokens = 0;
      for (const StepInput& in : gc.steps) max_tokens = std::max(max_tokens, in.capture_size);
      gpu::TpGroup group(gc.cfg, gc.weights, tp, gc.num_blocks, max_tokens, {},
                         gpu::TpTransport::one_gpu);
      const boundary::Plan p = boundary::plan_preset(plan_name, gc.cfg);
      std::vector<StepTrace> merged;
      for (const StepInput& in : gc.steps) {
        merged.push_back(group.run(p, in));
        ranks.push_back(group.rank_traces());
      }
      return merged;
    };
    std::vector<std::vector<StepTrace>> ranks, ranks_b;
    run_group(a, plan, ranks);
    if (const std::string e = ranks_agree(ranks); !e.empty()) RC_FAIL("ranks: " + e);
    const std::vector<StepTrace> one = run_group(b, "eager", ranks_b);
    if (const std::string e = ranks_agree(ranks_b); !e.empty()) RC_FAIL("ranks, eager: " + e);
    std::vector<StepTrace> rank0;
    for (const std::vector<StepTrace>& r : ranks) rank0.push_back(r.front());
    const auto want = topk_by_request(a.steps, rank0), got = topk_by_request(b.steps, one);
    RC_ASSERT(want.size() == got.size());
    for (const auto& [key, row] : want)
      if (got.at(key) != row) {
        const auto [l, id, pos] = key;
        RC_FAIL("another batch: layer " + std::to_string(l) + ", request " + std::to_string(id) +
                ", position " + std::to_string(pos) + " selects another row than the group");
      }
    const Judgement j =
        judge(b.cfg, std::make_shared<const Weights>(b.weights), b.num_blocks, b.steps, one, tp);
    if (static_cast<int>(j.failures.size()) > j.vacuous) RC_FAIL(j.failures.front());
    RC_ASSERT(j.topk_rows > 0);
  });
  EXPECT_TRUE(ok);
}

// The check can fail: a rank whose row holds two entries swapped (ties taken in another order)
// is named, the rank and the token.
TEST(GpuRankAgreementCanFail, ARankWithTwoEntriesSwappedIsNamed) {
  StepTrace t;
  LayerTrace layer;
  layer.tensors.push_back(Tensor{"topk", {2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}});
  t.layers.push_back(layer);
  StepTrace swapped = t;
  std::swap(swapped.layers[0].tensors[0].data[5], swapped.layers[0].tensors[0].data[6]);
  EXPECT_EQ(ranks_agree({{t, t, t}}), "");
  EXPECT_EQ(ranks_agree({{t, t, swapped}}),
            "step 0, layer 0, token 1: rank 2 selects 6.000000 where rank 0 selects 5.000000");
}

}  // namespace
}  // namespace dsv32

// The oracle's metamorphic properties (TESTING.md section 4), each an RC_GTEST_PROP, and for
// each a test that feeds its check a corrupted output and expects the check to fail.
//
// Reproduce a failure with the RC_PARAMS line RapidCheck prints; raise the case count for
// nightly runs with RC_PARAMS="max_success=1000" (default 100).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>

#include "dsv32/oracle/compare.hpp"
#include "support/runs.hpp"

namespace dsv32 {
namespace {

using testing::compare_rows;
using testing::Corrupt;
using testing::rows_of;
using testing::Run;
using testing::run_batch;

constexpr double kNoise = 1e-9;  // fp64 summation-order noise, relative to the tensor's max

std::shared_ptr<const Weights> weights_for(const Config& cfg, std::uint64_t seed) {
  return std::make_shared<const Weights>(Weights::generate(cfg, seed));
}

void apply(const Corrupt& corrupt, Run& run) {
  if (corrupt) corrupt(run.traces);
}

/// Perturbs one element of the last step's output (what every check compares).
Corrupt bump_output(double by = 0.5) {
  return [by](std::vector<StepTrace>& t) {
    t.back().output.data.at(t.back().output.data.size() / 2) += by;
  };
}

// --- checks: "" when the property holds -----------------------------------------------------

std::string check_batch_invariance(const Config& cfg, const std::vector<gen::Req>& reqs,
                                   const std::vector<int>& perm, const Corrupt& corrupt = {}) {
  const auto w = weights_for(cfg, 11);
  const Run a = run_batch(cfg, w, 11, reqs, {});
  Run b = run_batch(cfg, w, 11, reqs, perm);
  const Run alone = run_batch(cfg, w, 11, reqs, {perm[0]});  // the same request, by itself
  apply(corrupt, b);
  if (auto e = compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), kNoise); !e.empty())
    return "order: " + e;
  return compare_rows(rows_of(a, -1, ""), rows_of(alone, -1, ""), kNoise);
}

std::string check_padding(const Config& cfg, const std::vector<gen::Req>& reqs, int pad,
                          Poison poison, const Corrupt& corrupt = {}) {
  const auto w = weights_for(cfg, 12);
  const Run a = run_batch(cfg, w, 12, reqs, {});
  Run b = run_batch(cfg, w, 12, reqs, {}, pad, poison);
  apply(corrupt, b);
  for (int l = 0; l < cfg.num_layers; ++l)
    if (auto e = compare_rows(rows_of(a, l, "y"), rows_of(b, l, "y"), kNoise); !e.empty())
      return "layer " + std::to_string(l) + " y: " + e;
  return compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), kNoise);
}

/// One request's steps of `sizes` new tokens each, on fresh exact oracle and caches.
Run run_chunks(const Config& cfg, const std::vector<int>& sizes) {
  const auto w = weights_for(cfg, 13);
  int total = 0;
  for (int q : sizes) total += q;
  const int blocks = (total + 1) / cfg.block_size + 4;
  Oracle o(cfg, w, Mode::exact, blocks);
  ScenarioBuilder b(cfg, 13, blocks);
  Run r;
  for (int q : sizes) {
    r.inputs.push_back(b.step({{0, q}}));
    r.traces.push_back(o.step(r.inputs.back()));
  }
  return r;
}

/// Speculative decoding's verify: q tokens after a context of ctx in one step, against the same
/// tokens decoded one a step.
std::string check_verify(const Config& cfg, int ctx, int q, const Corrupt& corrupt = {}) {
  const Run verify = run_chunks(cfg, {ctx, q});
  std::vector<int> sizes{ctx};
  sizes.insert(sizes.end(), static_cast<std::size_t>(q), 1);
  Run one_by_one = run_chunks(cfg, sizes);
  apply(corrupt, one_by_one);
  return compare_rows(rows_of(verify, -1, ""), rows_of(one_by_one, -1, ""), kNoise);
}

std::string check_chunked_prefill(const Config& cfg, int total, const std::vector<int>& cuts,
                                  const Corrupt& corrupt = {}) {
  const auto run = [&](const std::vector<int>& sizes) { return run_chunks(cfg, sizes); };
  std::vector<int> sizes;
  int at = 0;
  for (int c : cuts)
    if (c > at && c < total) sizes.push_back(c - at), at = c;
  sizes.push_back(total - at);
  const Run one = run({total, 1});
  sizes.push_back(1);
  Run many = run(sizes);
  apply(corrupt, many);
  return compare_rows(rows_of(one, -1, ""), rows_of(many, -1, ""), kNoise);
}

/// Dense causal MLA from the trace's own query and cache stages, for single-step prefills.
std::string check_sparse_is_dense(const Config& cfg, const std::vector<gen::Req>& reqs,
                                  const Corrupt& corrupt = {}) {
  std::vector<gen::Req> fresh = reqs;
  for (gen::Req& r : fresh) r.prefill = 0;  // one step: every key is in this step's trace
  const auto w = weights_for(cfg, 14);
  Run run = run_batch(cfg, w, 14, fresh, {});
  apply(corrupt, run);
  const StepInput& in = run.inputs.back();
  const int H = cfg.num_heads, L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim;
  double scale = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerTrace& lt = run.traces.back().layers[l];
    const auto& ql = lt.at("ql").data;
    const auto& qR = lt.at("qR").data;
    const auto& c = lt.at("c").data;
    const auto& kR = lt.at("kR").data;
    const auto& olat = lt.at("olat").data;
    for (double v : olat) scale = std::max(scale, std::fabs(v));
    for (int t = 0; t < in.num_tokens; ++t) {
      const int r = in.request_of_token[t], t0 = in.token_start[r];
      for (int h = 0; h < H; ++h) {
        std::vector<double> z;
        for (int j = t0; j <= t; ++j) {
          double s = 0;
          for (int i = 0; i < L; ++i) s += ql[(t * H + h) * L + i] * c[j * L + i];
          for (int i = 0; i < dr; ++i) s += qR[(t * H + h) * dr + i] * kR[j * dr + i];
          z.push_back(cfg.softmax_scale() * s);
        }
        const double m = *std::max_element(z.begin(), z.end());
        double den = 0;
        for (double& v : z) den += (v = std::exp(v - m));
        for (int i = 0; i < L; ++i) {
          double o = 0;
          for (int j = t0; j <= t; ++j) o += z[j - t0] * c[j * L + i];
          const double got = olat[(t * H + h) * L + i];
          if (!(std::fabs(o / den - got) <= kNoise * (1 + scale)))
            return "layer " + std::to_string(l) + " token " + std::to_string(t) + " head " +
                   std::to_string(h) + ": sparse " + std::to_string(got) + " vs dense " +
                   std::to_string(o / den);
        }
      }
    }
  }
  return "";
}

std::string check_shared_layers(const Config& cfg, const std::vector<gen::Req>& reqs,
                                const Corrupt& corrupt = {}) {
  Config all_f = cfg;
  all_f.index_topk_pattern = std::string(cfg.num_layers, 'F');
  const auto w = weights_for(cfg, 15);
  auto wf = std::make_shared<Weights>(Weights::generate(all_f, 15));
  for (int l = 0; l < cfg.num_layers; ++l)  // MLA weights are named alike: they must match
    if (wf->layers[l].w_o != w->layers[l].w_o) return "weights differ between patterns";
  const Run a = run_batch(cfg, w, 15, reqs, {});
  std::vector<StepOptions> opts;
  for (const StepTrace& t : a.traces) {
    StepOptions o;
    o.topk_override.resize(cfg.num_layers);
    for (int l = 1; l < cfg.num_layers; ++l)
      if (!cfg.is_full_layer(l)) o.topk_override[l] = topk_rows(t.layers[l]);
    opts.push_back(std::move(o));
  }
  Run b = run_batch(all_f, wf, 15, reqs, {}, 0, Poison::nan, opts);
  apply(corrupt, b);
  return compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), 0.0);
}

std::string check_rope_shift(const Config& cfg, const std::vector<gen::Req>& reqs, int shift,
                             const Corrupt& corrupt = {}) {
  const auto w = weights_for(cfg, 16);
  const Run a = run_batch(cfg, w, 16, reqs, {});
  std::vector<StepOptions> opts;
  for (const StepTrace& t : a.traces) {
    StepOptions o = StepOptions::follow(cfg, t);  // near-tie sets may legally flip: keep A's
    o.rope_position_offset = shift;
    opts.push_back(std::move(o));
  }
  Run b = run_batch(cfg, w, 16, reqs, {}, 0, Poison::nan, opts);
  apply(corrupt, b);
  // fp32 angles (MATH.md): |angle error| <= 2^-24 (p + shift) per rotation; allow 2^-16 (p_max +
  // shift) relative, which also covers bf16 cos/sin tables and e4m3 code flips of the fp8 cache.
  int p_max = 0;
  for (const gen::Req& r : reqs) p_max = std::max(p_max, r.prefill + r.q);
  const double rel = 0x1p-16 * (p_max + shift) + (cfg.rope_table == RopeTable::bf16 ? 0x1p-6 : 0) +
                     (cfg.kv_cache == KvCache::fp8_ds_mla ? 0x1p-3 : 0);
  return compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), rel);
}

std::string check_pow2_head_weights(const Config& cfg, const std::vector<gen::Req>& reqs, int k,
                                    const Corrupt& corrupt = {}) {
  const auto w = weights_for(cfg, 17);
  auto scaled = std::make_shared<Weights>(*w);
  for (LayerWeights& lw : scaled->layers)
    if (lw.indexer) lw.indexer->w_w *= std::ldexp(1.0, k);
  const Run a = run_batch(cfg, w, 17, reqs, {});
  Run b = run_batch(cfg, scaled, 17, reqs, {});
  apply(corrupt, b);
  for (std::size_t s = 0; s < a.traces.size(); ++s)
    for (int l = 0; l < cfg.num_layers; ++l)
      if (a.traces[s].layers[l].at("topk").data != b.traces[s].layers[l].at("topk").data)
        return "step " + std::to_string(s) + " layer " + std::to_string(l) + ": sets changed";
  return compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), 0.0);
}

std::string check_head_permutation(const Config& cfg, const std::vector<gen::Req>& reqs,
                                   const std::vector<int>& perm, const Corrupt& corrupt = {}) {
  const int H = cfg.num_heads, dq = cfg.qk_head_dim(), dkv = cfg.qk_nope_head_dim + cfg.v_head_dim,
            dv = cfg.v_head_dim, L = cfg.kv_lora_rank;
  const auto w = weights_for(cfg, 18);
  auto pw = std::make_shared<Weights>(*w);
  for (std::size_t l = 0; l < w->layers.size(); ++l)
    for (int h = 0; h < H; ++h) {  // new head h is old head perm[h]
      pw->layers[l].w_q_b.middleRows(h * dq, dq) = w->layers[l].w_q_b.middleRows(perm[h] * dq, dq);
      pw->layers[l].w_kv_b.middleRows(h * dkv, dkv) =
          w->layers[l].w_kv_b.middleRows(perm[h] * dkv, dkv);
      pw->layers[l].w_o.middleCols(h * dv, dv) = w->layers[l].w_o.middleCols(perm[h] * dv, dv);
    }
  const Run a = run_batch(cfg, w, 18, reqs, {});
  Run b = run_batch(cfg, pw, 18, reqs, {});
  apply(corrupt, b);
  testing::Rows unpermuted;
  for (const auto& [k, vb] : rows_of(b, 0, "olat")) {
    std::vector<double>& v = unpermuted[k];
    v.resize(vb.size());
    for (int h = 0; h < H; ++h) std::copy_n(vb.begin() + h * L, L, v.begin() + perm[h] * L);
  }
  if (auto e = compare_rows(rows_of(a, 0, "olat"), unpermuted, kNoise); !e.empty())
    return "layer 0 olat, heads mapped back: " + e;
  return compare_rows(rows_of(a, -1, ""), rows_of(b, -1, ""), kNoise);
}

std::string check_tp_shards(const Config& cfg, const std::vector<gen::Req>& reqs, int tp,
                            const Corrupt& corrupt = {}) {
  const auto w = weights_for(cfg, 19);
  const Run full = run_batch(cfg, w, 19, reqs, {});
  const Config shard_cfg = cfg.tp_shard(tp);
  const int per = cfg.num_heads / tp;
  std::vector<Run> shards;
  for (int r = 0; r < tp; ++r) {
    auto sw = std::make_shared<Weights>();
    sw->layers.push_back(w->head_shard(cfg, 0, r * per, (r + 1) * per));
    shards.push_back(run_batch(shard_cfg, sw, 19, reqs, {}));
  }
  apply(corrupt, shards[0]);
  testing::Rows sum = rows_of(shards[0], 0, "y");
  for (int r = 1; r < tp; ++r)
    for (auto& [k, v] : rows_of(shards[r], 0, "y"))
      for (std::size_t i = 0; i < v.size(); ++i) sum[k][i] += v[i];
  return compare_rows(rows_of(full, 0, "y"), sum, kNoise);
}

std::string check_absorbed_is_mha(const Config& cfg, const std::vector<gen::Req>& reqs,
                                  const Corrupt& corrupt = {}) {
  std::vector<gen::Req> fresh = reqs;
  for (gen::Req& r : fresh) r.prefill = 0;
  const auto w = weights_for(cfg, 20);
  Run run = run_batch(cfg, w, 20, fresh, {});
  apply(corrupt, run);
  const StepInput& in = run.inputs.back();
  const LayerTrace& lt = run.traces.back().layers[0];
  const LayerWeights& lw = w->layers[0];
  const int H = cfg.num_heads, L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim,
            dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim, T = in.num_tokens, K = cfg.index_topk;
  Mat c(T, L), kR(T, dr), qR(T, H * dr), qc(T, cfg.q_lora_rank);
  std::copy(lt.at("c").data.begin(), lt.at("c").data.end(), c.data());
  std::copy(lt.at("kR").data.begin(), lt.at("kR").data.end(), kR.data());
  std::copy(lt.at("qR").data.begin(), lt.at("qR").data.end(), qR.data());
  std::copy(lt.at("q_c").data.begin(), lt.at("q_c").data.end(), qc.data());
  const Mat q = qc * lw.w_q_b.transpose();
  const auto& o = lt.at("o").data;
  double scale = 0;
  for (double v : o) scale = std::max(scale, std::fabs(v));
  for (int h = 0; h < H; ++h) {
    const Mat k = c * lw.w_kv_b.middleRows(h * (dn + dv), dn).transpose();
    const Mat v = c * lw.w_kv_b.middleRows(h * (dn + dv) + dn, dv).transpose();
    for (int t = 0; t < T; ++t) {
      const int base = in.token_start[in.request_of_token[t]];
      std::vector<int> sel;
      for (int j = 0; j < K; ++j)
        if (const double s = lt.at("topk").data[t * K + j]; s >= 0)
          sel.push_back(base + static_cast<int>(s));
      std::vector<double> z;
      for (int j : sel)
        z.push_back(cfg.softmax_scale() * (q.row(t).segment(h * (dn + dr), dn).dot(k.row(j)) +
                                           qR.row(t).segment(h * dr, dr).dot(kR.row(j))));
      const double m = *std::max_element(z.begin(), z.end());
      double den = 0;
      for (double& x : z) den += (x = std::exp(x - m));
      for (int d = 0; d < dv; ++d) {
        double acc = 0;
        for (std::size_t j = 0; j < sel.size(); ++j) acc += z[j] * v(sel[j], d);
        if (!(std::fabs(acc / den - o[t * H * dv + h * dv + d]) <= kNoise * (1 + scale)))
          return "token " + std::to_string(t) + " head " + std::to_string(h) + ": MHA " +
                 std::to_string(acc / den) + " vs absorbed " +
                 std::to_string(o[t * H * dv + h * dv + d]);
      }
    }
  }
  return "";
}

// --- properties -----------------------------------------------------------------------------

RC_GTEST_PROP(OracleProperty, BatchCompositionAndOrderDoNotChangeARequest, ()) {
  const Config cfg = *gen::config();
  const auto reqs = *gen::batch();
  RC_ASSERT(check_batch_invariance(cfg, reqs, *gen::permutation(static_cast<int>(reqs.size()))) ==
            "");
}

RC_GTEST_PROP(OracleProperty, PaddingChangesNoRealRow, ()) {
  const Config cfg = *gen::config();
  const auto reqs = *gen::batch();
  const int pad = *rc::gen::inRange(1, 17);
  const Poison poison = *rc::gen::element(Poison::nan, Poison::huge);
  RC_ASSERT(check_padding(cfg, reqs, pad, poison) == "");
}

RC_GTEST_PROP(OracleProperty, ChunkedPrefillEqualsOneShot, ()) {
  const Config cfg = *gen::config();
  const int total = *rc::gen::inRange(2, 80);
  const auto cuts =
      *rc::gen::container<std::vector<int>>(*rc::gen::inRange(1, 4), rc::gen::inRange(1, total));
  auto sorted = cuts;
  std::sort(sorted.begin(), sorted.end());
  RC_ASSERT(check_chunked_prefill(cfg, total, sorted) == "");
}

RC_GTEST_PROP(OracleProperty, VerifyStepEqualsTheSameTokensDecodedOneAtATime, ()) {
  const Config cfg = *gen::config();
  const int ctx = *rc::gen::inRange(1, 3 * cfg.index_topk + 8);  // past K, usually
  const int q = *rc::gen::inRange(2, 5);
  RC_ASSERT(check_verify(cfg, ctx, q) == "");
}

RC_GTEST_PROP(OracleProperty, SparseEqualsDenseWhenEveryPositionFits, ()) {
  Config cfg = *gen::config();
  const auto reqs = *gen::batch();
  int longest = 0;
  for (const gen::Req& r : reqs) longest = std::max(longest, r.q);
  cfg.index_topk = longest + *rc::gen::inRange(0, 4);  // every p + 1 <= K
  RC_ASSERT(check_sparse_is_dense(cfg, reqs) == "");
}

RC_GTEST_PROP(OracleProperty, SharedLayerEqualsRecomputingWithItsFullLayersSets, ()) {
  Config cfg = *gen::config(*rc::gen::inRange(2, 4));
  cfg.index_topk_pattern[1] = 'S';
  RC_ASSERT(check_shared_layers(cfg, *gen::batch()) == "");
}

RC_GTEST_PROP(OracleProperty, RopeShiftLeavesOutputsUnchangedUpToRounding, ()) {
  const Config cfg = *gen::config();
  RC_ASSERT(check_rope_shift(cfg, *gen::batch(), *rc::gen::inRange(1, 513)) == "");
}

RC_GTEST_PROP(OracleProperty, PowerOfTwoHeadWeightScalingKeepsTheSets, ()) {
  const Config cfg = *gen::config();
  RC_ASSERT(check_pow2_head_weights(cfg, *gen::batch(), *rc::gen::inRange(-4, 5)) == "");
}

RC_GTEST_PROP(OracleProperty, HeadPermutationPermutesOutputs, ()) {
  const Config cfg = *gen::config(1);
  RC_ASSERT(check_head_permutation(cfg, *gen::batch(), *gen::permutation(cfg.num_heads)) == "");
}

RC_GTEST_PROP(OracleProperty, TensorParallelShardsSumToTheUnshardedOutput, ()) {
  Config cfg = *gen::config(1);
  const int tp = *rc::gen::element(2, 4);
  cfg.num_heads = tp * *rc::gen::inRange(1, 3);
  RC_ASSERT(check_tp_shards(cfg, *gen::batch(), tp) == "");
}

RC_GTEST_PROP(OracleProperty, AbsorbedMqaEqualsExplicitMha, ()) {
  RC_ASSERT(check_absorbed_is_mha(*gen::config(1), *gen::batch()) == "");
}

RC_GTEST_PROP(OracleProperty, TopkCheckerAcceptsOwnSetsAndRejectsASwap, ()) {
  const std::vector<double> scores = *gen::tie_stress_scores();
  const int K = *rc::gen::inRange(1, 40);
  const std::vector<int> row = select_topk(scores, K);
  RC_ASSERT(check_topk_row(row, scores, K, 0.0) == "");
  const int n = static_cast<int>(scores.size());
  if (n <= K) return;
  // Swap the worst chosen position for a strictly worse unchosen one, when there is one.
  int worst = row[0];
  for (int k = 0; k < K; ++k)
    if (scores[row[k]] < scores[worst]) worst = row[k];
  std::vector<bool> chosen(n);
  for (int k = 0; k < K; ++k) chosen[row[k]] = true;
  for (int j = 0; j < n; ++j)
    if (!chosen[j] && scores[j] < scores[worst]) {
      std::vector<int> bad = row;
      *std::find(bad.begin(), bad.end(), worst) = j;
      RC_ASSERT(check_topk_row(bad, scores, K, 0.0) != "");
      return;
    }
}

// --- each check can fail --------------------------------------------------------------------

Config fixed_config() {
  Config c = preset("tiny-fs");
  c.num_heads = 4;
  return c;
}
const std::vector<gen::Req> kBatch{{12, 1}, {3, 4}, {0, 6}};

TEST(OraclePropertyCanFail, EveryCheckRejectsACorruptedOutput) {
  const Config cfg = fixed_config();
  Config one = cfg;
  one.num_layers = 1;
  one.index_topk_pattern = "F";
  const auto bump = bump_output();
  EXPECT_NE(check_batch_invariance(cfg, kBatch, {2, 0, 1}, bump), "");
  EXPECT_NE(check_padding(cfg, kBatch, 5, Poison::nan, bump), "");
  EXPECT_NE(check_chunked_prefill(cfg, 20, {7, 13}, bump), "");
  EXPECT_NE(check_verify(cfg, 20, 3, bump), "");
  EXPECT_NE(check_shared_layers(cfg, kBatch, bump), "");
  EXPECT_NE(check_rope_shift(cfg, kBatch, 100, bump), "");
  EXPECT_NE(check_pow2_head_weights(cfg, kBatch, 3, bump), "");
  EXPECT_NE(check_head_permutation(one, kBatch, {1, 0, 3, 2}, bump), "");
  EXPECT_NE(check_tp_shards(one, kBatch, 2,
                            [](std::vector<StepTrace>& t) {
                              t.back().layers[0].tensors.back().data[3] +=
                                  0.5;  // y of the first shard
                            }),
            "");
  const Corrupt olat = [](std::vector<StepTrace>& t) {
    const_cast<Tensor&>(t.back().layers[0].at("olat")).data[5] += 0.5;
  };
  Config dense = cfg;
  dense.index_topk = 16;
  EXPECT_NE(check_sparse_is_dense(dense, kBatch, olat), "");
  EXPECT_NE(check_absorbed_is_mha(one, kBatch,
                                  [](std::vector<StepTrace>& t) {
                                    const_cast<Tensor&>(t.back().layers[0].at("o")).data[2] += 0.5;
                                  }),
            "");
}

TEST(OraclePropertyCanFail, SetSensitiveChecksNoticeAChangedSelection) {
  // A different index set must be caught where the property says the sets are unchanged.
  const Config cfg = fixed_config();
  const Corrupt swap_set = [](std::vector<StepTrace>& t) {
    auto& topk = const_cast<Tensor&>(t.back().layers[0].at("topk"));
    topk.data[0] = topk.data[0] == 0 ? 1 : 0;
  };
  EXPECT_NE(check_pow2_head_weights(cfg, kBatch, 1, swap_set), "");
}

}  // namespace
}  // namespace dsv32

// Decode context parallelism in the oracle (MATH.md, "Context-parallel shards"): the layout, the
// exact and union top-k, the merge, and the sharded layer against the unsharded one: W = 1 bit
// for bit, W = 2, 4, 8 within the merge's bound; each check fed a corrupted run must fail.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/dcp.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "support/runs.hpp"

namespace dsv32 {
namespace {

using testing::batch_inputs;
using testing::blocks_for;
using testing::compare_rows;
using testing::rows_of;
using Runs = testing::Run;  // gtest's Test::Run hides a plain `Run` in a test body

constexpr double kNoise = 1e-9;  // fp64 summation-order noise, relative to the tensor's max
const double kInf = std::numeric_limits<double>::infinity();

Runs run(const Config& cfg, Mode mode, const std::vector<gen::Req>& reqs, StepOptions opts = {}) {
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 31));
  Oracle oracle(cfg, w, mode, blocks_for(cfg, reqs));
  Runs out;
  out.inputs = batch_inputs(cfg, 31, reqs, {});
  for (const StepInput& in : out.inputs) out.traces.push_back(oracle.step(in, opts));
  return out;
}

/// "" when every stage of every layer and the output are the same bits.
std::string same_bits(const Runs& a, const Runs& b) {
  for (std::size_t s = 0; s < a.traces.size(); ++s) {
    const StepTrace &x = a.traces[s], &y = b.traces[s];
    for (std::size_t l = 0; l < x.layers.size(); ++l)
      for (std::size_t i = 0; i < x.layers[l].tensors.size(); ++i) {
        const Tensor &u = x.layers[l].tensors[i], &v = y.layers[l].tensors.at(i);
        for (std::size_t e = 0; e < u.data.size(); ++e)
          if (std::memcmp(&u.data[e], &v.data.at(e), sizeof(double)) != 0)
            return "step " + std::to_string(s) + " layer " + std::to_string(l) + " " + u.name +
                   " element " + std::to_string(e) + ": " + std::to_string(u.data[e]) + " vs " +
                   std::to_string(v.data[e]);
      }
    if (x.output.data != y.output.data) return "step " + std::to_string(s) + " output differs";
  }
  return "";
}

/// "" when each rank's share of each row is S_t's owned positions as local slots of that rank's
/// table (every layer, every step): the shares partition S_t.
std::string check_shares(const Config& cfg, const Runs& r, DcpTables tables, int num_blocks) {
  const DcpLayout lay = DcpLayout::of(cfg);
  const int B = cfg.block_size, K = cfg.index_topk;
  for (std::size_t s = 0; s < r.traces.size(); ++s) {
    const StepInput& in = r.inputs[s];
    for (std::size_t l = 0; l < r.traces[s].layers.size(); ++l) {
      const LayerTrace& lt = r.traces[s].layers[l];
      if (!lt.dcp) return "layer " + std::to_string(l) + " has no DCP trace";
      for (int t = 0; t < in.num_tokens; ++t) {
        const int req = in.request_of_token[t];
        std::multiset<std::int64_t> want, got;
        for (int k = 0; k < K; ++k)
          if (const std::int64_t p = lt.dcp->rows[0](t, k); p >= 0) want.insert(p);
        for (int rank = 0; rank < lay.world; ++rank) {
          const std::vector<int> table =
              dcp_block_table(in.requests[req].block_table, in.requests[req].seq_len(), cfg, tables,
                              num_blocks, rank);
          for (int k = 0; k < K; ++k) {
            const std::int64_t slot = lt.dcp->share[rank](t, k);
            if (slot < 0) continue;
            const auto blk = std::find(table.begin(), table.end(), slot / B);
            if (blk == table.end())
              return "rank " + std::to_string(rank) + " row " + std::to_string(t) + ": slot " +
                     std::to_string(slot) + " is not in its table";
            got.insert(lay.global(rank, (blk - table.begin()) * B + slot % B));
          }
        }
        if (got != want)
          return "step " + std::to_string(s) + " layer " + std::to_string(l) + " row " +
                 std::to_string(t) + ": the ranks' shares are not S_t";
      }
    }
  }
  return "";
}

// --- the layout -----------------------------------------------------------------------------

TEST(DcpLayout, TwoRanksOfTwoPositionsInterleave) {
  const DcpLayout lay{2, 2};
  const int owner[] = {0, 0, 1, 1, 0, 0, 1, 1}, local[] = {0, 1, 0, 1, 2, 3, 2, 3};
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(lay.owner(p), owner[p]) << p;
    EXPECT_EQ(lay.local(p), local[p]) << p;
  }
  EXPECT_EQ(lay.owned(7, 0), 4);
  EXPECT_EQ(lay.owned(7, 1), 3);
}

RC_GTEST_PROP(DcpLayout, OwnerAndLocalMapPositionsOntoEachRanksDenseLocalPositions, ()) {
  const DcpLayout lay{*rc::gen::inRange(1, 9), *rc::gen::inRange(1, 9)};
  const int n = *rc::gen::inRange(0, 400);
  std::vector<std::set<std::int64_t>> locals(lay.world);
  for (int p = 0; p < n; ++p) {
    const int r = lay.owner(p);
    RC_ASSERT(lay.global(r, lay.local(p)) == p);
    RC_ASSERT(locals[r].insert(lay.local(p)).second);
  }
  for (int r = 0; r < lay.world; ++r) {
    RC_ASSERT(static_cast<std::int64_t>(locals[r].size()) == lay.owned(n, r));
    if (!locals[r].empty()) RC_ASSERT(*locals[r].rbegin() == lay.owned(n, r) - 1);
  }
}

RC_GTEST_PROP(DcpLayout, VllmsSharedBlockIdIsThePositionsSchedulerBlock, ()) {
  const int I = *rc::gen::inRange(1, 9), B = I * *rc::gen::inRange(1, 9);
  const DcpLayout lay{*rc::gen::inRange(1, 9), I};
  for (int p = 0; p < 600; ++p) RC_ASSERT(lay.local(p) / B == p / (B * lay.world));
}

TEST(DcpConfig, LayoutsVllmRefusesAreRefusedByName) {
  Config c = preset("tiny");
  c.block_size = 64;
  c.dcp_size = 2;
  c.dcp_interleave = 48;
  try {
    c.validate();
    FAIL() << "an interleave that does not divide the block was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dcp_interleave"), std::string::npos) << e.what();
  }
  c.dcp_interleave = 64;
  EXPECT_NO_THROW(c.validate());
  c.dcp_size = 0;
  EXPECT_THROW(c.validate(), ConfigError);
  c.dcp_size = 4;
  c.num_heads = 4;
  EXPECT_THROW(c.tp_shard(2), ConfigError);  // a DCP group is 4 ranks of a TP group of 2
  EXPECT_EQ(c.tp_shard(4).num_heads, 1);
  EXPECT_EQ(c.tp_shard(1), c);  // no group: the ranks emulated in one process
}

// --- top-k ----------------------------------------------------------------------------------

RC_GTEST_PROP(DcpTopk, ExactModeGivesEveryRankStep7sSetOnTieHeavyRows, ()) {
  const std::vector<double> scores = *gen::tie_stress_scores();
  const int K = *rc::gen::inRange(1, 40);
  const DcpLayout lay{*rc::gen::inRange(1, 9), *rc::gen::inRange(1, 5)};
  const std::vector<int> want = select_topk(scores, K);
  for (int r = 0; r < lay.world; ++r)
    RC_ASSERT(dcp_select_topk(scores, K, lay, DcpIndexerMode::exact, r) == want);
}

RC_GTEST_PROP(DcpTopk, UnionModeGivesEachRankTheBestOfItsOwnKeys, ()) {
  const std::vector<double> scores = *gen::tie_stress_scores();
  const int K = *rc::gen::inRange(1, 40), n = static_cast<int>(scores.size());
  const DcpLayout lay{*rc::gen::inRange(2, 9), *rc::gen::inRange(1, 5)};
  std::set<int> all;
  for (int r = 0; r < lay.world; ++r) {
    const std::vector<int> row = dcp_select_topk(scores, K, lay, DcpIndexerMode::union_, r);
    std::vector<int> mine, chosen;
    std::vector<double> owned_scores;
    for (int j = 0; j < n; ++j)
      if (lay.owner(j) == r) {
        mine.push_back(j);
        owned_scores.push_back(scores[j]);
      }
    // The row is the rank's own step 7 over its owned keys, renumbered.
    const std::vector<int> own = select_topk(owned_scores, K);
    for (int k = 0; k < K; ++k) RC_ASSERT(row[k] == (own[k] < 0 ? -1 : mine[own[k]]));
    for (int p : row)
      if (p >= 0) all.insert(p);
  }
  // Every global winner is among its owner's own best (why `exact` can exchange local top-Ks).
  for (int p : select_topk(scores, K))
    if (p >= 0) RC_ASSERT(all.count(p) == 1u);
}

// --- the merge ------------------------------------------------------------------------------

TEST(DcpMerge, OneRankIsItselfAndEmptyRanksAddExactlyNothing) {
  const int H = 2, L = 3;
  const double olat0[] = {0.25, -1.5, 3.0, 7.0, 0.5, -0.125}, lse0[] = {1.75, -2.5};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double junk[] = {nan, nan, nan, nan, nan, nan};
  double olat[H * L], lse[H];
  for (bool round : {false, true}) {
    dcp_merge_row({olat0}, {lse0}, H, L, round, olat, lse);
    EXPECT_EQ(std::memcmp(olat, olat0, sizeof olat), 0);
    EXPECT_EQ(std::memcmp(lse, lse0, sizeof lse), 0);
    for (double empty : {-kInf, kInf, nan}) {  // ours, FlashMLA's, and vLLM's NaN
      const double lse1[] = {empty, empty};
      dcp_merge_row({junk, olat0}, {lse1, lse0}, H, L, round, olat, lse);
      EXPECT_EQ(std::memcmp(olat, olat0, sizeof olat), 0) << empty;
      EXPECT_EQ(std::memcmp(lse, lse0, sizeof lse), 0) << empty;
    }
  }
  const double none[] = {-kInf, kInf};
  dcp_merge_row({junk}, {none}, H, L, false, olat, lse);
  for (double v : olat) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(lse[1], -kInf);
}

TEST(DcpMerge, TwoRanksWeighByTheirNaturalLogSumExp) {
  const double a[] = {1.0}, b[] = {3.0}, la[] = {0.0}, lb[] = {std::log(3.0)};
  double olat, lse;
  dcp_merge_row({a, b}, {la, lb}, 1, 1, false, &olat, &lse);
  EXPECT_NEAR(lse, std::log(4.0), 1e-15);
  EXPECT_NEAR(olat, 0.25 * 1.0 + 0.75 * 3.0, 1e-15);
}

// --- the sharded layer ----------------------------------------------------------------------

rc::Gen<Config> dcp_config() {
  return rc::gen::exec([] {
    Config c = *gen::config();
    c.dcp_size = *rc::gen::element(2, 4, 8);
    const int I = *rc::gen::element(1, 2, 3);
    c.block_size = I * *rc::gen::inRange(1, 4);
    c.dcp_interleave = I;
    c.validate();
    return c;
  });
}

RC_GTEST_PROP(DcpOracle, OneRankGivesTheUnshardedBits, ()) {
  const Config cfg = *gen::config();
  const auto reqs = *gen::batch();
  const Mode mode = *rc::gen::element(Mode::exact, Mode::emulated);
  StepOptions dcp;
  dcp.dcp_path = true;
  dcp.dcp_tables = *rc::gen::element(DcpTables::shared, DcpTables::distinct);
  const Runs plain = run(cfg, mode, reqs), one = run(cfg, mode, reqs, dcp);
  RC_ASSERT(same_bits(plain, one) == "");
  RC_ASSERT(check_shares(cfg, one, dcp.dcp_tables, blocks_for(cfg, reqs)) == "");
}

/// "" when the DCP run `d` is the unsharded run `u` up to fp64 merge noise: every layer's top-k
/// the same, olat, lse and the output within kNoise, and the shares S_t's.
std::string check_sharded(const Config& cfg, const Runs& u, const Runs& d, DcpTables tables,
                          int num_blocks) {
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (const char* stage : {"olat", "lse", "y"})
      if (auto e = compare_rows(rows_of(u, l, stage), rows_of(d, l, stage), kNoise); !e.empty())
        return "layer " + std::to_string(l) + " " + stage + ": " + e;
    if (rows_of(u, l, "topk") != rows_of(d, l, "topk"))
      return "layer " + std::to_string(l) + ": the top-k sets differ";
  }
  if (auto e = compare_rows(rows_of(u, -1, ""), rows_of(d, -1, ""), kNoise); !e.empty())
    return "output: " + e;
  return check_shares(cfg, d, tables, num_blocks);
}

RC_GTEST_PROP(DcpOracle, ExactModeShardsMergeToTheUnshardedLayer, ()) {
  const Config cfg = *dcp_config();
  Config plain = cfg;
  plain.dcp_size = 1;
  plain.dcp_interleave = 1;
  const auto reqs = *gen::batch();
  StepOptions opts;
  opts.dcp_tables = *rc::gen::element(DcpTables::shared, DcpTables::distinct);
  RC_ASSERT(check_sharded(cfg, run(plain, Mode::exact, reqs), run(cfg, Mode::exact, reqs, opts),
                          opts.dcp_tables, blocks_for(cfg, reqs)) == "");
}

/// "" when each bf16 olat of layer 0 (the same inputs either way) of a step without context is
/// within the merge's bound of the unsharded one: (W + 4) 2^-9 max_j |c_j[i]| over the row's
/// selected keys j (each rank's P and olat rounding, each rescaled partial's and partial sum's,
/// and the unsharded layer's own two).
std::string check_bf16_merge(const Config& cfg, const Runs& u, const Runs& d) {
  const int H = cfg.num_heads, L = cfg.kv_lora_rank, W = cfg.dcp_size, K = cfg.index_topk;
  const StepInput& in = u.inputs.back();
  const LayerTrace &lu = u.traces.back().layers[0], &ld = d.traces.back().layers[0];
  const Tensor &c = lu.at("c"), &ou = lu.at("olat"), &od = ld.at("olat");
  const TopkRows S = topk_rows(lu);
  int compared = 0;
  for (int t = 0; t < in.num_tokens; ++t) {
    const int req = in.request_of_token[t];
    if (in.requests[req].ctx != 0) return "a request with context: its keys are not at hand";
    std::vector<double> m(L, 0.0);
    for (int k = 0; k < K; ++k)
      if (const int p = S(t, k); p >= 0)
        for (int i = 0; i < L; ++i)
          m[i] = std::max(m[i], std::fabs(c.data[(in.token_start[req] + p) * L + i]));
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < L; ++i) {
        const std::size_t e = (static_cast<std::size_t>(t) * H + h) * L + i;
        const double diff = std::fabs(ou.data[e] - od.data[e]);
        if (!(diff <= (W + 4) * 0x1p-9 * m[i]))
          return "row " + std::to_string(t) + " head " + std::to_string(h) + " element " +
                 std::to_string(i) + ": " + std::to_string(od.data[e]) + " vs " +
                 std::to_string(ou.data[e]) + " (bound " + std::to_string((W + 4) * 0x1p-9 * m[i]) +
                 ")";
        ++compared;
      }
  }
  return compared ? "" : "nothing compared";
}

RC_GTEST_PROP(DcpOracle, Bf16ShardsMergeWithinTheMergesBound, ()) {
  Config cfg = *dcp_config();
  cfg.precision = Precision::bf16;
  Config plain = cfg;
  plain.dcp_size = 1;
  plain.dcp_interleave = 1;
  std::vector<gen::Req> reqs = *gen::batch();
  for (gen::Req& r : reqs) r.prefill = 0;
  RC_ASSERT(check_bf16_merge(cfg, run(plain, Mode::emulated, reqs),
                             run(cfg, Mode::emulated, reqs)) == "");
}

/// The same TP shards (heads split, y summed) under DCP and without: each is its layer.
RC_GTEST_PROP(DcpOracle, TensorParallelShardsUnderDcpSumToTheDcpLayer, ()) {
  Config cfg = *gen::config(1);
  const int tp = *rc::gen::element(2, 4);
  cfg.num_heads = tp * *rc::gen::inRange(1, 3);
  cfg.dcp_size = *rc::gen::element(2, tp);
  const auto reqs = *gen::batch();
  const Runs full = run(cfg, Mode::exact, reqs);
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 31));
  const Config shard = cfg.tp_shard(tp);
  const int per = cfg.num_heads / tp;
  testing::Rows sum;
  for (int r = 0; r < tp; ++r) {
    auto sw = std::make_shared<Weights>();
    sw->layers.push_back(w->head_shard(cfg, 0, r * per, (r + 1) * per));
    Oracle o(shard, sw, Mode::exact, blocks_for(cfg, reqs));
    Runs part;
    part.inputs = batch_inputs(shard, 31, reqs, {});
    for (const StepInput& in : part.inputs) part.traces.push_back(o.step(in));
    for (auto& [k, v] : rows_of(part, 0, "y")) {
      std::vector<double>& acc = sum[k];
      acc.resize(v.size(), 0.0);
      for (std::size_t i = 0; i < v.size(); ++i) acc[i] += v[i];
    }
  }
  RC_ASSERT(compare_rows(rows_of(full, 0, "y"), sum, kNoise) == "");
}

// --- each check can fail --------------------------------------------------------------------

Config fixed_dcp_config(int W) {
  Config c = preset("tiny-fs");
  c.num_heads = 4;
  c.block_size = 4;
  c.dcp_size = W;
  c.dcp_interleave = 2;
  return c;
}
const std::vector<gen::Req> kBatch{{40, 1}, {3, 4}, {0, 20}};

TEST(DcpOracleCanFail, EveryCheckRejectsACorruptedRun) {
  const Config cfg = fixed_dcp_config(4);
  Config plain = cfg;
  plain.dcp_size = 1;
  plain.dcp_interleave = 1;
  const int blocks = blocks_for(cfg, kBatch);
  const Runs u = run(plain, Mode::exact, kBatch);
  Runs d = run(cfg, Mode::exact, kBatch);
  ASSERT_EQ(check_sharded(cfg, u, d, DcpTables::shared, blocks), "");
  // A share read through another rank's table; a share missing a key; an olat off.
  EXPECT_NE(check_shares(cfg, d, DcpTables::distinct, blocks), "");
  Runs lost = d;
  for (auto& lt : lost.traces.back().layers)
    for (int rank = 0; rank < cfg.dcp_size; ++rank) lt.dcp->share[rank](0, 0) = -1;
  EXPECT_NE(check_shares(cfg, lost, DcpTables::shared, blocks), "");
  Runs bumped = d;
  const_cast<Tensor&>(bumped.traces.back().layers[0].at("olat")).data[5] += 1e-6;
  EXPECT_NE(check_sharded(cfg, u, bumped, DcpTables::shared, blocks), "");
  EXPECT_NE(same_bits(u, bumped), "");

  // The bf16 bound fails an LSE merged in base 2 (the partials' LSEs read as log2).
  Config bf = cfg;
  bf.precision = Precision::bf16;
  Config bf_plain = plain;
  bf_plain.precision = Precision::bf16;
  std::vector<gen::Req> fresh = kBatch;
  for (gen::Req& r : fresh) r.prefill = 0;
  const Runs bu = run(bf_plain, Mode::emulated, fresh);
  Runs bd = run(bf, Mode::emulated, fresh);
  ASSERT_EQ(check_bf16_merge(bf, bu, bd), "");
  const int H = bf.num_heads, L = bf.kv_lora_rank;
  LayerTrace& lt = bd.traces.back().layers[0];
  Tensor& olat = const_cast<Tensor&>(lt.at("olat"));
  for (int t = 0; t < bd.inputs.back().num_tokens; ++t) {
    std::vector<const double*> po, pl;
    std::vector<std::vector<double>> base2(bf.dcp_size);
    for (int rank = 0; rank < bf.dcp_size; ++rank) {
      for (int h = 0; h < H; ++h) base2[rank].push_back(lt.dcp->lse[rank](t, h) / std::log(2.0));
      po.push_back(&lt.dcp->olat[rank](t, 0));
      pl.push_back(base2[rank].data());
    }
    std::vector<double> lse(H);
    dcp_merge_row(po, pl, H, L, true, &olat.data[static_cast<std::size_t>(t) * H * L], lse.data());
  }
  EXPECT_NE(check_bf16_merge(bf, bu, bd), "");
}

}  // namespace
}  // namespace dsv32

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rope.hpp"
#include "support/oracle_fixture.hpp"

namespace dsv32 {
namespace {

using testing::max_diff;
using testing::Rig;

Mat rows_of(const Tensor& t, int r0, int n, int width) {
  Mat m(n, width);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < width; ++j) m(i, j) = t.data[static_cast<std::size_t>(r0 + i) * width + j];
  return m;
}

Mat rmsnorm(const Mat& x, const Vec& g, double eps) {
  Mat out(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    out.row(r) = x.row(r).array() /
                 std::sqrt(x.row(r).squaredNorm() / static_cast<double>(x.cols()) + eps) *
                 g.transpose().array();
  return out;
}

TEST(Oracle, HandComputedNormsOnSmallIntegers) {
  Mat x(1, 2);
  x << 3, 4;
  Vec g(2);
  g << 1, 2;
  const Mat y = rmsnorm(x, g, 0.0);
  EXPECT_DOUBLE_EQ(y(0, 0), 3 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(y(0, 1), 8 / std::sqrt(12.5));
}

// The first token of a request attends to itself only: every stage follows from its inputs in
// closed form (softmax over one key is 1, so olat = c and lse = z).
TEST(Oracle, FirstTokenStagesFollowFromTheirInputs) {
  Rig rig(preset("tiny"), 1);
  const Config& c = rig.cfg;
  const StepTrace tr = rig.run({{0, 1}});
  const LayerTrace& lt = tr.layers[0];
  const LayerWeights& w = rig.weights->layers[0];
  const int L = c.kv_lora_rank, H = c.num_heads, dr = c.qk_rope_head_dim, dn = c.qk_nope_head_dim,
            dv = c.v_head_dim;
  const Mat x = rmsnorm(rig.last.hidden.topRows(1), w.g_in, c.rms_norm_eps);
  const Mat qkv = x * w.w_qkv_a.transpose();
  const Mat q_c = rmsnorm(qkv.leftCols(c.q_lora_rank), w.g_q, c.rms_norm_eps);
  const Mat lat = rmsnorm(qkv.middleCols(c.q_lora_rank, L), w.g_kv, c.rms_norm_eps);
  EXPECT_LT((rows_of(lt.at("q_c"), 0, 1, c.q_lora_rank) - q_c).cwiseAbs().maxCoeff(), 1e-13);
  EXPECT_LT((rows_of(lt.at("c"), 0, 1, L) - lat).cwiseAbs().maxCoeff(), 1e-13);
  // Position 0: RoPE is the identity.
  EXPECT_LT((rows_of(lt.at("kR"), 0, 1, dr) - qkv.rightCols(dr)).cwiseAbs().maxCoeff(), 1e-13);
  EXPECT_EQ(lt.at("topk").data[0], 0.0);
  for (int k = 1; k < c.index_topk; ++k) EXPECT_EQ(lt.at("topk").data[k], -1.0);
  const Mat q = q_c * w.w_q_b.transpose();
  Mat o(1, H * dv);
  for (int h = 0; h < H; ++h) {
    const Mat w_uk = w.w_kv_b.middleRows(h * (dn + dv), dn);
    const Mat w_uv = w.w_kv_b.middleRows(h * (dn + dv) + dn, dv);
    const Mat ql = q.middleCols(h * (dn + dr), dn) * w_uk;
    const double z = c.softmax_scale() *
                     ((ql * lat.transpose())(0, 0) +
                      (q.middleCols(h * (dn + dr) + dn, dr) * qkv.rightCols(dr).transpose())(0, 0));
    EXPECT_NEAR(lt.at("lse").data[h], z, 1e-12) << "head " << h;
    for (int j = 0; j < L; ++j) EXPECT_NEAR(lt.at("olat").data[h * L + j], lat(0, j), 1e-13);
    o.middleCols(h * dv, dv) = lat * w_uv.transpose();
  }
  EXPECT_LT((rows_of(lt.at("o"), 0, 1, H * dv) - o).cwiseAbs().maxCoeff(), 1e-12);
  const Mat y = o * w.w_o.transpose();
  EXPECT_LT((rows_of(lt.at("y"), 0, 1, c.hidden_size) - y).cwiseAbs().maxCoeff(), 1e-12);
  const Mat out = rig.last.hidden.topRows(1) + y;
  EXPECT_LT((rows_of(tr.output, 0, 1, c.hidden_size) - out).cwiseAbs().maxCoeff(), 1e-12);
}

// The indexer stages of a first token (position 0: RoPE is the identity) from their inputs:
// LayerNorm of x W_k, ue8m0 fp8 per 128-vector, omega = w * qscale / sqrt(dI * HI).
TEST(Oracle, FirstTokenIndexerStagesFollowFromTheirInputs) {
  for (Hadamard had : {Hadamard::off, Hadamard::on}) {
    Config cfg = preset("tiny");
    cfg.hadamard = had;
    Rig rig(cfg, 8);
    const LayerTrace lt = rig.run({{0, 1}}).layers[0];
    const LayerWeights& w = rig.weights->layers[0];
    const int dI = cfg.index_head_dim, HI = cfg.index_n_heads;
    const Mat x = rmsnorm(rig.last.hidden.topRows(1), w.g_in, cfg.rms_norm_eps);
    const Mat kraw = x * w.indexer->w_k.transpose();
    const double mean = kraw.mean();
    const double var = (kraw.array() - mean).square().mean();
    std::vector<double> k(dI);
    for (int i = 0; i < dI; ++i)
      k[i] = (kraw(0, i) - mean) / std::sqrt(var + cfg.indexer_norm_eps) * w.indexer->g_k[i] +
             w.indexer->b_k[i];
    if (had == Hadamard::on) hadamard_transform(k);
    const Fp8Block kq = quantize_ue8m0(k);
    EXPECT_EQ(lt.at("kI_scale").data[0], kq.scale);
    for (int i = 0; i < dI; ++i)
      ASSERT_EQ(lt.at("kI8").data[i], e4m3_value(kq.codes[i])) << "kI8 " << i;
    const Mat q_c =
        rmsnorm((x * w.w_qkv_a.transpose()).leftCols(cfg.q_lora_rank), w.g_q, cfg.rms_norm_eps);
    const Mat qI = q_c * w.indexer->w_q_b.transpose();
    const Mat wts = x * w.indexer->w_w.transpose();
    for (int h = 0; h < HI; ++h) {
      std::vector<double> q(qI.data() + h * dI, qI.data() + (h + 1) * dI);
      if (had == Hadamard::on) hadamard_transform(q);
      const Fp8Block qq = quantize_ue8m0(q);
      EXPECT_EQ(lt.at("qI_scale").data[h], qq.scale);
      for (int i = 0; i < dI; ++i)
        ASSERT_EQ(lt.at("qI8").data[h * dI + i], e4m3_value(qq.codes[i])) << "head " << h;
      EXPECT_NEAR(lt.at("omega").data[h], wts(0, h) * qq.scale / std::sqrt(double(dI) * HI), 1e-15);
    }
  }
}

// Absorbed MQA (the oracle) equals the explicit MHA form k = W_UK c, v = W_UV c.
TEST(Oracle, AbsorbedMqaEqualsExplicitMha) {
  Config cfg = preset("tiny");
  cfg.index_topk = 64;  // every causal position is selected: dense attention
  Rig rig(cfg, 2);
  const StepTrace tr = rig.run({{0, 9}});
  const LayerTrace& lt = tr.layers[0];
  const LayerWeights& w = rig.weights->layers[0];
  const int T = 9, L = cfg.kv_lora_rank, H = cfg.num_heads, dr = cfg.qk_rope_head_dim,
            dn = cfg.qk_nope_head_dim, dv = cfg.v_head_dim;
  const Mat c = rows_of(lt.at("c"), 0, T, L), kR = rows_of(lt.at("kR"), 0, T, dr);
  const Mat q = rows_of(lt.at("q_c"), 0, T, cfg.q_lora_rank) * w.w_q_b.transpose();
  const Mat qR = rows_of(lt.at("qR"), 0, T, H * dr);
  double worst = 0;
  for (int h = 0; h < H; ++h) {
    const Mat k = c * w.w_kv_b.middleRows(h * (dn + dv), dn).transpose();       // (T, dn)
    const Mat v = c * w.w_kv_b.middleRows(h * (dn + dv) + dn, dv).transpose();  // (T, dv)
    for (int t = 0; t < T; ++t) {
      Eigen::VectorXd z(t + 1);
      for (int j = 0; j <= t; ++j)
        z[j] = cfg.softmax_scale() * (q.row(t).segment(h * (dn + dr), dn).dot(k.row(j)) +
                                      qR.row(t).segment(h * dr, dr).dot(kR.row(j)));
      const Eigen::ArrayXd p = (z.array() - z.maxCoeff()).exp();
      const Eigen::RowVectorXd o = (p.matrix().transpose() * v.topRows(t + 1)) / p.sum();
      for (int d = 0; d < dv; ++d)
        worst = std::max(worst, std::abs(o[d] - lt.at("o").data[t * H * dv + h * dv + d]));
    }
  }
  EXPECT_LT(worst, 1e-12);
}

TEST(Topk, TiesGoToTheSmallerPosition) {
  std::vector<double> s{1.0, 5.0, 3.0, 5.0, 3.0, 3.0, 0.5};
  EXPECT_EQ(select_topk(s, 3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(select_topk(s, 4), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(select_topk(s, 7), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(select_topk({2.0, 1.0}, 4), (std::vector<int>{0, 1, -1, -1}));
  // Tie stress: values that share all but the low bits, and exact ties across the whole row.
  std::vector<double> t(100);
  for (int j = 0; j < 100; ++j) t[j] = 1.0 + (j % 7 == 0 ? 0x1p-52 : 0.0);
  const std::vector<int> sel = select_topk(t, 20);
  std::vector<int> want;
  for (int j = 0; j < 100; j += 7) want.push_back(j);
  for (int j = 1; static_cast<int>(want.size()) < 20; ++j)
    if (j % 7) want.push_back(j);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(sel, want);
  EXPECT_THROW(select_topk({1.0, std::nan(""), 2.0}, 1), std::runtime_error);
}

TEST(Oracle, LongContextSelectsTopKOfRealScores) {
  Rig rig(preset("tiny"), 3);  // K = 8
  rig.run({{0, 20}});
  const StepTrace tr = rig.run({{0, 1}});  // p = 20 > K
  const Tensor& topk = tr.layers[0].at("topk");
  int valid = 0;
  for (double v : topk.data) valid += v >= 0;
  EXPECT_EQ(valid, 8);
  EXPECT_NE(topk.data, (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Oracle, SharedLayersReuseTheFullLayersSets) {
  Rig rig(preset("tiny-fs"), 4);  // FSF
  rig.run({{0, 12}});
  const StepTrace tr = rig.run({{0, 2}, {1, 11}});
  EXPECT_EQ(tr.layers[1].at("topk").data, tr.layers[0].at("topk").data);
  EXPECT_EQ(tr.layers[1].find("qI8"), nullptr);
  EXPECT_NE(tr.layers[2].at("topk").data, tr.layers[0].at("topk").data);
}

TEST(Oracle, ExactAndEmulatedDifferBoundedInBf16AndNotAtAllInFp32) {
  for (Precision p : {Precision::bf16, Precision::fp32}) {
    Config cfg = preset("tiny-fs");
    cfg.precision = p;
    Rig ex(cfg, 5, Mode::exact), em(cfg, 5, Mode::emulated);
    for (const auto& reqs : std::vector<std::vector<StepRequest>>{{{0, 6}}, {{0, 1}, {1, 4}}}) {
      const StepTrace a = ex.run(reqs), b = em.run(reqs);
      const double d = max_diff(a.output, b.output);
      if (p == Precision::fp32) {
        EXPECT_EQ(d, 0.0);
      } else {
        EXPECT_GT(d, 0.0);
        EXPECT_LT(d, 0.1);
      }
    }
  }
}

TEST(Oracle, PaddedRowsPoisonedWithNanOrHugeChangeNoRealRow) {
  for (Poison pad : {Poison::nan, Poison::huge}) {
    Rig plain(preset("tiny-fs"), 6), padded(preset("tiny-fs"), 6);
    const StepTrace a = plain.run({{0, 3}, {1, 2}});
    const StepTrace b = padded.run({{0, 3}, {1, 2}}, 8, pad);
    EXPECT_LT(max_diff(a.output, b.output), 1e-12);
    for (double v : b.output.data) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(Oracle, Fp8LatentCacheStaysWithinItsQuantization) {
  Config cfg = preset("tiny");
  Rig bf(cfg, 7);
  cfg.kv_cache = KvCache::fp8_ds_mla;
  Rig f8(cfg, 7);
  const StepTrace a = bf.run({{0, 5}}), b = f8.run({{0, 5}});
  const double d = max_diff(a.layers[0].at("c"), b.layers[0].at("c"));
  EXPECT_GT(d, 0.0);
  EXPECT_LT(d, 0.1);
}

TEST(Scenario, BadMetadataIsRefusedWithAReason) {
  const Config cfg = preset("tiny");
  StepInput in;
  in.requests = {{0, 0, 3, {1}}};
  in.hidden = Mat::Zero(3, cfg.hidden_size);
  EXPECT_NO_THROW(in.derive(cfg, 4));  // 3 tokens fit one block of 5
  in.requests = {{0, 0, 3, {9}}};
  try {
    in.derive(cfg, 4);
    FAIL() << "block id outside the cache was accepted";
  } catch (const ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("block id 9"), std::string::npos);
  }
  in.requests = {{0, 0, 3, {1}}};
  in.hidden(1, 2) = std::nan("");
  EXPECT_THROW(in.derive(cfg, 4), ScenarioError);
}

}  // namespace
}  // namespace dsv32

namespace dsv32 {
namespace {

// StepOptions::o_proj_ranks (the rounding points of a tensor-parallel o_proj): in exact mode the
// split changes nothing beyond fp64 noise; emulated, y is the bf16 sum of bf16 partials, each
// over its ranks' heads' columns, recomputed here from the trace's `o` and W_o.
TEST(OracleTp, OProjRanksRoundEachPartialBeforeTheSum) {
  const Config cfg = preset("tiny-wide");  // H = 8
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 5));
  ScenarioBuilder b(cfg, 5, 16);
  const StepInput in = b.step({{0, 6}, {1, 3}});
  const int H = cfg.num_heads, dv = cfg.v_head_dim;
  for (int ranks : {2, 4}) {
    StepOptions split;
    split.o_proj_ranks = ranks;
    Oracle exact(cfg, w, Mode::exact, 16), exact_split(cfg, w, Mode::exact, 16);
    const StepTrace t0 = exact.step(in), t1 = exact_split.step(in, split);
    const Tensor &y0 = t0.layers[0].at("y"), &y1 = t1.layers[0].at("y");
    for (std::size_t i = 0; i < y0.data.size(); ++i)
      ASSERT_NEAR(y1.data[i], y0.data[i], 1e-12 * (1 + std::fabs(y0.data[i]))) << ranks;

    Oracle emu(cfg, w, Mode::emulated, 16), emu_split(cfg, w, Mode::emulated, 16);
    const StepTrace whole = emu.step(in), tr = emu_split.step(in, split);
    const Tensor &o = tr.layers[0].at("o"), &y = tr.layers[0].at("y");
    const Mat& wo = w->layers[0].w_o;
    const int cols = H / ranks * dv, D = cfg.hidden_size;
    int rounded_apart = 0;
    for (int t = 0; t < in.num_tokens; ++t)
      for (int j = 0; j < D; ++j) {
        double sum = 0;
        for (int r = 0; r < ranks; ++r) {
          double part = 0;
          for (int c = r * cols; c < (r + 1) * cols; ++c)
            part += o.data[static_cast<std::size_t>(t) * H * dv + c] * wo(j, c);
          sum += round_bf16(part);
        }
        const std::size_t i = static_cast<std::size_t>(t) * D + j;
        ASSERT_EQ(y.data[i], round_bf16(sum))
            << "ranks " << ranks << " token " << t << " col " << j;
        rounded_apart += y.data[i] != whole.layers[0].at("y").data[i];
      }
    EXPECT_GT(rounded_apart, 0) << "the split's rounding left every element of y unchanged";
  }
  StepOptions bad;
  bad.o_proj_ranks = 3;
  Oracle o3(cfg, w, Mode::exact, 16);
  EXPECT_THROW(o3.step(in, bad), ConfigError);
}

TEST(Vocabulary, TheOpTableIsInOpOrderAndItsNamesParseBack) {
  for (std::size_t i = 0; i < kNumOps; ++i) {
    const OpInfo& o = kOpTable[i];
    EXPECT_EQ(index(o.op), i);
    EXPECT_EQ(op_name(o.op), o.name);
    EXPECT_EQ(find_op(o.name), o.op);
  }
  EXPECT_EQ(find_op("sparse-mqa"), std::nullopt);
  // BOUNDARIES.md's H ops and the indexer's F-only ops.
  for (const Op op : {Op::indexer_topk, Op::sparse_mqa, Op::uv_proj, Op::latent_copy})
    EXPECT_TRUE(is_host_op(op)) << op_name(op);
  int host = 0, indexer = 0;
  for (const OpInfo& o : kOpTable) host += is_host_op(o.op), indexer += is_indexer_op(o.op);
  EXPECT_EQ(host, 4);
  EXPECT_EQ(indexer, 3);
  // An F layer runs 13 ops in either form; an S layer 10.
  const Config cfg = preset("tiny-fs");
  EXPECT_EQ(layer_ops(cfg, 0).size(), 13u);
  EXPECT_EQ(layer_ops(cfg, 1).size(), 10u);
  EXPECT_EQ(layer_ops(cfg, 0, /*copy_form=*/true).size(), 14u);
  for (const Op op : layer_ops(cfg, 0)) EXPECT_NE(op, Op::latent_copy);
}

TEST(Vocabulary, TheStageTableIsInStageOrderWithItsRules) {
  std::size_t i = 0;
  for (const StageInfo& s : stage_table()) {
    EXPECT_EQ(index(s.stage), i++);
    EXPECT_EQ(stage_name(s.stage), s.name);
    EXPECT_EQ(find_stage(s.name), s.stage);
    EXPECT_EQ(stage_op(s.name), op_name(s.op));
  }
  EXPECT_EQ(i, kNumStages);
  EXPECT_EQ(layer_stage_names().size(), kNumLayerStages);
  EXPECT_EQ(layer_stages().back(), Stage::y);
  EXPECT_EQ(find_stage("no-such-stage"), std::nullopt);
  EXPECT_EQ(stage_op("no-such-stage"), "?");
  EXPECT_EQ(stage_info(Stage::topk).rule, Rule::sets);
  EXPECT_EQ(stage_info(Stage::qI8).scale, Stage::qI_scale);
  EXPECT_EQ(stage_info(Stage::omega).scale, Stage::qI_scale);
  EXPECT_EQ(stage_info(Stage::kI8).scale, Stage::kI_scale);
  EXPECT_EQ(stage_info(Stage::kI_scale).rule, Rule::scale);
  EXPECT_EQ(stage_info(Stage::c).rule, Rule::cache);
  for (const Stage s : {Stage::ql, Stage::qR, Stage::olat, Stage::lse, Stage::o})
    EXPECT_TRUE(stage_info(s).heads) << stage_name(s);
}

}  // namespace
}  // namespace dsv32

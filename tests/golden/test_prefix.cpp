// Given prefixes (docs/spec/GOLDEN.md, "Given prefix"): drawn on their formats' grids, stored by
// the oracle exactly as if it had written them, kept bit for bit by a golden file, and refused
// by name when they do not fit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>

#include "dsv32/golden/case_file.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/prefix.hpp"

namespace dsv32 {
namespace {

Config small_config(KvCache kv) {
  Config c = preset("tiny-fs");  // F, S, F layers; K 8, block 5
  c.kv_cache = kv;
  return c;
}

/// Request `r` of `in`'s first `n` positions of every layer's cache, as a given prefix in the
/// cache's own format (a bf16 cache: its values as stored).
GivenPrefix from_cache(const Oracle& o, const StepInput& in, int r, int n) {
  const Config& c = o.config();
  GivenPrefix g;
  g.request_id = in.requests.at(r).id;
  g.length = n;
  const int L = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerCache& cache = o.cache(l);
    PrefixLayer pl;
    pl.latent.resize(n, L);
    pl.k_rope.resize(n, dr);
    if (c.is_full_layer(l)) {
      pl.index_k.resize(n, c.index_head_dim);
      pl.index_scale.resize(n);
    }
    for (int p = 0; p < n; ++p) {
      const auto s = in.slot_of(r, p, c.block_size);
      pl.latent.row(p) = cache.kv.row(s).head(L);
      pl.k_rope.row(p) = cache.kv.row(s).tail(dr);
      if (!c.is_full_layer(l)) continue;
      pl.index_k.row(p) = cache.index_k.row(s);
      pl.index_scale[p] = cache.index_scale[s];
    }
    g.layers.push_back(std::move(pl));
  }
  return g;
}

void expect_same_bits(const StepTrace& a, const StepTrace& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    ASSERT_EQ(a.layers[l].tensors.size(), b.layers[l].tensors.size());
    for (std::size_t i = 0; i < a.layers[l].tensors.size(); ++i)
      EXPECT_EQ(a.layers[l].tensors[i].data, b.layers[l].tensors[i].data)
          << "layer" << l << "/" << a.layers[l].tensors[i].name;
  }
  EXPECT_EQ(a.output.data, b.output.data);
}

class GivenPrefixModes : public ::testing::TestWithParam<Mode> {};

TEST_P(GivenPrefixModes, IsStoredAsIfTheLayerHadWrittenIt) {
  // A prefix the oracle computed, taken from its cache and given to a fresh oracle: the next
  // steps (a decode beside a new request, then a two-token chunk) come out bit for bit the same.
  const Config c = small_config(KvCache::bf16);
  const auto w = std::make_shared<const Weights>(Weights::generate(c, 11));
  const int blocks = 200;
  ScenarioBuilder b(c, 5, blocks);
  const StepInput prefill = b.step({{0, 300}});
  const StepInput decode = b.step({{0, 1}, {1, 20}}, 24);
  const StepInput chunk = b.step({{0, 2}, {1, 1}});
  Oracle computed(c, w, GetParam(), blocks);
  computed.step(prefill);
  const auto given = std::make_shared<const GivenPrefix>(from_cache(computed, decode, 0, 300));
  ASSERT_NO_THROW(given->check(c));
  const StepTrace want_decode = computed.step(decode);
  const StepTrace want_chunk = computed.step(chunk);

  Oracle fresh(c, w, GetParam(), blocks);
  StepInput first = decode;
  first.given = {given};
  first.derive(c, blocks);
  expect_same_bits(fresh.step(first), want_decode);
  expect_same_bits(fresh.step(chunk), want_chunk);

  // Without it the context is the cache's NaN poison: the indexer refuses its scores.
  Oracle empty(c, w, GetParam(), blocks);
  EXPECT_THROW(empty.step(decode), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Modes, GivenPrefixModes, ::testing::Values(Mode::exact, Mode::emulated),
                         [](const auto& param) { return std::string(to_string(param.param)); });

TEST(GivenPrefix, AShapedPrefixRepeatsItsEntriesExceptTheDistinctOnes) {
  const Config c = small_config(KvCache::fp8_ds_mla);
  const GivenPrefix plain = draw_prefix(c, 3, 7, 12);
  const GivenPrefix g = draw_prefix(c, 3, 7, 12, HiddenShape{3, {4}});
  ASSERT_NO_THROW(g.check(c));
  for (int l = 0; l < 3; ++l) {
    const PrefixLayer &a = g.layers[l], &b = plain.layers[l];
    for (int p = 0; p < 12; ++p) {
      if (p == 4) continue;
      // Position p holds what an unshaped prefix holds at p mod 3: equal keys, tied scores.
      EXPECT_EQ(Mat(a.latent.row(p)), Mat(b.latent.row(p % 3))) << l << " " << p;
      EXPECT_EQ(Mat(a.latent_scale.row(p)), Mat(b.latent_scale.row(p % 3))) << l << " " << p;
      EXPECT_EQ(Mat(a.k_rope.row(p)), Mat(b.k_rope.row(p % 3))) << l << " " << p;
      if (a.index_k.size() == 0) continue;
      EXPECT_EQ(Mat(a.index_k.row(p)), Mat(b.index_k.row(p % 3))) << l << " " << p;
      EXPECT_EQ(a.index_scale[p], b.index_scale[p % 3]) << l << " " << p;
    }
    // The distinct position draws its own entries: like none of the phrase's.
    for (int p = 0; p < 3; ++p) EXPECT_NE(Mat(a.k_rope.row(4)), Mat(b.k_rope.row(p))) << l;
  }
}

TEST(GivenPrefix, DrawsAreOnTheirFormatsGridAndKeyedByPosition) {
  for (const KvCache kv : {KvCache::bf16, KvCache::fp8_ds_mla}) {
    const Config c = small_config(kv);
    const GivenPrefix g = draw_prefix(c, 3, 7, 200);
    ASSERT_NO_THROW(g.check(c)) << to_string(kv);
    ASSERT_EQ(g.layers.size(), 3u);
    EXPECT_EQ(g.layers[1].index_k.size(), 0) << "an S layer has no index keys";
    // The first 50 positions of a longer draw are the shorter draw: nothing depends on length.
    const GivenPrefix shorter = draw_prefix(c, 3, 7, 50);
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(Mat(g.layers[l].latent.topRows(50)), shorter.layers[l].latent);
      EXPECT_EQ(Mat(g.layers[l].k_rope.topRows(50)), shorter.layers[l].k_rope);
    }
    // Another request draws other values.
    EXPECT_NE(draw_prefix(c, 3, 8, 50).layers[0].k_rope, shorter.layers[0].k_rope);
    if (kv != KvCache::fp8_ds_mla) continue;
    // Each tile's largest code is +-448: the quantizer's own scale.
    for (int p = 0; p < 200; ++p)
      EXPECT_EQ(g.layers[0].latent.row(p).cwiseAbs().maxCoeff(), kE4m3Max) << p;
    std::vector<double> back(c.kv_lora_rank);
    g.latent_row(c, 0, 0, back.data());
    EXPECT_EQ(back[0], static_cast<double>(static_cast<float>(g.layers[0].latent(0, 0)) *
                                           static_cast<float>(g.layers[0].latent_scale(0, 0))));
  }
}

TEST(GivenPrefix, CheckRefusesWhatNoCacheHoldsByName) {
  const Config c = small_config(KvCache::fp8_ds_mla);
  const GivenPrefix good = draw_prefix(c, 1, 0, 20);
  const auto refused = [&](auto edit, const std::string& words) {
    GivenPrefix g = good;
    edit(g);
    try {
      g.check(c);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const ScenarioError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([](GivenPrefix& g) { g.layers[0].latent(3, 4) = 0.3; },
          "layer 0: latent at row 3 column 4 is no finite e4m3 code");
  refused([](GivenPrefix& g) { g.layers[2].latent(0, 0) = std::nan(""); },
          "layer 2: latent at row 0 column 0");
  refused([](GivenPrefix& g) { g.layers[0].latent_scale(5, 0) = -1.0; },
          "latent_scale at row 5 column 0 is no positive fp32 value");
  refused([](GivenPrefix& g) { g.layers[2].index_scale[7] = 3.0; },
          "layer 2: index_scale at row 7 is no power of two");
  refused([](GivenPrefix& g) { g.layers[0].k_rope(1, 1) = INFINITY; }, "k_rope at row 1");
  refused([](GivenPrefix& g) { g.layers.pop_back(); }, "2 layers, the config has 3");
  refused([](GivenPrefix& g) { g.layers[0].k_rope.resize(20, 3); }, "k_rope has shape (20, 3)");
}

golden::CaseSpec prefix_case(KvCache kv) {
  golden::CaseSpec s;
  s.name = "given-prefix";
  s.cfg = small_config(kv);
  s.seed = 9;
  s.num_blocks = 120;
  s.committed = false;
  s.steps.push_back({{{0, 1, 240}, {1, 6}}, 8, {}});
  s.steps.push_back({{{0, 1}, {1, 1}, {2, 3, 90}}, 0, {}});
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".h5"))
      .string();
}

TEST(GivenPrefix, AGoldenKeepsItBitForBitAndRegeneratesTheSameBytes) {
  for (const KvCache kv : {KvCache::bf16, KvCache::fp8_ds_mla}) {
    const golden::GoldenCase gc = golden::generate(prefix_case(kv), "test");
    ASSERT_EQ(gc.steps[0].given.size(), 1u);
    ASSERT_EQ(gc.steps[1].given.size(), 1u);
    EXPECT_EQ(gc.steps[1].given[0]->request_id, 2);
    const std::string path = temp_path("prefix");
    golden::write(path, gc);
    EXPECT_EQ(golden::image(path, gc),
              golden::image(path, golden::generate(prefix_case(kv), "test")));
    const golden::GoldenCase back = golden::read(path);
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(back.steps[s].given.size(), 1u);
      const GivenPrefix &a = *gc.steps[s].given[0], &b = *back.steps[s].given[0];
      EXPECT_EQ(a.request_id, b.request_id);
      EXPECT_EQ(a.length, b.length);
      for (int l = 0; l < 3; ++l) {
        EXPECT_EQ(a.layers[l].latent, b.layers[l].latent);
        EXPECT_EQ(a.layers[l].latent_scale, b.layers[l].latent_scale);
        EXPECT_EQ(a.layers[l].k_rope, b.layers[l].k_rope);
        EXPECT_EQ(a.layers[l].index_k, b.layers[l].index_k);
        EXPECT_EQ(a.layers[l].index_scale, b.layers[l].index_scale);
      }
    }
    // The file's own inputs and prefixes give its traces again, bit for bit (T1 as the file
    // stores it, in its storage dtypes).
    const auto [t0, t1] = golden::recompute(back);
    for (int s = 0; s < 2; ++s) {
      expect_same_bits(t0[s], gc.expected[s]);
      expect_same_bits(t0[s], back.expected[s]);
      expect_same_bits(t1[s], back.emulated[s]);
    }
    std::filesystem::remove(path);
  }
}

/// What reading `gc` written without its read-back check says.
std::string refusal(const golden::GoldenCase& gc) {
  const std::string path = temp_path("bad-prefix");
  golden::write(path, gc, {}, /*verify=*/false);
  std::string what = "accepted";
  try {
    golden::read(path);
  } catch (const h5::GoldenError& e) {
    what = e.what();
  }
  std::filesystem::remove(path);
  return what;
}

TEST(GivenPrefix, AReaderRefusesAPrefixThatDoesNotFitByName) {
  const golden::GoldenCase good = golden::generate(prefix_case(KvCache::fp8_ds_mla), "test");
  {
    golden::GoldenCase gc = good;  // request 2 starts at ctx_len 90 with nothing given
    gc.steps[1].given.clear();
    EXPECT_NE(refusal(gc).find("request id 2 first appears with ctx_len 90 and the file gives no "
                               "/prefix/request2"),
              std::string::npos)
        << refusal(gc);
  }
  {
    golden::GoldenCase gc = good;  // a prefix of another length than the context it starts
    auto g = std::make_shared<GivenPrefix>(*gc.steps[1].given[0]);
    g->length = 80;
    for (PrefixLayer& pl : g->layers) {
      pl.latent.conservativeResize(80, Eigen::NoChange);
      pl.latent_scale.conservativeResize(80, Eigen::NoChange);
      pl.k_rope.conservativeResize(80, Eigen::NoChange);
      if (pl.index_k.size()) {
        pl.index_k.conservativeResize(80, Eigen::NoChange);
        pl.index_scale.conservativeResize(80);
      }
    }
    gc.steps[1].given = {g};
    EXPECT_NE(refusal(gc).find("its given prefix has 80 positions"), std::string::npos)
        << refusal(gc);
  }
  {
    golden::GoldenCase gc = good;  // a NaN code (0x7F) in the latent
    auto g = std::make_shared<GivenPrefix>(*gc.steps[0].given[0]);
    g->layers[2].latent(11, 3) = std::numeric_limits<double>::quiet_NaN();
    gc.steps[0].given = {g};
    const std::string why = refusal(gc);
    EXPECT_NE(why.find("/prefix/request0"), std::string::npos) << why;
    EXPECT_NE(why.find("layer 2: latent at row 11 column 3 is no finite e4m3 code"),
              std::string::npos)
        << why;
  }
}

TEST(GivenPrefix, CaseFilesGiveItOnlyAtARequestsFirstStep) {
  const auto text = [](const std::string& reqs2) {
    return R"({"name": "p", "config": {"preset": "tiny"}, "cache": {"num_blocks": 100},
      "steps": [{"requests": [{"id": 0, "new_tokens": 1, "given_prefix": 40}]},
                {"requests": [)" +
           reqs2 + "]}]}";
  };
  const golden::CaseSpec ok = golden::case_from_json(text(R"({"id": 0, "new_tokens": 1})"), "p");
  EXPECT_EQ(ok.steps[0].requests[0].given_prefix, 40);
  const auto refused = [&](const std::string& reqs2, const std::string& words) {
    try {
      golden::case_from_json(text(reqs2), "p");
      ADD_FAILURE() << "accepted " << reqs2;
    } catch (const golden::CaseFileError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"id": 0, "new_tokens": 1, "given_prefix": 5})",
          "given_prefix: request 0 is already running");
  refused(R"({"id": 1, "new_tokens": 1, "given_prefix": 0})", "given_prefix");
  refused(R"({"id": 1, "new_tokens": 1, "given_prefix": 600})", "cache blocks");
}

}  // namespace
}  // namespace dsv32

// Plans and capture sizes as data (BOUNDARIES.md sections 2-3): the CPU-only part of the
// capture machinery; CUDA-free (dsv32::boundary), so it runs everywhere, asan included.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/oracle/scenario.hpp"

namespace dsv32 {
namespace {

TEST(PlanPresets, ValidatorRejectsCapturingHostOps) {
  const Config cfg = preset("tiny-fs");
  for (const std::string& name : boundary::plan_names())
    EXPECT_NO_THROW(boundary::validate(boundary::plan_preset(name, cfg), cfg));
  boundary::Plan p = boundary::plan_preset("narrow", cfg);
  p.placement[1][Op::sparse_mqa] = boundary::Placement::graph;
  try {
    boundary::validate(p, cfg);
    FAIL() << "a captured sparse_mqa was accepted";
  } catch (const boundary::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1: op 'sparse_mqa'"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(boundary::validate(p, cfg, /*allow_host_capture=*/true));
  EXPECT_THROW(boundary::plan_preset("no-such-plan", cfg), boundary::PlanError);
  EXPECT_EQ(boundary::plan_preset("narrow", cfg).layer_ops(cfg, 1).size(),
            10u);  // S layer: no indexer ops
  const OpList copy_ops = boundary::plan_preset("narrow-copy", cfg).layer_ops(cfg, 0);
  EXPECT_EQ(copy_ops[copy_ops.size() - 1], Op::residual_add);
}

TEST(PlanPresets, FullCapturesHostOpsOnlyWithTheirDeviceDrivenVariants) {
  const Config cfg = preset("tiny-fs");
  const boundary::Plan full = boundary::plan_preset("full", cfg);
  EXPECT_TRUE(full.device_driven);
  for (int l = 0; l < cfg.num_layers; ++l)
    for (const Op op : full.layer_ops(cfg, l))
      EXPECT_EQ(full.at(l, op), boundary::Placement::graph) << "layer " << l << " " << op_name(op);
  EXPECT_NO_THROW(boundary::validate(full, cfg));
  // The same placement without the device-driven variants is refused, naming the first H op.
  boundary::Plan host = full;
  host.device_driven = false;
  try {
    boundary::validate(host, cfg);
    FAIL() << "a plan capturing indexer_topk without device-driven variants was accepted";
  } catch (const boundary::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0: op 'indexer_topk'"), std::string::npos)
        << e.what();
  }
  boundary::Plan copy = full;
  copy.copy_form = true;
  EXPECT_THROW(boundary::validate(copy, cfg), boundary::PlanError);  // latent_copy has none
  boundary::Plan orphan = full;
  orphan.mixed = nullptr;
  EXPECT_THROW(boundary::validate(orphan, cfg), boundary::PlanError);  // nothing serves mixed
  boundary::Plan nested = full;
  nested.mixed = std::make_shared<const boundary::Plan>(full);
  EXPECT_THROW(boundary::validate(nested, cfg), boundary::PlanError);
  EXPECT_THROW(boundary::full_and_piecewise(cfg, "full"), boundary::PlanError);
  EXPECT_EQ(boundary::full_and_piecewise(cfg, "wide").name, "full-and-piecewise:wide");
}

TEST(PlanDispatch, UniformDecodeStepsGoToTheFullGraphAndOthersToThePiecewisePlan) {
  const Config cfg = preset("tiny-fs");
  ScenarioBuilder b(cfg, 1, 40);
  const StepInput prefill = b.step({{0, 4}, {1, 3}}, 8);
  const StepInput decode = b.step({{0, 1}, {1, 1}}, 8);
  const StepInput mixed = b.step({{0, 1}, {1, 1}, {2, 2}}, 8);
  const StepInput first_tokens = b.step({{3, 1}, {4, 1}}, 2);  // new requests, one token each
  EXPECT_FALSE(boundary::uniform_decode(prefill));
  EXPECT_TRUE(boundary::uniform_decode(decode));
  EXPECT_FALSE(boundary::uniform_decode(mixed));
  EXPECT_TRUE(boundary::uniform_decode(first_tokens));
  // Speculative decoding's verify: requests past their prefill with 1 + drafts tokens each.
  const StepInput verify = b.step({{0, 3}, {1, 3}, {3, 3}}, 16);
  const StepInput verify_and_decode = b.step({{0, 3}, {1, 1}}, 8);
  const StepInput equal_prefills = b.step({{5, 3}, {6, 3}}, 8);
  EXPECT_TRUE(boundary::uniform_decode(verify));
  EXPECT_FALSE(boundary::uniform_decode(verify_and_decode));
  EXPECT_FALSE(boundary::uniform_decode(equal_prefills));  // prefills, not a verify
  const StepInput chunk = b.step({{0, boundary::kMaxUniformDecodeTokens + 1}}, 16);
  EXPECT_FALSE(boundary::uniform_decode(chunk));  // a prefill chunk of one request
  const StepInput long_verify = b.step({{0, boundary::kMaxUniformDecodeTokens}}, 8);
  EXPECT_TRUE(boundary::uniform_decode(long_verify));
  const boundary::Plan fp = boundary::plan_preset("full-and-piecewise", cfg);
  const boundary::Plan full = boundary::plan_preset("full", cfg);
  EXPECT_EQ(&fp.serving(decode), &fp);
  EXPECT_EQ(&fp.serving(verify), &fp);
  EXPECT_EQ(fp.serving(verify_and_decode).name, "narrow");
  EXPECT_EQ(fp.serving(mixed).name, "narrow");
  EXPECT_EQ(fp.serving(prefill).name, "narrow");
  EXPECT_EQ(full.serving(mixed).name, "eager");  // vLLM's FULL_DECODE_ONLY
  EXPECT_EQ(&full.serving(first_tokens), &full);
  const boundary::Plan narrow = boundary::plan_preset("narrow", cfg);
  EXPECT_EQ(&narrow.serving(decode), &narrow);
  // The two share the full graph's recording, not their identity.
  EXPECT_EQ(fp.record_signature(), full.record_signature());
  EXPECT_NE(fp.signature(), full.signature());
  EXPECT_NE(fp.signature(), boundary::full_and_piecewise(cfg, "wide").signature());
  // The full graphs' mutants need full graphs.
  for (const char* m :
       {"full-for-mixed", "stale-full-metadata", "stale-short-prefill", "verify-stride"}) {
    EXPECT_TRUE(boundary::is_full_graph_mutant(m));
    EXPECT_EQ(boundary::mutant_plan(m), "full-and-piecewise");
    EXPECT_THROW(boundary::mutate_plan(narrow, m), boundary::PlanError) << m;
    EXPECT_NO_THROW(boundary::mutate_plan(fp, m)) << m;
  }
  EXPECT_EQ(boundary::mutant_plan("fresh-output"), "narrow");
  // Issue 41's mutants each show on their family's case; the others on mutant-bait.
  EXPECT_EQ(boundary::mutant_bait("verify-stride"), "spec-verify");
  EXPECT_EQ(boundary::mutant_bait("topk-bin-overflow"), "topk-stress");
  EXPECT_EQ(boundary::mutant_bait("topk-edge"), "chunk-edges");
  EXPECT_EQ(boundary::mutant_bait("reused-block-skip"), "block-reuse");
  // The size map's each on a case past its switch.
  EXPECT_EQ(boundary::mutant_bait("fp8-tile-scale"), "fp8-tiles");
  EXPECT_EQ(boundary::mutant_bait("topk-long-row"), "rows-past-16384");
  EXPECT_EQ(boundary::mutant_bait("stale-positions"), "mutant-bait");
  // Decode context parallelism's on a DCP case.
  for (const char* m :
       {"dcp-lse-base2", "dcp-empty-rank-nan", "dcp-global-as-local", "dcp-share-prefix"}) {
    EXPECT_EQ(boundary::mutant_bait(m), "dcp-bait") << m;
    EXPECT_EQ(boundary::mutant_plan(m), "narrow") << m;
  }
}

TEST(PlanSignature, NamesWhatIsRecordedNotWhatItIsCalled) {
  // A stack keys its captures by signature: a renamed plan may share a graph, a plan whose
  // placement or form changed under a known name may not.
  const Config cfg = preset("tiny-fs");
  std::vector<std::string> seen;
  for (const std::string& name : boundary::plan_names()) {
    const std::string sig = boundary::plan_preset(name, cfg).signature();
    EXPECT_EQ(std::count(seen.begin(), seen.end(), sig), 0) << name << " shares " << sig;
    seen.push_back(sig);
  }
  boundary::Plan renamed = boundary::plan_preset("narrow", cfg);
  renamed.name = "my-narrow";
  EXPECT_EQ(renamed.signature(), boundary::plan_preset("narrow", cfg).signature());
  boundary::Plan moved = boundary::plan_preset("narrow", cfg);
  moved.placement[1][Op::o_proj] = boundary::Placement::eager;
  EXPECT_NE(moved.signature(), boundary::plan_preset("narrow", cfg).signature());
  boundary::Plan copy = boundary::plan_preset("narrow", cfg);
  copy.copy_form = true;
  EXPECT_NE(copy.signature(), boundary::plan_preset("narrow", cfg).signature());
  for (const char* mutant : {"capture-host-op", "uv-captured-nocopy"}) {
    boundary::Plan m = boundary::mutate_plan(boundary::plan_preset("narrow", cfg), mutant);
    m.name = "narrow";
    EXPECT_NE(m.signature(), boundary::plan_preset("narrow", cfg).signature()) << mutant;
  }
}

TEST(PlanOps, EveryNameIsOneOpAndBack) {
  for (const OpInfo& o : kOpTable) {
    EXPECT_EQ(op_name(o.op), o.name);
    EXPECT_EQ(find_op(o.name), o.op) << o.name;
  }
  EXPECT_FALSE(find_op("sparse-mqa").has_value());  // BOUNDARIES.md's names, verbatim
  const Config cfg = preset("tiny-fs");
  boundary::Plan p = boundary::plan_preset(boundary::PlanPreset::narrow, cfg);
  p.placement[0][Op::q_b_proj] = boundary::Placement::eager;
  EXPECT_EQ(p.at(0, Op::q_b_proj), boundary::Placement::eager);
  EXPECT_EQ(p.at(1, Op::q_b_proj), boundary::Placement::graph);
}

TEST(PlanMutants, EveryStackMutantHasItsOwnValue) {
  EXPECT_EQ(boundary::stack_mutant(""), boundary::StackMutant::none);
  std::vector<boundary::StackMutant> seen;
  for (const std::string& name : boundary::mutant_names()) {
    if (boundary::is_plan_mutant(name)) {
      EXPECT_THROW(boundary::stack_mutant(name), boundary::PlanError) << name;
      continue;
    }
    const boundary::StackMutant m = boundary::stack_mutant(name);
    EXPECT_NE(m, boundary::StackMutant::none) << name;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), m), 0) << name << " shares its value";
    seen.push_back(m);
  }
  EXPECT_EQ(seen.size(), 22u);
  EXPECT_THROW(boundary::stack_mutant("no-such-mutant"), boundary::PlanError);
}

TEST(PlanPresets, EachNameIsOnePresetAndBack) {
  const Config cfg = preset("tiny-fs");
  const std::vector<std::string> names = boundary::plan_names();
  ASSERT_EQ(names.size(), 7u);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto p = static_cast<boundary::PlanPreset>(i);
    EXPECT_EQ(boundary::plan_preset_name(p), names[i]);
    EXPECT_EQ(boundary::find_plan_preset(names[i]), p);
    EXPECT_EQ(boundary::plan_preset(p, cfg).signature(),
              boundary::plan_preset(names[i], cfg).signature())
        << names[i];
    EXPECT_EQ(boundary::plan_preset(p, cfg).name, names[i]);
  }
  EXPECT_EQ(boundary::find_plan_preset("full-and-piecewise:wide"), std::nullopt);
  EXPECT_EQ(boundary::plan_preset("full-and-piecewise:wide", cfg).signature(),
            boundary::full_and_piecewise(cfg, boundary::PlanPreset::wide).signature());
  try {
    boundary::plan_preset("full-and-piecewise:full", cfg);
    FAIL() << "a device-driven piecewise plan was accepted";
  } catch (const boundary::PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("the piecewise plan 'full' is device-driven"),
              std::string::npos)
        << e.what();
  }
  try {
    boundary::plan_preset("no-such-plan", cfg);
    FAIL();
  } catch (const boundary::PlanError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown plan 'no-such-plan' (known: eager, breakable-eager, wide, narrow, "
              "narrow-copy, full, full-and-piecewise)");
  }
  // A placement array indexed by Op, iterated in the op table's order.
  const boundary::Plan narrow = boundary::plan_preset(boundary::PlanPreset::narrow, cfg);
  std::size_t i = 0;
  for (const auto& [op, where] : narrow.placement[0]) {
    EXPECT_EQ(op, kOpTable[i++].op);
    EXPECT_EQ(where, op == Op::indexer_topk || op == Op::sparse_mqa || op == Op::uv_proj
                         ? boundary::Placement::eager
                         : boundary::Placement::graph)
        << op_name(op);
  }
  EXPECT_EQ(i, kNumOps);
}

TEST(PlanMutants, TheTableAndTheNamesAgree) {
  const auto& names = boundary::mutant_names();
  ASSERT_EQ(names.size(), boundary::kNumMutants);
  for (const boundary::MutantInfo& m : boundary::kMutantTable) {
    EXPECT_EQ(boundary::mutant_name(m.mutant), m.name);
    EXPECT_EQ(boundary::find_mutant(m.name), m.mutant);
    EXPECT_EQ(boundary::is_plan_mutant(m.mutant), boundary::is_plan_mutant(m.name));
    EXPECT_EQ(boundary::is_full_graph_mutant(m.mutant), boundary::is_full_graph_mutant(m.name));
    EXPECT_EQ(boundary::mutant_bait(m.mutant), boundary::mutant_bait(m.name));
    EXPECT_EQ(boundary::plan_preset_name(boundary::mutant_plan(m.mutant)),
              boundary::mutant_plan(m.name));
  }
  EXPECT_TRUE(boundary::is_plan_mutant(boundary::Mutant::capture_host_op));
  EXPECT_TRUE(boundary::is_plan_mutant(boundary::Mutant::uv_captured_nocopy));
  EXPECT_EQ(boundary::stack_switch("capture-host-op"), "");
  EXPECT_EQ(boundary::stack_switch("double-rope"), "double-rope");
  EXPECT_FALSE(boundary::is_plan_mutant("no-such-mutant"));
  EXPECT_EQ(boundary::mutant_bait("no-such-mutant"), "mutant-bait");
  try {
    boundary::parse_mutant("no-such-mutant");
    FAIL();
  } catch (const boundary::PlanError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("unknown mutant 'no-such-mutant' (known: fresh-output, "
                                          "capture-host-op, ",
                                          0),
              0u)
        << e.what();
  }
  const Config cfg = preset("tiny-fs");
  const boundary::Plan narrow = boundary::plan_preset(boundary::PlanPreset::narrow, cfg);
  const boundary::Plan host = boundary::mutate_plan(narrow, boundary::Mutant::capture_host_op);
  EXPECT_EQ(host.name, "narrow+capture-host-op");
  EXPECT_TRUE(host.allow_host_capture);
  for (int l = 0; l < cfg.num_layers; ++l)
    EXPECT_EQ(host.at(l, Op::sparse_mqa), boundary::Placement::graph);
  const boundary::Plan copy = boundary::plan_preset(boundary::PlanPreset::narrow_copy, cfg);
  const boundary::Plan uv = boundary::mutate_plan(copy, boundary::Mutant::uv_captured_nocopy);
  EXPECT_FALSE(uv.copy_form);
  EXPECT_EQ(uv.at(0, Op::uv_proj), boundary::Placement::graph);
  EXPECT_EQ(boundary::mutate_plan(narrow, boundary::Mutant::double_rope).signature(),
            narrow.signature());
}

TEST(CaptureSizes, FollowTheVllmList) {
  const std::vector<int> s = boundary::capture_sizes(512);
  EXPECT_EQ(std::vector<int>(s.begin(), s.begin() + 5), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(s.back(), 512);
  for (std::size_t i = 1; i < s.size(); ++i) {
    ASSERT_LT(s[i - 1], s[i]);
    const int step = s[i] <= 8 ? s[i] - s[i - 1] : s[i] <= 256 ? 8 : 16;
    EXPECT_EQ(s[i] - s[i - 1], step) << "at " << s[i];
  }
  EXPECT_EQ(boundary::capture_sizes(1), std::vector<int>{1});
  EXPECT_EQ(boundary::capture_sizes(20), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  EXPECT_THROW(boundary::capture_sizes(0), std::invalid_argument);
}

TEST(CaptureSizes, AStepPadsToTheSmallestSizeThatHoldsIt) {
  const std::vector<int> s = boundary::capture_sizes(512);
  for (int ta = 1; ta <= 520; ++ta) {
    const int T = boundary::capture_size_for(s, ta);
    if (ta > 512) {
      EXPECT_EQ(T, 0) << "T_a " << ta << " above the largest size runs without a graph";
      continue;
    }
    ASSERT_GE(T, ta);
    for (int size : s)
      if (size >= ta) {
        EXPECT_EQ(T, size) << "T_a " << ta;
        break;
      }
  }
  EXPECT_EQ(boundary::capture_size_for(s, 3), 4);
  EXPECT_EQ(boundary::capture_size_for(s, 257), 272);
  EXPECT_THROW(boundary::capture_size_for(s, 0), std::invalid_argument);
}

}  // namespace
}  // namespace dsv32

// Golden cases from a file (docs/CASES.md): the registry's files, Hugging Face configs mapped to
// MATH.md's config, a user's case generated and read back, and bad files refused by field.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "dsv32/golden/case_file.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const std::string kData = DSV32_TEST_DATA_DIR;

TEST(CaseFiles, EveryRegistryCaseIsItsFile) {
  // The registry is built from fixtures/cases/*.json; each file read from disk gives the same
  // case (Golden.RegeneratedFixturesAreByteIdentical then holds them to the fixtures' bytes).
  const auto& reg = golden::registry();
  std::size_t files = 0;  // every case file is in the registry
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(DSV32_FIXTURES_DIR) + "/cases"))
    files += e.path().extension() == ".json";
  ASSERT_EQ(reg.size(), files);
  for (const golden::CaseSpec& c : reg) {
    const golden::CaseSpec f =
        golden::read_case_file(std::string(DSV32_FIXTURES_DIR) + "/cases/" + c.name + ".json");
    EXPECT_EQ(f.cfg, c.cfg) << c.name;
    EXPECT_EQ(f.seed, c.seed) << c.name;
    EXPECT_EQ(f.num_blocks, c.num_blocks) << c.name;
    EXPECT_EQ(f.committed, c.committed) << c.name;
    EXPECT_EQ(f.hidden, c.hidden) << c.name;
    EXPECT_EQ(f.zero_index_key_rope, c.zero_index_key_rope) << c.name;
    EXPECT_EQ(f.require, c.require) << c.name;
    ASSERT_EQ(f.steps.size(), c.steps.size()) << c.name;
    for (std::size_t s = 0; s < f.steps.size(); ++s) {
      EXPECT_EQ(f.steps[s].capture_size, c.steps[s].capture_size) << c.name;
      EXPECT_EQ(f.steps[s].finish_after, c.steps[s].finish_after) << c.name;
      ASSERT_EQ(f.steps[s].requests.size(), c.steps[s].requests.size()) << c.name;
      for (std::size_t r = 0; r < f.steps[s].requests.size(); ++r) {
        EXPECT_EQ(f.steps[s].requests[r].id, c.steps[s].requests[r].id);
        EXPECT_EQ(f.steps[s].requests[r].q, c.steps[s].requests[r].q);
        EXPECT_EQ(f.steps[s].requests[r].given_prefix, c.steps[s].requests[r].given_prefix);
      }
    }
  }
  EXPECT_EQ(golden::find_case("kv-fp8").cfg.kv_cache, KvCache::fp8_ds_mla);
  EXPECT_EQ(golden::find_case("fs-pattern").cfg.index_topk_pattern, "FSSF");
}

TEST(CaseFiles, HuggingFaceConfigsMapToThePresets) {
  Config dsv32 = golden::config_from_hf(read(kData + "/hf/deepseek-v3.2-exp.json"), 1, "hf");
  Config want = preset("dsv32");
  dsv32.name = want.name;
  EXPECT_EQ(dsv32, want) << golden::config_to_json(dsv32) << "\n" << golden::config_to_json(want);
  Config glm = golden::config_from_hf(read(kData + "/hf/glm-5.2-style.json"), 1, "hf");
  Config glm_want = preset("glm52");
  glm.name = glm_want.name;
  EXPECT_EQ(glm, glm_want) << golden::config_to_json(glm) << "\n"
                           << golden::config_to_json(glm_want);
  // Over 8 layers GLM-5.2's index_topk_freq 4 / index_skip_topk_offset 3 give MATH.md's pattern.
  EXPECT_EQ(
      golden::config_from_hf(read(kData + "/hf/glm-5.2-style.json"), 8, "hf").index_topk_pattern,
      "FFFSSSFS");
}

TEST(CaseFiles, AUsersCaseIsGeneratedAndReadBack) {
  // A mixed batch with a join, a finish and padding, on a Hugging Face config cut to small
  // sizes, written from scratch.
  const fs::path dir = fs::temp_directory_path() / "dsv32-case-file-test";
  fs::create_directories(dir);
  const std::string text = R"({
    "name": "user-mixed",
    "description": "a long decode joined by a short prefill; one request finishes; padded to 8",
    "seed": 7,
    "config": {"hf_config": ")" +
                           kData + R"(/hf/deepseek-v3.2-exp.json", "num_layers": 2,
               "index_topk_pattern": "FS", "hidden_size": 64, "num_heads": 2, "q_lora_rank": 32,
               "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
               "v_head_dim": 16, "index_n_heads": 2, "index_topk": 8, "block_size": 4},
    "cache": {"num_blocks": 16},
    "steps": [
      {"requests": [{"id": 0, "new_tokens": 12}]},
      {"requests": [{"id": 0, "new_tokens": 1}, {"id": 1, "new_tokens": 3}], "capture_size": 8,
       "finish_after": [0]},
      {"requests": [{"id": 1, "new_tokens": 1}, {"id": 2, "new_tokens": 2}], "capture_size": 4}
    ]})";
  const golden::CaseSpec spec = golden::case_from_json(text, "user.json");
  EXPECT_EQ(spec.cfg.rope_scaling, std::optional<Yarn>(Yarn{}));  // from the HF config
  EXPECT_EQ(spec.cfg.hidden_size, 64);                            // the override
  const golden::GoldenCase gc = golden::generate(spec, "test");
  const std::string path = (dir / "user-mixed.h5").string();
  golden::write(path, gc);
  const golden::GoldenCase back = golden::read(path);
  ASSERT_EQ(back.steps.size(), 3u);
  EXPECT_EQ(back.steps[1].capture_size, 8);
  EXPECT_EQ(back.steps[1].num_tokens, 4);
  EXPECT_EQ(back.steps[2].requests.size(), 2u);
  for (const StageDiff& d : diff_traces(back.cfg, back.expected, gc.expected, gc.emulated))
    EXPECT_EQ(d.result.max_err, 0.0) << d.where();
  const std::string skeleton = golden::candidate_skeleton(spec);
  EXPECT_NE(skeleton.find("\"layer1/o\""), std::string::npos);
  EXPECT_EQ(skeleton.find("\"layer1/qI8\""), std::string::npos) << "an S layer has no indexer";
  fs::remove_all(dir);
}

/// The message a case text is refused with ("" when accepted).
std::string refusal(const std::string& text) {
  try {
    golden::case_from_json(text, "bad.json");
  } catch (const golden::CaseFileError& e) {
    return e.what();
  }
  return "";
}

TEST(CaseFiles, BadFilesAreRefusedNamingTheField) {
  const std::string ok_steps = R"("steps": [{"requests": [{"id": 0, "new_tokens": 3}]}])";
  const auto with = [&](const std::string& config, const std::string& steps) {
    return R"({"name": "x", "config": )" + config + ", " + steps + "}";
  };
  const std::pair<std::string, std::string> cases[] = {
      {R"({"name": "x", "config": {"preset": "tiny"}, "stepz": []})",
       "bad.json: unknown key 'stepz'"},
      {with(R"({"preset": "tiny", "hidden_size": "64"})", ok_steps),
       "bad.json: config.hidden_size: expected an integer, got \"64\""},
      {with(R"({"preset": "tiny", "hadamard": "maybe"})", ok_steps),
       "bad.json: config.hadamard: config field 'hadamard': unknown value 'maybe'"},
      {with(R"({"preset": "tiny"})", R"("steps": [{"requests": [{"id": 0, "new_tokens": 0}]}])"),
       "bad.json: steps[0].requests[0].new_tokens: expected an integer in [1, 65536], got 0"},
      {with(R"({"preset": "tiny"})",
            R"("steps": [{"requests": [{"id": 0, "new_tokens": 9}], "capture_size": 8}])"),
       "bad.json: steps[0].capture_size: 8 is less than the step's 9 new tokens"},
      {with(R"({"preset": "tiny"})",
            R"("steps": [{"requests": [{"id": 0, "new_tokens": 2}], "finish_after": [0]},
                         {"requests": [{"id": 0, "new_tokens": 1}]}])"),
       "bad.json: steps[1].requests[0].id: request 0 finished in an earlier step"},
      {with(R"({"preset": "tiny"})",
            R"("steps": [{"requests": [{"id": 0, "new_tokens": 2}], "finish_after": [5]}])"),
       "bad.json: steps[0].finish_after[0]: request 5 is not live"},
      {R"({"name": "x", "config": {"preset": "tiny"}, "cache": {"num_blocks": 2},
           "steps": [{"requests": [{"id": 0, "new_tokens": 200}]}]})",
       "bad.json: steps[0]: the live requests need"},
      {with(R"({"preset": "tiny", "num_layers": 1000})", ok_steps),
       "bad.json: config.num_layers: expected an integer in [1, 128], got 1000"},
      {with(R"({"hidden_size": 64})", ok_steps), "bad.json: config: missing key 'num_layers'"},
      {with(R"({"preset": "no-such"})", ok_steps), "bad.json: config: unknown preset 'no-such'"},
      {R"({"name": "x", "config": {"preset": "tiny"}})", "bad.json: missing key 'steps'"},
      {"{not json", "bad.json: not JSON"},
      {with(R"({"preset": "tiny"})",
            R"("steps": [{"requests": [{"id": 0, "new_tokens": 2}]},
                         {"requests": [{"id": 0, "new_tokens": 1, "hidden": {"repeat": 2}}]}])"),
       "bad.json: steps[1].requests[0].hidden: request 0 is already running: give 'hidden' at "
       "its first step"},
      {with(R"({"preset": "tiny"})",
            R"("steps": [{"requests": [{"id": 0, "new_tokens": 2, "hidden": {"repeat": 0}}]}])"),
       "bad.json: steps[0].requests[0].hidden.repeat: expected an integer in [1, 1073741824], got "
       "0"},
      {R"({"name": "x", "config": {"preset": "tiny-fs"}, "weights": {"zero_index_key_rope": [1]},
           )" +
           ok_steps + "}",
       "bad.json: weights.zero_index_key_rope[0]: layer 1 is an S layer (no index keys)"},
      {with(R"({"preset": "tiny", "block_size": 64, "dcp_size": 2, "dcp_interleave": 48})",
            ok_steps),
       "bad.json: config: config field 'dcp_interleave': must divide block_size"},
      {with(R"({"preset": "tiny", "dcp_size": 2, "decode_context_parallel_size": 2})", ok_steps),
       "bad.json: config.decode_context_parallel_size: give dcp_size or "
       "decode_context_parallel_size, not both"},
      {with(R"({"preset": "tiny", "dcp_indexer_mode": "both"})", ok_steps),
       "config field 'dcp_indexer_mode': unknown value 'both' (expected exact|union)"},
      {R"({"name": "x", "config": {"preset": "tiny"}, "require": ["pruned=>1"], )" + ok_steps + "}",
       "bad.json: require[0]: pruned=>1: comparison => (one of >=, >, <=, <, ==)"},
  };
  for (const auto& [text, want] : cases) {
    const std::string why = refusal(text);
    EXPECT_NE(why.find(want), std::string::npos) << "refusal: '" << why << "'\nwanted: " << want;
  }
  const std::string why = refusal(with(R"({"hf_config": "/no/such/config.json"})", ok_steps));
  EXPECT_NE(why.find("/no/such/config.json: no such file"), std::string::npos) << why;
}

TEST(CaseFiles, DcpTakesOurNamesOrVllmsEngineArguments) {
  const auto cfg_of = [](const std::string& config) {
    return golden::case_from_json(R"({"name": "x", "config": )" + config +
                                      R"(, "steps": [{"requests": [{"id": 0, "new_tokens": 3}]}]})",
                                  "dcp.json")
        .cfg;
  };
  const Config ours = cfg_of(
      R"({"preset": "tiny", "block_size": 64, "dcp_size": 4, "dcp_interleave": 64,
          "dcp_indexer_mode": "union"})");
  const Config vllms = cfg_of(
      R"({"preset": "tiny", "block_size": 64, "decode_context_parallel_size": 4,
          "cp_kv_cache_interleave_size": 64, "dcp_indexer_mode": "union"})");
  EXPECT_EQ(ours.dcp_size, 4);
  EXPECT_EQ(ours.dcp_interleave, 64);
  EXPECT_EQ(ours.dcp_indexer_mode, DcpIndexerMode::union_);
  EXPECT_EQ(ours, vllms);
}

TEST(CaseFiles, AClaimTheCaseDoesNotMeetIsRefusedWhenItIsGenerated) {
  // Three tokens never outnumber K = 8: nothing prunes, so the claim is false.
  const std::string text = R"({"name": "x", "config": {"preset": "tiny"}, "require": ["pruned>=1"],
                               "steps": [{"requests": [{"id": 0, "new_tokens": 3}]}]})";
  const golden::CaseSpec spec = golden::case_from_json(text, "x.json");
  try {
    golden::generate(spec, "test");
    ADD_FAILURE() << "a false claim was accepted";
  } catch (const golden::CaseFileError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "case x does not exercise what it claims: pruned>=1: pruned is 0 of 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(CaseFiles, RepeatedHiddenRowsAndZeroRotaryKeysTieExactly) {
  // A token repeated with no rotary part in the index keys: every key equal, but the distinct
  // position's.
  const std::string text = R"({"name": "x", "config": {"preset": "tiny"},
      "weights": {"zero_index_key_rope": [0]},
      "steps": [{"requests": [{"id": 0, "new_tokens": 12, "hidden": {"repeat": 1, "distinct": [4]}}]}]})";
  const golden::GoldenCase gc = golden::generate(golden::case_from_json(text, "x.json"), "test");
  const Tensor& k = gc.expected[0].layers[0].at("kI8");
  const Tensor& scale = gc.expected[0].layers[0].at("kI_scale");
  const std::int64_t dI = k.shape[1];
  for (std::int64_t t = 1; t < 12; ++t) {
    const bool same =
        std::equal(k.data.begin() + t * dI, k.data.begin() + (t + 1) * dI, k.data.begin()) &&
        scale.data[t] == scale.data[0];
    EXPECT_EQ(same, t != 4) << "position " << t;
  }
}

}  // namespace
}  // namespace dsv32

// The size map on the GPU (docs/GPU.md, "Size map"): for each size at which a kernel or the
// stack's dispatch changes its code path, a scenario just below the threshold and one at or just
// above it, each run eagerly and judged against the oracle, with every plan held to eager's bits
// (testing::check_plans), and the kernel path the stack counts asserted where it counts one, so
// a test proves the side it claims. Thresholds that are config sizes use small configs with that
// one size moved; context thresholds use given prefixes, so the oracle computes only the
// measured steps. DeepSeek-V3.2's own sizes together (128 heads, 64 indexer heads, Lkv 512 in
// fp8_ds_mla, K 2048, contexts past K) run in test_gpu_long.cpp.
//
// `TheScenarioSitsOnItsSide` needs no GPU: each scenario's switch variable, from its sizes alone,
// against the threshold restated below from the kernels (a kernel whose constant moves moves the
// map; this file and docs/GPU.md move with it). A threshold that depends on the SM count is
// checked there at the H200's 132 SMs and again on the GPU at the device's own count.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/judge/judge.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "support/gpu.hpp"
#include "support/gpu_runs.hpp"

namespace dsv32 {
namespace {

constexpr std::uint64_t kSeed = 55;

// The switches' sizes, as the kernels define them (file: constant).
constexpr int kTopkThreads = 1024;                 // topk_select.cu: kTopkThreads
constexpr int kTopkShortKeys = 16 * kTopkThreads;  // topk_select.cu: kTopkFast keys a thread
constexpr int kTopkTierKeys[] = {4 * kTopkThreads, 8 * kTopkThreads, 10 * kTopkThreads,
                                 12 * kTopkThreads, 16 * kTopkThreads};  // topk_short<P>
constexpr int kScoreChunkKeys = 64;       // index_scores.cu: kIdxMmaKeys (a grid row)
constexpr int kPerKeyChunkKeys = 128;     // index_scores.cu: kIdxKeyThreads
constexpr int kGridBlocksPerSm = 16;      // attention.cu: indexer_topk_device's cap
constexpr int kMmaHeads = 64;             // index_scores.cuh: kIdxMmaHeads
constexpr int kMmaTokensRows = 256;       // index_scores.cuh: index_mma_tokens
constexpr int kSoftmaxRegKeys = 8 * 256;  // sparse_mqa.cu: kMqaSoftmaxRegs x kMqaThreads
constexpr int kNormRegValues = 8 * 1024;  // rmsnorm.cu: kNormRegs x kNormThreads
constexpr int kNrcRegValues = 12 * 128;   // norm_rope_cache.cu: kNrcRegs x threads
constexpr int kGemvMaxRows = 4;           // gemv.cuh: kGemvMaxRows (and uk_small)
constexpr int kH200Sms = 132;             // the SM count the CPU-only check assumes
constexpr int kGridLoopT = 4096;          // capture size of the capped-grid scenarios

/// A scenario: a config, the cache's blocks and the steps.
struct Scenario {
  Config cfg;
  int num_blocks = 0;
  std::vector<StepInput> steps;
};

/// One side of one switch. `value` is the switch variable of a scenario (on a device of `sms`
/// SMs) and `threshold` the first value on the at/above side: the scenario sits at or above
/// when value >= threshold, and `at` says which side it claims. `paths` must be counted by an
/// eager run (StackReport::kernel_paths) and `absent` must not; `full_paths` likewise under
/// `full` (the device-driven variants); `dispatch` is what serves the first step under
/// `full-and-piecewise`.
struct SizeCase {
  std::string name;
  std::string what;  // the switch, as docs/GPU.md's size map names it
  bool at = false;
  std::function<Scenario(int sms)> make;
  std::function<long(const Scenario&, int sms)> value;
  std::function<long(const Scenario&, int sms)> threshold;
  std::vector<std::string> paths;
  std::vector<std::string> absent;
  std::vector<std::string> full_paths;
  std::optional<gpu::Served::How> dispatch;
};

void PrintTo(const SizeCase& c, std::ostream* os) {
  *os << c.name;
}

Config tiny_with(const std::string& base, const std::function<void(Config&)>& edit) {
  Config c = preset(base);
  edit(c);
  c.validate();
  return c;
}

/// Blocks for requests of these lengths, with a few to spare.
int blocks_for(const Config& cfg, const std::vector<int>& lengths) {
  int n = 4;
  for (int len : lengths) n += (len + cfg.block_size - 1) / cfg.block_size;
  return n;
}

long longest(const Scenario& s, int) {
  long n = 0;
  for (const StepInput& in : s.steps)
    for (const RequestStep& r : in.requests) n = std::max<long>(n, r.seq_len());
  return n;
}
long largest_ta(const Scenario& s, int) {
  long n = 0;
  for (const StepInput& in : s.steps) n = std::max<long>(n, in.num_tokens);
  return n;
}
long largest_capture(const Scenario& s, int) {
  return max_capture_size(s.steps);
}
std::function<long(const Scenario&, int)> fixed(long v) {
  return [v](const Scenario&, int) { return v; };
}
std::function<long(const Scenario&, int)> config_size(int Config::*field) {
  return [field](const Scenario& s, int) { return static_cast<long>(s.cfg.*field); };
}

/// One decode row of each length (a given prefix of length - 1 and one new token), at capture
/// size T (0: the row count).
Scenario decode_rows(const Config& cfg, const std::vector<int>& lengths, int T = 0) {
  Scenario s{cfg, blocks_for(cfg, lengths), {}};
  ScenarioBuilder b(cfg, kSeed, s.num_blocks);
  std::vector<StepRequest> reqs;
  for (std::size_t i = 0; i < lengths.size(); ++i)
    reqs.push_back({static_cast<int>(i), 1, lengths[i] - 1});
  s.steps.push_back(b.step(reqs, T));
  return s;
}

/// A decode past K beside a fresh prefill, then both decode (capture sizes 8 and 2): the small
/// scenario the config-size switches run.
Scenario mixed_then_decode(const Config& cfg) {
  Scenario s{cfg, blocks_for(cfg, {25, 9}), {}};
  ScenarioBuilder b(cfg, kSeed, s.num_blocks);
  s.steps.push_back(b.step({{0, 1, 23}, {1, 6}}, 8));
  s.steps.push_back(b.step({{0, 1}, {1, 1}}, 2));
  return s;
}

/// The capped grid of the device-driven scores at capture size T: chunks of kScoreChunkKeys.
int grid_cap(int sms, int T) {
  return std::max(1, kGridBlocksPerSm * sms / T);
}

const char* const kMma = "index scores: tensor cores (mma)";
const char* const kGrouped = "index scores: grouped heads";
const char* const kPerKey = "index scores: a block per 128 keys";
const char* const kShortHost = "top-k: bins in registers (rows up to 16384 keys)";
const char* const kGeneralHost = "top-k: general select (rows past 16384 keys)";
const char* const kDeviceScores = "index scores: device-driven over the capped grid";

const std::vector<SizeCase>& size_cases() {
  using How = gpu::Served::How;
  const std::string within_rows = gpu::kTopkRowPathNames[0], short_rows = gpu::kTopkRowPathNames[1],
                    ranked_rows = gpu::kTopkRowPathNames[2];
  static const std::vector<SizeCase> cases = [&] {
    std::vector<SizeCase> v;
    const Config tiny = preset("tiny");  // one F layer, K 8, blocks of 5, HI 4, Lkv 32
    const int K = tiny.index_topk;
    // indexer_topk's short-prefill shortcut (attention.cu; device-driven: the live flag).
    for (bool at : {false, true})
      v.push_back(
          {at ? "shortcut_past_k" : "shortcut_within_k",
           "indexer_topk short-prefill shortcut: longest context <= K", at,
           [=](int) { return decode_rows(tiny, {at ? K + 1 : K}); }, longest, fixed(K + 1),
           at ? std::vector<std::string>{kMma, kShortHost, short_rows}
              : std::vector<std::string>{"index scores skipped: every row within K",
                                         "top-k: every row within K", within_rows},
           at ? std::vector<std::string>{"index scores skipped: every row within K", within_rows}
              : std::vector<std::string>{kMma, short_rows},
           at ? std::vector<std::string>{kDeviceScores}
              : std::vector<
                    std::string>{"index scores skipped: every row within K (on the device)"},
           How::full_graph});
    // topk_select: the short path's tiers (rows straddling each) and the general select.
    {
      std::vector<int> tiers{K + 1};
      for (int e : kTopkTierKeys) {
        tiers.push_back(e);
        if (e < kTopkShortKeys) tiers.push_back(e + 1);
      }
      v.push_back({"topk_rows_up_to_16384_keys",
                   "topk_select: short path (bins in registers)",
                   false,
                   [=](int) { return decode_rows(tiny, tiers, 16); },
                   longest,
                   fixed(kTopkShortKeys + 1),
                   {kShortHost, short_rows},
                   {kGeneralHost, ranked_rows},
                   {kDeviceScores, kShortHost},
                   How::full_graph});
      v.push_back({"topk_rows_past_16384_keys",
                   "topk_select: short path (bins in registers)",
                   true,
                   [=](int) {
                     return decode_rows(tiny, {kTopkShortKeys, kTopkShortKeys + 1});
                   },
                   longest,
                   fixed(kTopkShortKeys + 1),
                   {kGeneralHost, short_rows, ranked_rows},
                   {kShortHost},
                   {kDeviceScores, kGeneralHost},
                   How::full_graph});
    }
    // The device-driven scores' capped grid: at capture size kGridLoopT a block loops over the
    // chunks past cap x 64 keys (host-driven: one more grid row past 64 keys).
    for (bool at : {false, true})
      v.push_back({at ? "score_grid_loops" : "score_grid_one_pass",
                   "index scores (device-driven): chunk loop past the capped grid",
                   at,
                   [=](int sms) {
                     const int edge = grid_cap(sms, kGridLoopT) * kScoreChunkKeys;
                     return decode_rows(tiny, {at ? edge + 1 : edge}, kGridLoopT);
                   },
                   longest,
                   [](const Scenario&, int sms) {
                     return static_cast<long>(grid_cap(sms, kGridLoopT)) * kScoreChunkKeys + 1;
                   },
                   {kMma},
                   {},
                   {kDeviceScores},
                   How::full_graph});
    // index_scores_mma: one token a block below 256 rows, eight from 256 (64 indexer heads: four
    // whole head tiles); requests change inside the last block of eight.
    {
      const Config hi64 = tiny_with("tiny", [](Config& c) { c.index_n_heads = kMmaHeads; });
      for (bool at : {false, true})
        v.push_back({at ? "mma_eight_tokens_a_block" : "mma_one_token_a_block",
                     "index_scores_mma: tokens a block (index_mma_tokens)",
                     at,
                     [=](int) {
                       const int chunk = at ? 255 : 254;
                       Scenario s{hi64, blocks_for(hi64, {30 + chunk, 41}), {}};
                       ScenarioBuilder b(hi64, kSeed, s.num_blocks);
                       s.steps.push_back(b.step({{0, chunk, 30}, {1, 1, 40}}, 256));
                       return s;
                     },
                     largest_ta,
                     fixed(kMmaTokensRows),
                     {kMma},
                     {kGrouped, kPerKey},
                     {},
                     std::nullopt});
    }
    // The score kernel: tensor cores up to 64 indexer heads, the CUDA-core kernels past them
    // (two chunks of eight heads a group).
    for (bool at : {false, true}) {
      const Config c = tiny_with("tiny", [&](Config& x) { x.index_n_heads = kMmaHeads + at; });
      v.push_back({at ? "index_heads_65_cuda_cores" : "index_heads_64_tensor_cores",
                   "index scores: tensor cores (index_mma_fits: HI <= 64)",
                   at,
                   [=](int) { return mixed_then_decode(c); },
                   config_size(&Config::index_n_heads),
                   fixed(kMmaHeads + 1),
                   {at ? kGrouped : kMma},
                   {at ? kMma : kGrouped},
                   {},
                   std::nullopt});
    }
    // The CUDA-core kernels: a thread per key once rows x 128-key chunks fill 2 x SMs.
    {
      const Config hi65 = tiny_with("tiny", [](Config& c) { c.index_n_heads = kMmaHeads + 1; });
      for (bool at : {false, true})
        v.push_back({at ? "cuda_core_scores_per_key" : "cuda_core_scores_grouped",
                     "index scores (CUDA cores): per key from 2 x SMs chunks",
                     at,
                     [=](int sms) {
                       const int len = kPerKeyChunkKeys * (2 * sms - 1) + (at ? 1 : 0);
                       return decode_rows(hi65, {len});
                     },
                     [](const Scenario& s, int) {
                       long n = 0;
                       for (const StepInput& in : s.steps) {
                         int len = 0;
                         for (const RequestStep& r : in.requests) len = std::max(len, r.seq_len());
                         n = std::max<long>(n,
                                            static_cast<long>(in.num_tokens) *
                                                ((len + kPerKeyChunkKeys - 1) / kPerKeyChunkKeys));
                       }
                       return n;
                     },
                     [](const Scenario&, int sms) { return 2L * sms; },
                     {at ? kPerKey : kGrouped},
                     {at ? kGrouped : kPerKey, kMma},
                     {},
                     std::nullopt});
    }
    // fp8_ds_mla: the latent's 128-value tiles (one, two of which the second holds one value,
    // four as DSv3.2's 512).
    for (int L : {128, 129, 512}) {
      const Config c = tiny_with("tiny-fs", [&](Config& x) {
        x.kv_cache = KvCache::fp8_ds_mla;
        x.kv_lora_rank = L;
      });
      v.push_back({"fp8_latent_" + std::to_string(L),
                   "fp8_ds_mla latent tiles",
                   L > kDsMlaTile,
                   [=](int) { return mixed_then_decode(c); },
                   [](const Scenario& s, int) {
                     return static_cast<long>((s.cfg.kv_lora_rank + kDsMlaTile - 1) / kDsMlaTile);
                   },
                   fixed(2),
                   {},
                   {},
                   {},
                   std::nullopt});
    }
    // mqa_softmax: K entries in registers up to 2048, a loop past them. 64 indexer heads and
    // Lkv 512 in fp8_ds_mla, a row past K and one within it.
    for (int k : {kSoftmaxRegKeys, kSoftmaxRegKeys + 1}) {
      const Config c = tiny_with("tiny", [&](Config& x) {
        x.index_topk = k;
        x.index_n_heads = kMmaHeads;
        x.kv_cache = KvCache::fp8_ds_mla;
        x.kv_lora_rank = 512;
      });
      v.push_back({"topk_k_" + std::to_string(k),
                   "mqa_softmax: K in registers",
                   k > kSoftmaxRegKeys,
                   [=](int) {
                     return decode_rows(c, {2101, 1001});
                   },
                   config_size(&Config::index_topk),
                   fixed(kSoftmaxRegKeys + 1),
                   {kMma, within_rows, short_rows},
                   {},
                   {},
                   std::nullopt});
    }
    // input_norm: a row of up to 8192 values in registers; norm_rope_cache's q norm up to 1536.
    // Each a config size on either side of its register limit, over a mixed step and decodes.
    const auto row_in_registers = [&](const std::string& prefix, const std::string& what,
                                      int Config::*size, int limit) {
      for (int n : {limit, limit + 1}) {
        const Config c = tiny_with("tiny", [&](Config& x) { x.*size = n; });
        v.push_back({prefix + std::to_string(n),
                     what,
                     n > limit,
                     [=](int) { return mixed_then_decode(c); },
                     config_size(size),
                     fixed(limit + 1),
                     {},
                     {},
                     {},
                     std::nullopt});
      }
    };
    row_in_registers("hidden_", "input_norm: row in registers", &Config::hidden_size,
                     kNormRegValues);
    row_in_registers("q_lora_rank_", "norm_rope_cache: q row in registers", &Config::q_lora_rank,
                     kNrcRegValues);
    // The decode kernels (gemv, uk_small, uv_proj's gemv) up to capture size 4, cuBLAS above.
    {
      const Config fs = preset("tiny-fs");
      for (bool at : {false, true})
        v.push_back({at ? "decode_rows_5_cublas" : "decode_rows_4_gemv",
                     "gemv / uk_small / uv gemv: capture size <= 4",
                     at,
                     [=](int) {
                       return decode_rows(fs,
                                          at ? std::vector<int>{12, 20, 31, 9, 40}
                                             : std::vector<int>{12, 20, 31, 9},
                                          at ? 5 : 4);
                     },
                     largest_capture,
                     fixed(kGemvMaxRows + 1),
                     {},
                     {},
                     {},
                     How::full_graph});
    }
    // mqa_gather: a plain cache row in 16-byte pieces when Lkv and the rope part are whole
    // pieces (bf16: dr 8), element by element otherwise (dr 6).
    for (int dr : {8, 6}) {
      const Config c = tiny_with("tiny-fs", [&](Config& x) { x.qk_rope_head_dim = dr; });
      v.push_back({"gather_rope_dim_" + std::to_string(dr),
                   "mqa_gather: 16-byte pieces",
                   dr * 2 % 16 != 0,
                   [=](int) { return mixed_then_decode(c); },
                   [](const Scenario& s, int) {
                     const long bytes = 2;  // bf16
                     return (s.cfg.kv_lora_rank * bytes) % 16 +
                            (s.cfg.qk_rope_head_dim * bytes) % 16;
                   },
                   fixed(1),
                   {},
                   {},
                   {},
                   std::nullopt});
    }
    // The dispatch: a uniform decode batch of up to 8 new tokens a request is the full graph's.
    {
      const Config fs = preset("tiny-fs");
      for (bool at : {false, true})
        v.push_back({at ? "verify_9_tokens_piecewise" : "verify_8_tokens_full_graph",
                     "full-and-piecewise: uniform decode q <= 8",
                     at,
                     [=](int) {
                       const int q = boundary::kMaxUniformDecodeTokens + (at ? 1 : 0);
                       Scenario s{fs, blocks_for(fs, {20 + q, 30 + q}), {}};
                       ScenarioBuilder b(fs, kSeed, s.num_blocks);
                       s.steps.push_back(b.step({{0, q, 20}, {1, q, 30}}, at ? 24 : 16));
                       return s;
                     },
                     [](const Scenario& s, int) {
                       long q = 0;
                       for (const RequestStep& r : s.steps.front().requests)
                         q = std::max<long>(q, r.q);
                       return q;
                     },
                     fixed(boundary::kMaxUniformDecodeTokens + 1),
                     {},
                     {},
                     {},
                     at ? How::piecewise_graph : How::full_graph});
    }
    return v;
  }();
  return cases;
}

/// The device's SM count, from gpu::device_summary ("... (sm_90, 132 SMs, ...)").
int device_sms() {
  const std::string s = gpu::device_summary();
  const std::size_t end = s.find(" SMs");
  if (end == std::string::npos) throw std::runtime_error("no SM count in '" + s + "'");
  const std::size_t begin = s.rfind(' ', end - 1);
  return std::stoi(s.substr(begin + 1, end - begin - 1));
}

std::string listed(const std::map<std::string, long>& paths) {
  std::string out;
  for (const auto& [p, n] : paths) out += "\n  " + p + ": " + std::to_string(n);
  return out;
}

/// The steps under `plan` on one fresh stack, and its report.
gpu::StackReport report_under(const Scenario& s, const Weights& w, const std::string& plan,
                              const gpu::StackOptions& options = {}) {
  gpu::Stack stack(s.cfg, w, s.num_blocks, max_capture_size(s.steps), 0, nullptr, options);
  const boundary::Plan p = boundary::plan_preset(plan, s.cfg);
  for (const StepInput& in : s.steps) stack.run(p, in);
  return stack.report();
}

void expect_paths(const std::map<std::string, long>& paths, const std::vector<std::string>& want,
                  const std::vector<std::string>& absent, const std::string& plan) {
  for (const std::string& p : want)
    EXPECT_TRUE(paths.count(p)) << plan << ": no '" << p << "' among" << listed(paths);
  for (const std::string& p : absent)
    EXPECT_FALSE(paths.count(p)) << plan << ": '" << p << "' among" << listed(paths);
}

class GpuSizes : public ::testing::TestWithParam<SizeCase> {};

TEST_P(GpuSizes, TheScenarioSitsOnItsSide) {
  // No GPU needed: the switch variable from the scenario's sizes, at the H200's SM count.
  const SizeCase& c = GetParam();
  const Scenario s = c.make(kH200Sms);
  ASSERT_FALSE(s.steps.empty());
  const long value = c.value(s, kH200Sms), threshold = c.threshold(s, kH200Sms);
  EXPECT_EQ(value >= threshold, c.at) << c.what << ": " << value << " against " << threshold;
  // Just below or just at: one step of the variable from the threshold (the tiles and the
  // gather's remainder are counted, not stepped).
  if (c.name.rfind("fp8_latent_", 0) != 0 && c.name.rfind("gather_", 0) != 0 &&
      c.name != "topk_rows_up_to_16384_keys") {
    EXPECT_EQ(value, c.at ? threshold : threshold - 1) << c.what;
  }
  // Every context the first step starts from is a given prefix.
  const StepInput& first = s.steps.front();
  for (const RequestStep& r : first.requests) {
    if (r.ctx == 0) continue;
    EXPECT_EQ(std::count_if(first.given.begin(), first.given.end(),
                            [&](const auto& g) { return g->request_id == r.id; }),
              1)
        << "request " << r.id << " starts from a given prefix";
  }
  if (c.dispatch) {
    EXPECT_EQ(boundary::uniform_decode(s.steps.front()),
              *c.dispatch == gpu::Served::How::full_graph);
  }
}

TEST_P(GpuSizes, TheOracleAsACandidatePassesTheJudge) {
  // No GPU needed: the oracle's own emulated run (its own sets, as a GPU picks them) passes the
  // judge, so a GPU test's oracle failure is the GPU's, not a scenario too close to judge.
  const SizeCase& c = GetParam();
  const Scenario s = c.make(kH200Sms);
  const auto w = std::make_shared<const Weights>(Weights::generate(s.cfg, kSeed));
  Oracle t1(s.cfg, w, Mode::emulated, s.num_blocks);
  std::vector<StepTrace> run;
  for (const StepInput& in : s.steps) run.push_back(t1.step(in));
  const Judgement j = judge(s.cfg, w, s.num_blocks, s.steps, run);
  EXPECT_GT(j.stages, 0);
  for (const std::string& f : j.failures) ADD_FAILURE() << c.name << ": " << f;
}

TEST(GpuSizesScenarios, TheTopkRowsStraddleEveryTierOfTheShortPath) {
  // No GPU needed: rows of 4096 and 4097, 8192 and 8193, ... keys (topk_short<4, 8, 10, 12, 16>),
  // the last tier's edge 16384 in the general-select scenario beside 16385.
  Scenario below, above;
  for (const SizeCase& c : size_cases()) {
    if (c.name == "topk_rows_up_to_16384_keys") below = c.make(kH200Sms);
    if (c.name == "topk_rows_past_16384_keys") above = c.make(kH200Sms);
  }
  ASSERT_EQ(below.steps.size(), 1u);
  ASSERT_EQ(above.steps.size(), 1u);
  const auto has_row = [](const Scenario& s, int n) {
    const auto& r = s.steps.front().requests;
    return std::any_of(r.begin(), r.end(), [&](const RequestStep& q) { return q.seq_len() == n; });
  };
  for (int e : kTopkTierKeys) {
    EXPECT_TRUE(has_row(below, e)) << e;
    if (e < kTopkShortKeys)
      EXPECT_TRUE(has_row(below, e + 1)) << e + 1;
    else
      EXPECT_TRUE(has_row(above, e + 1)) << e + 1;
  }
  EXPECT_TRUE(has_row(below, below.cfg.index_topk + 1));
}

TEST_P(GpuSizes, EveryPlanGivesEagerBitsAndEagerPassesTheOracle) {
  DSV32_REQUIRE_GPU();
  const SizeCase& c = GetParam();
  const int sms = device_sms();
  const Scenario s = c.make(sms);
  ASSERT_EQ(c.value(s, sms) >= c.threshold(s, sms), c.at) << c.what << " on " << sms << " SMs";
  if (c.name.rfind("score_grid_", 0) == 0) {  // one chunk in the capped grid: a loop past 64 keys
    ASSERT_EQ(grid_cap(sms, kGridLoopT), 1) << sms << " SMs";
  }
  const auto w = std::make_shared<const Weights>(Weights::generate(s.cfg, kSeed));
  EXPECT_EQ(testing::check_plans(s.cfg, w, s.num_blocks, s.steps, boundary::plan_names()), "");
  if (!c.paths.empty() || !c.absent.empty())
    expect_paths(report_under(s, *w, "eager").kernel_paths, c.paths, c.absent, "eager");
  if (!c.full_paths.empty())
    expect_paths(report_under(s, *w, "full").kernel_paths, c.full_paths, {}, "full");
  if (c.dispatch) {
    const gpu::StackReport r = report_under(s, *w, "full-and-piecewise");
    ASSERT_FALSE(r.served.empty());
    EXPECT_EQ(gpu::Served::text(r.served.front().how), gpu::Served::text(*c.dispatch));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GpuSizes, ::testing::ValuesIn(size_cases()),
                         [](const ::testing::TestParamInfo<SizeCase>& p) { return p.param.name; });

TEST(GpuSizesRadix, RadixPassesAloneInAndPastTheirRegisters) {
  // topk_bins off: the radix select holds 16 keys a thread in registers (rows up to 16384) and
  // reads the rest again from memory; rows of 16384 and 16385 keys, one each. topk_bins changes
  // no bit, so the run must give the default run's bits, eagerly and in the full graph.
  DSV32_REQUIRE_GPU();
  const Config tiny = preset("tiny");
  const Scenario s = decode_rows(tiny, {kTopkShortKeys, kTopkShortKeys + 1});
  const Weights w = Weights::generate(s.cfg, kSeed);
  gpu::StackOptions radix;
  radix.topk_bins = false;
  const std::vector<StepTrace> base =
      gpu::run_steps(s.cfg, w, s.num_blocks, s.steps, boundary::plan_preset("eager", s.cfg));
  for (const char* plan : {"eager", "full-and-piecewise"}) {
    const std::vector<StepTrace> got = gpu::run_steps(
        s.cfg, w, s.num_blocks, s.steps, boundary::plan_preset(plan, s.cfg), "", nullptr, radix);
    EXPECT_EQ(first_difference(s.cfg, base, got), "") << plan;
  }
  const std::map<std::string, long> paths = report_under(s, w, "eager", radix).kernel_paths;
  const std::string radix_rows = gpu::kTopkRowPathNames[4];
  ASSERT_TRUE(paths.count(radix_rows)) << listed(paths);
  EXPECT_EQ(paths.at(radix_rows), 2) << "both rows, one F layer";
  EXPECT_TRUE(paths.count("top-k: radix passes alone")) << listed(paths);
}

}  // namespace
}  // namespace dsv32

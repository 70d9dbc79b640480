// The case registry: one list of named cases; the name is the filter key and the file name.
#include <stdexcept>

#include "dsv32/golden/golden.hpp"

namespace dsv32::golden {
namespace {

CaseSpec make(std::string name, std::string description, Config cfg, std::vector<StepPlan> steps) {
  CaseSpec c;
  c.name = std::move(name);
  c.description = std::move(description);
  cfg.name = c.name;
  cfg.validate();
  c.cfg = std::move(cfg);
  c.steps = std::move(steps);
  return c;
}

// Two steps over three requests, one of them joining in the second step: used by the
// single-switch cases so each switch is seen on prefill, decode and a mixed batch.
std::vector<StepPlan> two_mixed_steps() {
  return {{{{0, 10}, {1, 2}}, 0, {}}, {{{0, 1}, {1, 1}, {2, 3}}, 8, {}}};
}

// Two layers (F then S) of the tiny config with one switch changed.
template <class F>
Config tiny_fs_with(F&& tweak) {
  Config c = preset("tiny-fs");
  c.num_layers = 2;
  c.index_topk_pattern = "FS";
  tweak(c);
  return c;
}

std::vector<CaseSpec> build() {
  std::vector<CaseSpec> r;
  r.push_back(make("default",
                   "The main job's scenario: prefill, padded mixed steps, contexts beyond K",
                   preset("tiny-fs"),
                   {{{{0, 12}, {1, 3}}, 16, {}},
                    {{{0, 1}, {1, 1}, {2, 5}}, 8, {}},
                    {{{0, 1}, {1, 9}, {2, 1}}, 16, {}},
                    {{{0, 1}, {2, 1}}, 2, {}}}));
  r.push_back(make("prefill-only", "One prefill-only step of two requests", preset("tiny-fs"),
                   {{{{0, 7}, {1, 3}}, 0, {}}}));
  r.push_back(make("decode-only", "A prefill, then three decode-only steps", preset("tiny-fs"),
                   {{{{0, 5}, {1, 9}, {2, 2}}, 0, {}},
                    {{{0, 1}, {1, 1}, {2, 1}}, 0, {}},
                    {{{0, 1}, {1, 1}, {2, 1}}, 0, {}},
                    {{{0, 1}, {1, 1}, {2, 1}}, 0, {}}}));
  r.push_back(make("mixed", "Decode and prefill in one step; a request finishes, another joins",
                   preset("tiny-fs"),
                   {{{{0, 6}}, 0, {}},
                    {{{0, 1}, {1, 4}}, 0, {}},
                    {{{0, 1}, {1, 1}, {2, 10}}, 0, {1}},
                    {{{0, 1}, {2, 1}, {3, 3}}, 0, {}}}));
  r.push_back(make(
      "ctx-around-k", "Decode at p+1 = K-1, K, K+1 and 4K+1 (K = 8)", preset("tiny-fs"),
      {{{{0, 6}, {1, 7}, {2, 8}, {3, 32}}, 0, {}}, {{{0, 1}, {1, 1}, {2, 1}, {3, 1}}, 0, {}}}));
  r.push_back(make("fs-pattern", "FSSF layers, K = 4, block size 3", preset("tiny-deep"),
                   {{{{0, 9}, {1, 2}}, 0, {}}, {{{0, 1}, {1, 1}, {2, 5}}, 0, {}}}));
  r.push_back(make("hadamard-on", "hadamard = on",
                   tiny_fs_with([](Config& c) { c.hadamard = Hadamard::on; }), two_mixed_steps()));
  r.push_back(make("indexer-rope-interleaved", "indexer_rope = interleaved",
                   tiny_fs_with([](Config& c) { c.indexer_rope = IndexerRope::interleaved; }),
                   two_mixed_steps()));
  r.push_back(make("kv-fp8", "kv_cache = fp8_ds_mla",
                   tiny_fs_with([](Config& c) { c.kv_cache = KvCache::fp8_ds_mla; }),
                   two_mixed_steps()));
  r.push_back(make("rope-table-bf16", "rope_table = bf16",
                   tiny_fs_with([](Config& c) { c.rope_table = RopeTable::bf16; }),
                   two_mixed_steps()));
  r.push_back(make("precision-fp32", "precision = fp32",
                   tiny_fs_with([](Config& c) { c.precision = Precision::fp32; }),
                   two_mixed_steps()));
  r.push_back(make("padded", "T_a < T: T_a = T - 3, T - 2, and 1 under T = 16", preset("tiny-fs"),
                   {{{{0, 5}}, 8, {}}, {{{0, 1}, {1, 2}}, 4, {}}, {{{0, 1}}, 16, {}}}));
  r.push_back(make("odd-block", "block size 3, permuted block tables, 40-token context",
                   tiny_fs_with([](Config& c) { c.block_size = 3; }),
                   {{{{0, 40}, {1, 2}}, 0, {}}, {{{0, 1}, {1, 1}}, 0, {}}}));
  r.push_back(make("wide", "Wider heads (H = 8, K = 32, B = 16), context far beyond K",
                   preset("tiny-wide"),
                   {{{{0, 40}, {1, 8}}, 0, {}}, {{{0, 1}, {1, 1}, {2, 3}}, 8, {}}}));
  Config full = preset("dsv32");
  full.index_topk_pattern = "F";
  // Steps of 96, 2 and 1 tokens: the GPU's products take cuBLAS at 96 rows (uv_proj too), the
  // decode GEMV at 2 rows, and at one row also o_proj's long-row GEMV (docs/GPU.md).
  CaseSpec f = make("dsv32-full", "Full DeepSeek-V3.2 sizes, one layer (generated on demand)", full,
                    {{{{0, 64}, {1, 32}}, 0, {}}, {{{0, 1}, {1, 1}}, 0, {}}, {{{0, 1}}, 0, {}}});
  f.committed = false;
  f.num_blocks = 8;
  r.push_back(std::move(f));
  // Bait for the mutants (BOUNDARIES.md section 4): every step padded to one capture size
  // (captured while contexts are short, replayed past K), a row whose context shrinks between
  // steps (stale top-k entries show), a small pool so physical block 0 is in use (a padded row
  // written to slot 0 hits a real token), F and S layers.
  CaseSpec bait =
      make("mutant-bait", "Steps that expose every mutant (generated on demand)", preset("tiny-fs"),
           {{{{0, 12}, {1, 3}}, 16, {}},
            {{{0, 1}, {1, 1}}, 16, {}},
            {{{1, 1}, {0, 1}, {2, 4}}, 16, {}},
            {{{2, 1}, {1, 1}, {0, 1}}, 16, {}}});
  bait.committed = false;
  bait.num_blocks = 9;
  r.push_back(std::move(bait));
  return r;
}

}  // namespace

const std::vector<CaseSpec>& registry() {
  static const std::vector<CaseSpec> cases = build();
  return cases;
}

CaseSpec find_case(const std::string& name) {
  std::string known;
  for (const CaseSpec& c : registry()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  throw std::invalid_argument("unknown case '" + name + "' (known: " + known + ")");
}

}  // namespace dsv32::golden

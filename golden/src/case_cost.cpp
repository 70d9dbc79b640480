// What a case costs to generate (its estimate, printed before it runs) and the stages a
// candidate of it provides (the skeleton `dsv32 golden --spec` writes beside its golden).
#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv32/golden/case_file.hpp"
#include "dsv32/oracle/stages.hpp"

namespace dsv32::golden {

CaseEstimate estimate(const CaseSpec& spec) {
  const Config& c = spec.cfg;
  const double D = c.hidden_size, H = c.num_heads, Rq = c.q_lora_rank, L = c.kv_lora_rank,
               dr = c.qk_rope_head_dim, dv = c.v_head_dim, HI = c.index_n_heads,
               dI = c.index_head_dim, K = c.index_topk;
  const double weights = c.layer_weight_count();
  const double slots = static_cast<double>(spec.num_blocks) * c.block_size;
  CaseEstimate e;
  // Weights in double, twice (the case and each oracle's shared copy), and two oracles' caches.
  e.bytes = 8.0 * c.num_layers * (2 * weights + 2 * slots * (L + dr + dI + 1));
  std::map<int, double> ctx;
  double flops = 0, trace = 0, given = 0;
  for (const StepPlan& p : spec.steps) {
    double tokens = 0;
    for (const StepRequest& r : p.requests) {
      ctx[r.id] += r.given_prefix;  // drawn, not computed: held (and written), no arithmetic
      given += r.given_prefix;
      for (int i = 0; i < r.q; ++i) {
        const double pos = ctx[r.id] + i + 1;
        flops += 2 * (HI * dI * pos + H * std::min(pos, K) * (2 * L + dr));
      }
      ctx[r.id] += r.q;
      tokens += r.q;
    }
    flops += 2 * tokens * weights;
    trace += tokens * (Rq + 2 * L + 2 * dr + H * (2 * L + dr + dv + 1) + 2 * HI * dI + K + D);
  }
  const double traces = 8.0 * c.num_layers * trace * 2;  // T0 and T1, as doubles
  // Writing adds the file's image in memory (T0 in float64, T1 in at most float32: about 3/4 of
  // the doubles) while the reader checks it: one 16384-token step of `tiny` measured 0.74 GiB
  // resident (GNU time), estimated 0.44 GiB without this term and 0.75 GiB with it.
  e.bytes += traces + 0.75 * traces;
  // A given prefix held as doubles, and its file image (at most a quarter of that).
  e.bytes += 1.25 * 8.0 * c.num_layers * given * (L + L / 128 + dr + dI + 1);
  // Two oracles at about 20 GFLOP/s, and about 90 ns a weight to draw it, keep it in both
  // precisions and write it (measured on this machine kind at dsv32 sizes).
  e.seconds = 2.0 * c.num_layers * flops / 20e9 + 9e-8 * c.num_layers * weights;
  return e;
}

std::string candidate_skeleton(const CaseSpec& spec) {
  const Config& c = spec.cfg;
  nlohmann::ordered_json out{{"case", spec.name},
                             {"layout", "docs/CANDIDATE.md"},
                             {"steps", nlohmann::ordered_json::array()}};
  for (std::size_t s = 0; s < spec.steps.size(); ++s) {
    std::int64_t tokens = 0;
    for (const StepRequest& r : spec.steps[s].requests) tokens += r.q;
    nlohmann::ordered_json stages = nlohmann::ordered_json::object();
    for (int l = 0; l < c.num_layers; ++l)
      for (const Stage st : layer_stages()) {
        if (stage_info(st).indexer && !c.is_full_layer(l)) continue;
        std::vector<std::int64_t> shape{tokens};
        for (const std::int64_t d : stage_tail(c, st)) shape.push_back(d);
        stages["layer" + std::to_string(l) + "/" + stage_name(st)] = shape;
      }
    stages["output"] = std::vector<std::int64_t>{tokens, c.hidden_size};
    out["steps"].push_back({{"group", "/steps/step" + std::to_string(s) + "/expected"},
                            {"num_tokens", tokens},
                            {"stages", stages}});
  }
  return out.dump(2) + "\n";
}

}  // namespace dsv32::golden

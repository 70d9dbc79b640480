#include "dsv32/judge/judge.hpp"

#include <map>
#include <utility>

#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

/// Records a failure, and where it is when it is the first.
void fail(Judgement& j, int step, int layer, const std::string& stage, std::string line) {
  if (j.failures.empty()) j.first_step = step, j.first_layer = layer, j.first_stage = stage;
  j.failures.push_back(std::move(line));
}

}  // namespace

Judgement judge(const Config& cfg, std::shared_ptr<const Weights> w, int num_blocks,
                const std::vector<StepInput>& steps, const std::vector<StepTrace>& gpu, int tp) {
  Oracle t0(cfg, w, Mode::exact, num_blocks), t1(cfg, std::move(w), Mode::emulated, num_blocks);
  const int HI = cfg.index_n_heads, dI = cfg.index_head_dim, K = cfg.index_topk;
  std::vector<StepTrace> want0, want1;
  // The GPU's own indexer keys, from its traces: (layer, request id, position) -> key.
  std::map<std::tuple<int, int, int>, std::pair<std::vector<double>, double>> keys;
  Judgement j;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const StepInput& in = steps[s];
    const std::size_t failures_before = j.failures.size();
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (!cfg.is_full_layer(l)) continue;
      const LayerTrace& lt = gpu[s].layers[l];
      const Tensor &k8 = lt.at("kI8"), &ks = lt.at("kI_scale");
      for (int t = 0; t < in.num_tokens; ++t)
        keys[{l, in.requests[in.request_of_token[t]].id, in.positions[t]}] = {
            std::vector<double>(k8.data.begin() + t * dI, k8.data.begin() + (t + 1) * dI),
            ks.data[t]};
      const TopkRows rows = topk_rows(lt);
      for (int t = 0; t < in.num_tokens; ++t) {
        const int id = in.requests[in.request_of_token[t]].id;
        std::vector<const double*> kp;
        std::vector<double> kscale;
        for (int p = 0; p <= in.positions[t]; ++p) {
          const auto& e = keys.at({l, id, p});
          kp.push_back(e.first.data());
          kscale.push_back(e.second);
        }
        const IndexScores sc = index_score_row(
            &lt.at("qI8").data[static_cast<std::size_t>(t) * HI * dI],
            &lt.at("omega").data[static_cast<std::size_t>(t) * HI], HI, dI, kp, kscale);
        double eps = 0;
        for (double a : sc.abs_terms) eps = std::max(eps, index_score_eps(cfg, a));
        const std::vector<int> row(rows.row(t).data(), rows.row(t).data() + K);
        ++j.topk_rows;
        if (const std::string why = check_topk_row(row, sc.score, K, eps); !why.empty())
          fail(j, static_cast<int>(s), l, "topk",
               "step" + std::to_string(s) + "/layer" + std::to_string(l) + "/topk token " +
                   std::to_string(t) + ": " + why);
      }
    }
    // The oracle follows the GPU's sets: invalid ones cannot be followed, so judging stops here.
    if (j.failures.size() > failures_before) return j;
    // ... and its fp8 cache codes, judged by the `c` stage itself (one quantum).
    // T1 rounds where the GPU's group does: each rank's o_proj partial, then their sum.
    const StepOptions follow = StepOptions::follow(cfg, gpu[s], /*cache_codes=*/true);
    StepOptions follow1 = follow;
    follow1.o_proj_ranks = tp;
    want0.push_back(t0.step(in, follow));
    want1.push_back(t1.step(in, follow1));
  }
  for (const StageDiff& d : diff_traces(cfg, gpu, want0, want1)) {
    ++j.stages;
    if (!d.result.pass) {
      j.vacuous += d.result.vacuous ? 1 : 0;
      fail(j, d.step, d.layer, d.stage,
           d.where() + " (op " + std::string(stage_op(d.stage)) + "): " + d.result.summary());
      continue;
    }
    // Quantized stages report quanta and top-k rows counts: only tolerance gates give a ratio.
    const bool gated = d.stage != "topk" && !d.result.in_quanta;
    const double ratio = gated && d.result.tol > 0 ? d.result.max_err / d.result.tol : 0.0;
    if (ratio > j.worst) j.worst = ratio, j.worst_where = d.where();
  }
  return j;
}

std::string Divergence::where() const {
  return "step" + std::to_string(step) + "/" +
         (layer < 0 ? std::string() : "layer" + std::to_string(layer) + "/") + stage;
}

Divergence first_divergence(const Config& cfg, const std::vector<StepTrace>& a,
                            const std::vector<StepTrace>& b) {
  Divergence d;
  if (a.size() != b.size()) {
    d.step = 0;
    d.stage = "steps";
    d.detail =
        "different step counts: " + std::to_string(a.size()) + " and " + std::to_string(b.size());
    return d;
  }
  for (std::size_t s = 0; s < a.size(); ++s) {
    for (int l = 0; l < cfg.num_layers; ++l)
      for (const Tensor& t : a[s].layers[l].tensors) {
        const CompareResult r = compare_abs(b[s].layers[l].at(t.name), t, 0.0);
        if (!r.pass) return {static_cast<int>(s), l, t.name, r.summary()};
      }
    const CompareResult r = compare_abs(b[s].output, a[s].output, 0.0);
    if (!r.pass) return {static_cast<int>(s), -1, "output", r.summary()};
  }
  return d;
}

std::string first_difference(const Config& cfg, const std::vector<StepTrace>& a,
                             const std::vector<StepTrace>& b) {
  const Divergence d = first_divergence(cfg, a, b);
  if (!d.found()) return "";
  if (d.stage == "steps") return d.detail;
  return "step" + std::to_string(d.step) + "/" +
         (d.layer < 0 ? std::string() : "layer" + std::to_string(d.layer) + "/") + d.detail;
}

}  // namespace dsv32

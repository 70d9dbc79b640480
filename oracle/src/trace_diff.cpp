#include "dsv32/oracle/trace_diff.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "dsv32/oracle/numerics.hpp"

namespace dsv32 {
namespace {

/// Top-k rows compared as sets; max_err counts rows whose sets differ.
CompareResult compare_topk(const Tensor& got, const Tensor& want) {
  CompareResult r = compare_abs(got, want, 0.0);  // shape check, first bad element
  if (r.refused) return r;
  const std::int64_t rows = want.shape.at(0), K = want.shape.at(1);
  std::int64_t bad_rows = 0, first = -1;
  for (std::int64_t t = 0; t < rows; ++t) {
    std::set<double> a, b;
    for (std::int64_t k = 0; k < K; ++k) {
      if (got.data[t * K + k] >= 0) a.insert(got.data[t * K + k]);
      if (want.data[t * K + k] >= 0) b.insert(want.data[t * K + k]);
    }
    if (a != b) {
      ++bad_rows;
      if (first < 0) first = t;
    }
  }
  r.rule = "same index set per row";
  r.max_err = static_cast<double>(bad_rows);
  r.tol = 0;
  r.count = rows;
  r.count_over = bad_rows;
  r.first_bad = -1;
  if (first >= 0) {  // both sides write a row in ascending order: show the first entry that differs
    std::int64_t k = 0;
    while (k + 1 < K && got.data[first * K + k] == want.data[first * K + k]) ++k;
    r.first_bad = first * K + k;
    r.got_at = got.data[r.first_bad];
    r.want_at = want.data[r.first_bad];
  }
  r.pass = bad_rows == 0;
  if (bad_rows)
    r.note = std::to_string(bad_rows) + " row(s) select a different set; first row " +
             std::to_string(first);
  return r;
}

/// omega = w * qI_scale * const: divide out the power-of-two scale, which may legally differ by
/// 2x (judged with qI8), so the gate sees the head weights' own rounding.
Tensor per_scale(const Tensor& omega, const Tensor& scale) {
  Tensor t = omega;
  for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] /= scale.data[i];
  return t;
}

/// The stages judged through `scale` (TESTING.md), joined with `joint` ("qI8 or omega"); "" for
/// a stage that is no scale.
std::string judged_through(Stage scale, const char* joint) {
  std::string users;
  for (const Stage s : layer_stages())
    if (stage_info(s).scale == scale) users += (users.empty() ? "" : joint) + stage_name(s);
  return users;
}

}  // namespace

std::string unjudgeable_stage(const LayerTrace& layer) {
  for (const Stage s : layer_stages()) {
    if (!layer.find(s)) continue;
    const std::string& name = stage_name(s);
    if (const std::optional<Stage> sc = stage_info(s).scale; sc && !layer.find(*sc))
      return name + ": provided without " + stage_name(*sc) +
             "; a quantized stage is judged with its scale: " + "provide " + stage_name(*sc) +
             ", or leave out " + name;
    if (stage_info(s).rule != Rule::scale) continue;
    bool judged = false;
    for (const Stage user : layer_stages())
      if (stage_info(user).scale == s && layer.find(user)) judged = true;
    if (!judged)
      return name + ": provided without " + judged_through(s, " and ") +
             "; a scale is judged with its codes: provide " + judged_through(s, " or ") +
             ", or leave out " + name;
  }
  return "";
}

std::string StageDiff::where() const {
  return "step" + std::to_string(step) + "/" +
         (layer < 0 ? std::string() : "layer" + std::to_string(layer) + "/") + stage;
}

std::int64_t fp32_chain_dot(const Config& c, int layer) {
  const std::int64_t per_layer =
      2 * std::int64_t{c.hidden_size} + c.q_lora_rank + c.qk_nope_head_dim +
      std::int64_t{c.index_n_heads} * c.index_head_dim + c.kv_lora_rank + c.qk_rope_head_dim +
      c.index_topk + c.kv_lora_rank + std::int64_t{c.num_heads} * c.v_head_dim;
  return per_layer * ((layer < 0 ? c.num_layers - 1 : layer) + 1);
}

std::vector<StageDiff> diff_traces(const Config& cfg, const std::vector<StepTrace>& cand,
                                   const std::vector<StepTrace>& t0,
                                   const std::vector<StepTrace>& t1) {
  std::vector<StageDiff> out;
  // The scale a stage is divided by before its gate (per_scale: omega), or nullopt.
  const auto divided_by = [](const Tensor& t) -> std::optional<Stage> {
    const std::optional<Stage> s = find_stage(t.name);
    if (s && stage_info(*s).rule == Rule::per_scale) return stage_info(*s).scale;
    return std::nullopt;
  };
  // fp32: each stage's magnitude over the run, the scale of its gate (compare_fp32).
  std::map<std::pair<int, std::string>, double> scale;
  if (cfg.precision == Precision::fp32)
    for (const StepTrace& st : t0) {
      for (int l = 0; l < cfg.num_layers && l < static_cast<int>(st.layers.size()); ++l)
        for (const Tensor& t : st.layers[l].tensors) {
          double& m = scale[{l, t.name}];
          const std::optional<Stage> sc = divided_by(t);
          m = std::max(m, sc ? max_abs(per_scale(t, st.layers[l].at(*sc))) : max_abs(t));
        }
      double& m = scale[{-1, stage_name(Stage::output)}];
      m = std::max(m, max_abs(st.output));
    }
  // bf16: each stage's largest T1 - T0 over the run, the floor of its spread term. One step's
  // few values (lse: T_a x H of them) can make T1's rounding noise look smaller than it is: two
  // GPU properties failed lse at 1.05-1.10x a per-step gate on tiny configurations (H <= 2,
  // K <= 3) with GPU kernels that had passed them before; see docs/TOLERANCES.md.
  std::map<std::pair<int, std::string>, double> run_spread;
  if (cfg.precision == Precision::bf16) {
    const std::size_t n = std::min(t0.size(), t1.size());
    for (std::size_t s = 0; s < n; ++s) {
      for (int l = 0; l < cfg.num_layers && l < static_cast<int>(t0[s].layers.size()) &&
                      l < static_cast<int>(t1[s].layers.size());
           ++l)
        for (const Tensor& x0 : t0[s].layers[l].tensors) {
          const Tensor* x1 = t1[s].layers[l].find(x0.name);
          const std::optional<Stage> st = find_stage(x0.name);
          if (!x1 || x1->shape != x0.shape || (st && stage_info(*st).rule == Rule::sets)) continue;
          double& m = run_spread[{l, x0.name}];
          const std::optional<Stage> sc = divided_by(x0);
          m = std::max(m, sc ? max_abs_diff(per_scale(*x1, t1[s].layers[l].at(*sc)),
                                            per_scale(x0, t0[s].layers[l].at(*sc)))
                             : max_abs_diff(*x1, x0));
        }
      if (t1[s].output.shape == t0[s].output.shape) {
        double& m = run_spread[{-1, stage_name(Stage::output)}];
        m = std::max(m, max_abs_diff(t1[s].output, t0[s].output));
      }
    }
  }
  // layer: the stage's layer, -1 for the step's output.
  const auto gate = [&](Stage st, const Tensor& g, const Tensor& x0, const Tensor& x1, int layer) {
    if (cfg.precision == Precision::fp32)
      return compare_fp32(g, x0, fp32_chain_dot(cfg, layer), scale[{layer, x0.name}]);
    // Under an fp8 latent cache, everything computed from it resolves to e4m3 quanta:
    // attention's outputs and what follows them in the layer, and every stage of later layers
    // (the residual stream carries them on). `c` itself has the quantized rule (below).
    const bool fp8_limited =
        cfg.kv_cache == KvCache::fp8_ds_mla && (layer != 0 || stage_info(st).after_attention);
    return compare_bf16(g, x0, x1, storage_dtype(cfg, st),
                        fp8_limited ? DType::float8_e4m3fn : DType::bfloat16,
                        run_spread[{layer, x0.name}]);
  };
  const std::size_t steps = std::min({cand.size(), t0.size(), t1.size()});
  for (std::size_t s = 0; s < steps; ++s) {
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerTrace &a = cand[s].layers.at(l), &b = t0[s].layers.at(l), &e = t1[s].layers.at(l);
      for (const Stage st : layer_stages()) {
        const StageInfo& info = stage_info(st);
        const std::string& name = stage_name(st);
        const Tensor* want = b.find(st);
        // A scale is judged through its codes (unjudgeable_stage refuses one given alone).
        if (!want || info.rule == Rule::scale) continue;
        StageDiff d{static_cast<int>(s), l, name, {}};
        const Tensor* got = a.find(st);
        // The scale a quantized stage is judged with must come with it.
        const std::optional<Stage> needs = info.scale;
        if (!got || (needs && !a.find(*needs))) {
          d.provided = false;
          d.result.tensor = name;
          d.result.refused = true;
          d.result.note = !got
                              ? "candidate has no stage '" + name + "'"
                              : "candidate has '" + name + "' without '" + stage_name(*needs) + "'";
          out.push_back(std::move(d));
          continue;
        }
        switch (info.rule) {
          case Rule::sets:
            d.result = compare_topk(*got, *want);
            break;
          case Rule::per_scale:
            d.result = gate(st, per_scale(*got, a.at(*needs)), per_scale(*want, b.at(*needs)),
                            per_scale(e.at(st), e.at(*needs)), l);
            break;
          case Rule::quantized: {
            const std::int64_t block = want->shape.back();
            // bf16 roundings before the quantizer move amax by up to ~2^-8.
            const double boundary = cfg.precision == Precision::bf16 ? 0x1p-7 : 1e-5;
            d.result = compare_quantized(*got, a.at(*needs), *want, b.at(*needs), block, &e.at(st),
                                         &e.at(*needs), boundary);
            break;
          }
          case Rule::cache:
            if (cfg.kv_cache == KvCache::fp8_ds_mla) {
              // An fp8 cache entry: TESTING.md's quantized rule (a code may flip where the GPU's
              // pre-quantization value differs from T1's in the last bits). The tile scale
              // comes from an RMSNorm over L values: the candidate's may differ from T0's by
              // the fp32 bound of that reduction. In bf16 a tile's spread is at least the
              // run's (one row's ten values of a tiny L can show less of T1's noise than there
              // is; TOLERANCES.md).
              d.result =
                  compare_fp8_cache(*got, *want, e.at(st), kDsMlaTile,
                                    2.0 * gamma_fp32(want->shape.back()), run_spread[{l, name}]);
              break;
            }
            [[fallthrough]];
          case Rule::gate:
          case Rule::scale:
            d.result = gate(st, *got, *want, e.at(st), l);
            break;
        }
        out.push_back(std::move(d));
      }
    }
    StageDiff d{static_cast<int>(s), -1, stage_name(Stage::output),
                gate(Stage::output, cand[s].output, t0[s].output, t1[s].output, -1)};
    out.push_back(std::move(d));
  }
  if (cand.size() != t0.size()) {
    StageDiff d{static_cast<int>(steps), -1, "steps", {}};
    d.result.tensor = "steps";
    d.result.refused = true;
    d.result.note = "candidate has " + std::to_string(cand.size()) + " steps, reference " +
                    std::to_string(t0.size());
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace dsv32

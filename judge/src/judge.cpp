#include "dsv32/judge/judge.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/scored_rows.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

/// Records a failure, and where it is when it is the first.
void fail(Judgement& j, int step, int layer, const std::string& stage, std::string line) {
  if (j.failures.empty()) j.first_step = step, j.first_layer = layer, j.first_stage = stage;
  j.failures.push_back(std::move(line));
}

/// "step2/layer1/" ("step2/" for the output, layer -1).
std::string step_layer(int step, int layer) {
  return "step" + std::to_string(step) + "/" +
         (layer < 0 ? std::string() : "layer" + std::to_string(layer) + "/");
}

/// A failed check of what the oracle would adopt from the candidate (a top-k row, a cache
/// latent): a failure, and a row of the report with no finite ratio.
void fail_adopted(Judgement& j, int step, int layer, const std::string& stage,
                  const std::string& what) {
  const std::string line = step_layer(step, layer) + stage + " " + what;
  fail(j, step, layer, stage, line);
  Judgement::Row row{step, layer, stage, true, false, std::numeric_limits<double>::infinity(),
                     line};
  j.rows.push_back(std::move(row));
}

/// A failed top-k row of token t.
void fail_row(Judgement& j, int step, int layer, int t, const std::string& why) {
  fail_adopted(j, step, layer, stage_name(Stage::topk), "token " + std::to_string(t) + ": " + why);
}

/// Under an fp8_ds_mla cache the oracle stores the candidate's `c` rows in its cache, so each
/// must be what such a cache reads back, codes times their tile's scale: a row that is not (a
/// latent never quantized) fails here, naming the first such value.
void check_cache_codes(Judgement& j, const Config& cfg, const StepInput& in, int step, int layer,
                       const Tensor& c) {
  const std::int64_t L = cfg.kv_lora_rank;
  for (int t = 0; t < in.num_tokens && t < c.shape.at(0); ++t) {
    if (in.slots[t] < 0) continue;
    const DsMlaGrid codes = ds_mla_grid({c.data.data() + t * L, static_cast<std::size_t>(L)});
    if (codes.off_grid < 0) continue;
    std::ostringstream why;
    why.precision(9);
    why << "token " << t << " column " << codes.off_grid << ": " << c.data[t * L + codes.off_grid]
        << " is no e4m3 code times its tile's scale " << codes.scale << " (nearest code value "
        << codes.nearest << "): an fp8_ds_mla cache holds codes; was the latent quantized?";
    return fail_adopted(j, step, layer, stage_name(Stage::c), why.str());
  }
}

}  // namespace

std::string Judgement::worst_text() const {
  if (worst_where.empty()) return "every judged stage exact";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(3);
  s << "worst " << worst << " of its gate at " << worst_where;
  return s.str();
}

std::string Judgement::Row::stage_path() const {
  return layer < 0 ? stage : "layer" + std::to_string(layer) + "/" + stage;
}

Judgement judge(const Config& cfg, std::shared_ptr<const Weights> w, int num_blocks,
                const std::vector<StepInput>& steps, const std::vector<StepTrace>& gpu, int tp,
                bool partial, LseBase lse_base) {
  const bool union_mode = cfg.dcp_size > 1 && cfg.dcp_indexer_mode == DcpIndexerMode::union_;
  // Every stage given is judged: one that could only be judged with another the candidate
  // lacks (a scale without its codes) is refused, never skipped.
  for (std::size_t s = 0; s < gpu.size(); ++s)
    for (std::size_t l = 0; l < gpu[s].layers.size(); ++l)
      if (const std::string why = unjudgeable_stage(gpu[s].layers[l]); !why.empty())
        throw std::invalid_argument(step_layer(static_cast<int>(s), static_cast<int>(l)) + why);
  Oracle t0(cfg, w, Mode::exact, num_blocks), t1(cfg, std::move(w), Mode::emulated, num_blocks);
  const int dI = cfg.index_head_dim, K = cfg.index_topk;
  std::vector<StepTrace> want0, want1;
  // The candidate's own indexer keys, from its traces: (layer, request id, position) -> key;
  // own_keys[l]: every step so far provided layer l's keys.
  std::map<std::tuple<int, int, int>, std::pair<std::vector<double>, double>> keys;
  std::vector<bool> own_keys(cfg.num_layers, true);
  // Whether layer l's rows of step `in` can be scored with the candidate's own quantized q,
  // omega and keys: it gives q and omega here and its keys cover every position the rows score
  // (a golden whose requests start with a context made before its first step has none of
  // theirs).
  const auto own_inputs = [&](int l, const StepInput& in, const LayerTrace& lt) {
    if (!(own_keys[l] && lt.find(Stage::qI8) && lt.find(Stage::omega))) return false;
    for (int t = 0; t < in.num_tokens; ++t)
      for (int p = 0; p <= in.positions[t]; ++p)
        if (!keys.count({l, in.requests[in.request_of_token[t]].id, p})) return false;
    return true;
  };
  // Row t's index scores from the candidate's own quantized q, omega and keys of layer l.
  const auto own_scores = [&](int l, const StepInput& in, const Tensor& q8, const Tensor& omega,
                              int t) {
    const int HI = cfg.index_n_heads, id = in.requests[in.request_of_token[t]].id;
    std::vector<const double*> kp;
    std::vector<double> kscale;
    for (int p = 0; p <= in.positions[t]; ++p) {
      const auto& e = keys.at({l, id, p});
      kp.push_back(e.first.data());
      kscale.push_back(e.second);
    }
    return index_score_row(&q8.data[static_cast<std::size_t>(t) * HI * dI],
                           &omega.data[static_cast<std::size_t>(t) * HI], HI, dI, kp, kscale);
  };
  Judgement j;
  const auto topk_row = [&](int s, int l, int t, const std::vector<int>& row,
                            const IndexScores& sc) {
    double eps = 0;
    for (double a : sc.abs_terms) eps = std::max(eps, index_score_eps(cfg, a));
    ++j.topk_rows;
    if (const std::string why = check_topk_row(row, sc.score, K, eps); !why.empty())
      fail_row(j, s, l, t, why);
  };
  // The stages of steps [0, count), followed in full (judging ends with them); with `layers` >= 0
  // only the last step's layers before `layers`.
  const auto judge_stages = [&](std::size_t count, int layers = -1) {
    const std::vector<StepTrace> cand(gpu.begin(),
                                      gpu.begin() + static_cast<std::ptrdiff_t>(count));
    want0.resize(count);
    want1.resize(count);
    std::vector<StageDiff> diffs = diff_traces(cfg, cand, want0, want1);
    if (cfg.dcp_size > 1) {
      const std::vector<StepInput> judged(steps.begin(),
                                          steps.begin() + static_cast<std::ptrdiff_t>(count));
      for (StageDiff& d : diff_dcp(cfg, judged, cand, want0, want1, lse_base))
        diffs.push_back(std::move(d));
    }
    for (const StageDiff& d : diffs) {
      if (layers >= 0 && d.step + 1 == static_cast<int>(count) &&
          (d.layer < 0 || d.layer >= layers))
        continue;
      Judgement::Row row{d.step,        d.layer, d.stage,           d.provided,
                         d.result.pass, 0.0,     d.result.summary()};
      if (!d.provided && partial) {
        const std::string name = row.stage_path();
        if (std::find(j.not_provided.begin(), j.not_provided.end(), name) == j.not_provided.end())
          j.not_provided.push_back(name);
        row.pass = false;
        j.rows.push_back(std::move(row));
        continue;
      }
      ++j.stages;
      row.ratio = d.result.gate_ratio();
      if (!d.result.pass) {
        j.vacuous += d.result.vacuous ? 1 : 0;
        fail(j, d.step, d.layer, d.stage,
             d.where() + " (op " + std::string(stage_op(d.stage)) + "): " + d.result.summary());
      }
      j.rows.push_back(std::move(row));
    }
  };
  // The worst ratio over every judged row, failing or not, in trace order (the first of equals).
  const auto finish = [&] {
    for (const Judgement::Row& r : j.rows)
      if (r.provided && r.ratio > j.worst)
        j.worst = r.ratio, j.worst_where = step_layer(r.step, r.layer) + r.stage;
    return j;
  };
  // T0 and T1 on step `in`, following the candidate's trace `cand` (its sets and cache codes).
  const auto follow_step = [&](const StepInput& in, const StepTrace& cand) {
    // ... and its fp8 cache codes, judged by the `c` stage itself (one quantum).
    const StepOptions follow = StepOptions::follow(cfg, cand, /*cache_codes=*/true);
    want0.push_back(t0.step(in, follow));
    // Where the candidate gives no sets, T0 selects its own, and T1 follows T0's (as in a
    // golden), so that T1 - T0 measures rounding and not a different pick near a tie.
    StepOptions follow1 = follow;
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (!cfg.is_full_layer(l)) continue;
      if (union_mode && follow1.dcp_topk_override[l].empty())
        for (const IndexRows& rows : want0.back().layers[l].dcp->rows)
          follow1.dcp_topk_override[l].push_back(rows.cast<int>());
      else if (!union_mode && !follow1.topk_override[l])
        follow1.topk_override[l] = topk_rows(want0.back().layers[l]);
    }
    // T1 rounds where the candidate's group does: each rank's o_proj partial, then their sum.
    follow1.o_proj_ranks = tp;
    want1.push_back(t1.step(in, follow1));
  };
  // Step s's sets cannot be followed: judging stops there, after the stages of the steps before
  // it (a fault there, such as a stale cache entry, is named first, not the sets it spoilt) and
  // those of step s's layers before the first one that cannot be followed (the oracle follows
  // the candidate up to it), so that a fault upstream, such as a NaN the attention wrote, is
  // named before the invalid cache entry or set it produced in a later layer.
  const auto stop = [&](std::size_t s) {
    const int from = j.first_step == static_cast<int>(s) ? j.first_layer : 0;
    Judgement sets;
    std::swap(sets.failures, j.failures);
    std::swap(sets.first_step, j.first_step);
    std::swap(sets.first_layer, j.first_layer);
    std::swap(sets.first_stage, j.first_stage);
    std::vector<Judgement::Row> adopted;
    std::swap(adopted, j.rows);
    if (from > 0) {
      if (want0.size() == s) {  // the step not yet run: follow the layers before `from` only
        StepTrace upto = gpu[s];
        for (int l = from; l < cfg.num_layers; ++l) {
          LayerTrace& lt = upto.layers[static_cast<std::size_t>(l)];
          std::erase_if(lt.tensors, [](const Tensor& t) {
            return t.name == stage_name(Stage::topk) || t.name == stage_name(Stage::c);
          });
          lt.dcp.reset();
        }
        follow_step(steps[s], upto);
      }
      judge_stages(s + 1, from);
    } else {
      judge_stages(s);
    }
    for (std::string& line : sets.failures)
      fail(j, sets.first_step, sets.first_layer, sets.first_stage, std::move(line));
    j.rows.insert(j.rows.end(), adopted.begin(), adopted.end());
    return finish();
  };
  const std::size_t n = std::min(steps.size(), gpu.size());
  for (std::size_t s = 0; s < n; ++s) {
    const StepInput& in = steps[s];
    const int si = static_cast<int>(s);
    const std::size_t failures_before = j.failures.size();
    // A given prefix's index keys are data of the golden (GOLDEN.md): every implementation
    // holds exactly these, so the candidate's rows are scored over them like its own keys.
    for (const auto& g : in.given)
      for (int l = 0; l < cfg.num_layers; ++l)
        if (cfg.is_full_layer(l))
          for (int p = 0; p < g->length; ++p) {
            const PrefixLayer& pl = g->layers[l];
            keys[{l, g->request_id, p}] = {
                std::vector<double>(pl.index_k.row(p).data(), pl.index_k.row(p).data() + dI),
                pl.index_scale[p]};
          }
    std::vector<int> against_t0;  // F layers whose sets are judged on T0's scores
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerTrace& lt = gpu[s].layers[l];
      if (const Tensor* c = lt.find(Stage::c); c && cfg.kv_cache == KvCache::fp8_ds_mla)
        check_cache_codes(j, cfg, in, si, l, *c);
      const bool full = cfg.is_full_layer(l);
      const Tensor *k8 = lt.find(Stage::kI8), *ks = lt.find(Stage::kI_scale);
      own_keys[l] = own_keys[l] && k8 && ks;
      if (full && own_keys[l])
        for (int t = 0; t < in.num_tokens; ++t)
          keys[{l, in.requests[in.request_of_token[t]].id, in.positions[t]}] = {
              std::vector<double>(k8->data.begin() + t * dI, k8->data.begin() + (t + 1) * dI),
              ks->data[t]};
      if (!lt.find(Stage::topk)) continue;
      const TopkRows rows = topk_rows(lt);
      const auto row_of = [&](int t) {
        return std::vector<int>(rows.row(t).data(), rows.row(t).data() + K);
      };
      // The row's structure first, in every layer: the oracle can follow only well-formed sets,
      // and an S layer's rows, which it does not follow, are judged as sets that would not see a
      // duplicate or a stray negative entry.
      // (Under `union` a row holds min(K, the keys its rank owns): judged rank by rank below.)
      for (int t = 0; t < in.num_tokens && !union_mode; ++t)
        if (const std::string why =
                check_topk_row(row_of(t), std::vector<double>(in.positions[t] + 1, 0.0), K, 0.0);
            !why.empty())
          fail_row(j, si, l, t, why);
      if (!full || union_mode) continue;  // union: each rank's own rows (not judged here)
      const Tensor *q8 = lt.find(Stage::qI8), *omega = lt.find(Stage::omega);
      if (!own_inputs(l, in, lt)) {
        against_t0.push_back(l);
        continue;
      }
      scored_rows(
          in.num_tokens, [&](int t) { return own_scores(l, in, *q8, *omega, t); },
          [&](int t, const IndexScores& sc) { topk_row(si, l, t, row_of(t), sc); });
    }
    // The oracle follows the candidate's sets: invalid ones cannot be followed, so judging
    // stops here.
    if (j.failures.size() > failures_before) return stop(s);
    follow_step(in, gpu[s]);
    // Under `union` each rank's rows are its own top-k of the keys it owns: judged against T0's
    // scores of those keys (the candidate's ranks, or its `topk` as rank 0's row).
    if (union_mode)
      for (int l = 0; l < cfg.num_layers; ++l) {
        if (!cfg.is_full_layer(l)) continue;
        const LayerTrace& lt = gpu[s].layers[l];
        std::vector<TopkRows> ranks;
        if (lt.dcp)
          for (const IndexRows& r : lt.dcp->rows) ranks.push_back(r.cast<int>());
        else if (lt.find(Stage::topk))
          ranks.push_back(topk_rows(lt));
        const DcpLayout lay = DcpLayout::of(cfg);
        // The candidate's own quantized q, omega and keys where it gives them all, else T0's.
        const Tensor *q8 = lt.find(Stage::qI8), *omega = lt.find(Stage::omega);
        const bool own = own_inputs(l, in, lt);
        scored_rows(
            in.num_tokens,
            [&](int t) {
              return own ? own_scores(l, in, *q8, *omega, t)
                         : t0.index_scores(l, in, want0.back().layers[l], t);
            },
            [&](int t, const IndexScores& sc) {
              for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
                std::vector<int> local(sc.score.size(), -1);  // position -> index among owned
                std::vector<double> score, abs_terms;
                for (int p = 0; p < static_cast<int>(sc.score.size()); ++p)
                  if (lay.owner(p) == r) {
                    local[p] = static_cast<int>(score.size());
                    score.push_back(sc.score[p]);
                    abs_terms.push_back(sc.abs_terms[p]);
                  }
                std::vector<int> row(K, -1);
                std::string foreign;
                for (int k = 0; k < K; ++k) {
                  const int p = ranks[r](t, k);
                  if (p < 0) continue;
                  if (p >= static_cast<int>(local.size()) || local[p] < 0) {
                    foreign = "position " + std::to_string(p) + " is not rank " +
                              std::to_string(r) + "'s";
                    break;
                  }
                  row[k] = local[p];
                }
                double eps = 0;
                for (double a : abs_terms) eps = std::max(eps, index_score_eps(cfg, a));
                ++j.topk_rows;
                const std::string why =
                    foreign.empty() ? check_topk_row(row, score, K, eps) : foreign;
                if (!why.empty())
                  fail_row(j, si, l, t,
                           "rank " + std::to_string(r) +
                               " (union: its own top-k of the keys it owns, positions renumbered "
                               "among them): " +
                               why);
              }
            });
      }
    // What the case exercised: T0's own scores of every real row of every F layer.
    // Sets without the candidate's own quantized inputs: against T0's scores (TESTING.md 2).
    j.coverage.add_step(in, K);
    for (int l = 0; l < cfg.num_layers; ++l) {
      if (!cfg.is_full_layer(l)) continue;
      const bool judge_sets =
          !union_mode && std::find(against_t0.begin(), against_t0.end(), l) != against_t0.end();
      const TopkRows rows = judge_sets ? topk_rows(gpu[s].layers[l]) : TopkRows();
      scored_rows(
          in.num_tokens, [&](int t) { return t0.index_scores(l, in, want0.back().layers[l], t); },
          [&](int t, const IndexScores& sc) {
            j.coverage.add_scores(sc.score, K);
            if (judge_sets)
              topk_row(si, l, t, std::vector<int>(rows.row(t).data(), rows.row(t).data() + K), sc);
          });
    }
    if (j.failures.size() > failures_before) return stop(s);
  }
  judge_stages(n);
  if (gpu.size() < steps.size())
    fail(j, static_cast<int>(n), -1, "steps",
         "step" + std::to_string(n) + ": not provided (the candidate has " +
             std::to_string(gpu.size()) + " steps, the golden " + std::to_string(steps.size()) +
             ")");
  return finish();
}

std::string Divergence::where() const {
  return step_layer(step, layer) + stage;
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
  if (a.size() != b.size()) return d.detail;  // the step counts differ
  return step_layer(d.step, d.layer) + d.detail;
}

}  // namespace dsv32

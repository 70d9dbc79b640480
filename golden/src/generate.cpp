// Golden cases made by the oracle: a case plan's steps run through T0 and T1 (T1 following
// T0's sets), and a golden's traces recomputed to check it.
#include <memory>
#include <string>

#include "dsv32/golden/case_file.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/coverage.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "dsv32/oracle/scored_rows.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32::golden {

namespace {

/// The two oracles of a case, stepped together as a golden's steps are made: T0 selects its
/// sets, T1 follows them.
struct OraclePair {
  Oracle exact, emul;
  OraclePair(const Config& cfg, const std::shared_ptr<const Weights>& w, int num_blocks)
      : exact(cfg, w, Mode::exact, num_blocks), emul(cfg, w, Mode::emulated, num_blocks) {}
  void step(const Config& cfg, const StepInput& in, std::vector<StepTrace>& t0s,
            std::vector<StepTrace>& t1s) {
    StepTrace t0 = exact.step(in);
    t1s.push_back(emul.step(in, StepOptions::follow(cfg, t0)));
    t0s.push_back(std::move(t0));
  }
};

/// T1 as a golden file stores it: each tensor rounded to its storage dtype (the writer's
/// conversion of float32 and bfloat16 datasets).
void round_to_storage(const Config& cfg, std::vector<StepTrace>& steps) {
  const auto round = [&](Tensor& t) {
    const DType dt = storage_dtype(cfg, t.name);
    for (double& v : t.data)
      v = dt == DType::float32    ? static_cast<double>(static_cast<float>(v))
          : dt == DType::bfloat16 ? round_bf16(v)
                                  : v;
  };
  const auto round_as = [&](Mat& m, Stage s) {  // a rank's partial, as its stage is stored
    for (double& v : m.reshaped<Eigen::RowMajor>()) v = round_to(storage_dtype(cfg, s), v);
  };
  for (StepTrace& st : steps) {
    for (LayerTrace& lt : st.layers) {
      for (Tensor& t : lt.tensors) round(t);
      if (lt.dcp)
        for (std::size_t r = 0; r < lt.dcp->olat.size(); ++r) {
          round_as(lt.dcp->olat[r], Stage::olat);
          round_as(lt.dcp->lse[r], Stage::lse);
        }
    }
    round(st.output);
  }
}

/// What step `in` exercised, from T0's own scores (as judge() counts a candidate's run).
void count(const Oracle& exact, const Config& cfg, const StepInput& in, const StepTrace& t0,
           Coverage& coverage) {
  coverage.add_step(in, cfg.index_topk);
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_full_layer(l))
      scored_rows(
          in.num_tokens, [&](int t) { return exact.index_scores(l, in, t0.layers[l], t); },
          [&](int, const IndexScores& sc) { coverage.add_scores(sc.score, cfg.index_topk); });
}

}  // namespace

std::pair<std::vector<StepTrace>, std::vector<StepTrace>> recompute(const GoldenCase& c) {
  OraclePair oracles(c.cfg, std::make_shared<const Weights>(c.weights), c.num_blocks);
  std::pair<std::vector<StepTrace>, std::vector<StepTrace>> out;
  for (const StepInput& in : c.steps) oracles.step(c.cfg, in, out.first, out.second);
  round_to_storage(c.cfg, out.second);
  return out;
}

GoldenCase generate(const CaseSpec& spec, const std::string& generator,
                    const std::function<void(int, int)>& progress) {
  GoldenCase c;
  c.case_id = spec.name;
  c.seed = spec.seed;
  c.generator = generator;
  c.cfg = spec.cfg;
  c.tolerance_profile = std::string(to_string(spec.cfg.precision));
  c.num_blocks = spec.num_blocks;
  c.weights = Weights::generate(spec.cfg, spec.seed);
  // Top-k stress (docs/CASES.md): the rotary part of these layers' index keys is zero (its
  // gain and bias), so that equal hidden rows make equal keys, and equal scores, at every
  // position.
  const int dr = spec.cfg.qk_rope_head_dim;
  for (const int l : spec.zero_index_key_rope) {
    IndexerWeights& iw = c.weights.layers.at(static_cast<std::size_t>(l)).indexer.value();
    iw.g_k.head(dr).setZero();
    iw.b_k.head(dr).setZero();
  }
  OraclePair oracles(spec.cfg, std::make_shared<const Weights>(c.weights), spec.num_blocks);
  ScenarioBuilder builder(spec.cfg, spec.seed, spec.num_blocks);
  for (const auto& [id, shape] : spec.hidden) builder.shape(id, shape);
  const int n = static_cast<int>(spec.steps.size());
  Coverage coverage;
  for (int s = 0; s < n; ++s) {
    const StepPlan& p = spec.steps[s];
    StepInput in = builder.step(p.requests, p.capture_size, Poison::nan);
    if (spec.cfg.dcp_size > 1)  // a golden states each rank's tables
      in.dcp_tables = dcp_tables(in, spec.cfg, spec.dcp_tables, spec.num_blocks);
    oracles.step(spec.cfg, in, c.expected, c.emulated);
    if (!spec.require.empty()) count(oracles.exact, spec.cfg, in, c.expected.back(), coverage);
    c.steps.push_back(std::move(in));
    for (int id : p.finish_after) builder.finish(id);
    if (progress) progress(s + 1, n);
  }
  for (const std::string& r : spec.require)
    if (const std::string why = Requirement::parse(r).check(coverage); !why.empty())
      throw CaseFileError("case " + spec.name + " does not exercise what it claims: " + why);
  // A golden whose own gates are vacuous or unusable (an epsilon or a YaRN value that flattens
  // a stage to nothing) could never fail a candidate: it is refused, not written.
  for (const StageDiff& d : diff_traces(c.cfg, c.expected, c.expected, c.emulated))
    if (!d.result.pass)
      throw CaseFileError("case " + spec.name + ": " + d.where() +
                          " could not judge a candidate (its own T0 against its gate: " +
                          d.result.summary() + "); change the case's config");
  return c;
}

}  // namespace dsv32::golden

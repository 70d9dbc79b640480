// RapidCheck over what one request sees on the GPU (issue 41's properties, TESTING.md section 4's
// oracle properties carried to the GPU build):
// - a request's rows, at every stage of every layer, are bitwise the same whatever other requests
//   share its steps, in whatever order, and however many poisoned rows pad them to the same
//   capture sizes (across sizes the build's products change kernels: docs/DECISIONS.md);
// - a speculative verify step (q tokens after a context, under a plan that replays it in a full
//   graph) equals the same tokens decoded one at a time: the one-at-a-time run, read as the verify
//   step's candidate, passes the verify step's oracle gates.
// Each property has a test that feeds its check a corrupted run and expects the check to fail.
//
// Reproduce a failure with the RC_PARAMS line RapidCheck prints.
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstring>
#include <map>
#include <numeric>
#include <tuple>

#include "dsv32/gpu/stack.hpp"
#include "dsv32/judge/judge.hpp"
#include "support/generators.hpp"
#include "support/gpu.hpp"
#include "support/runs.hpp"

namespace dsv32 {
namespace {

using Corrupt = testing::Corrupt;

/// Every real row of every per-token stage of a run, in trace order, keyed by (stage path,
/// request id, position).
struct StageRows {
  using Key = std::tuple<std::string, int, int>;
  std::vector<Key> order;
  std::map<Key, std::vector<double>> at;
  void add(const std::string& path, const StepInput& in, const Tensor& t) {
    if (t.shape.empty() || t.shape[0] != in.num_tokens || in.num_tokens == 0) return;
    const std::int64_t width = t.numel() / in.num_tokens;
    for (int tok = 0; tok < in.num_tokens; ++tok) {
      Key k{path, in.requests[in.request_of_token[tok]].id, in.positions[tok]};
      order.push_back(k);
      at[k] = std::vector<double>(t.data.begin() + tok * width, t.data.begin() + (tok + 1) * width);
    }
  }
};

StageRows stage_rows(const std::vector<StepInput>& steps, const std::vector<StepTrace>& traces) {
  StageRows rows;
  for (std::size_t s = 0; s < steps.size() && s < traces.size(); ++s) {
    for (std::size_t l = 0; l < traces[s].layers.size(); ++l)
      for (const Tensor& t : traces[s].layers[l].tensors)
        rows.add("layer" + std::to_string(l) + "/" + t.name, steps[s], t);
    rows.add("output", steps[s], traces[s].output);
  }
  return rows;
}

/// "" when every row `b` shares with `a` has `a`'s bits (and some output row is shared), else
/// the first difference in `b`'s trace order and every stage that differs.
std::string same_bits(const StageRows& a, const StageRows& b) {
  int outputs = 0;
  std::string first;
  std::vector<std::string> stages;
  for (const StageRows::Key& k : b.order) {
    const auto it = a.at.find(k);
    if (it == a.at.end()) continue;
    const auto& [stage, id, pos] = k;
    outputs += stage == "output";
    const std::vector<double>& x = it->second;
    const std::vector<double>& y = b.at.at(k);
    if (x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0)
      continue;
    if (first.empty()) {
      std::size_t i = 0;
      while (i < x.size() && i < y.size() && std::memcmp(&x[i], &y[i], sizeof(double)) == 0) ++i;
      first = stage + " of request " + std::to_string(id) + " at position " + std::to_string(pos) +
              ", element " + std::to_string(i) + ": " +
              (i < x.size() ? std::to_string(x[i]) : "-") + " vs " +
              (i < y.size() ? std::to_string(y[i]) : "-");
    }
    if (std::find(stages.begin(), stages.end(), stage) == stages.end()) stages.push_back(stage);
  }
  if (!first.empty()) {
    std::string all;
    for (const std::string& s : stages) all += (all.empty() ? "" : ", ") + s;
    return first + " (stages that differ: " + all + ")";
  }
  return outputs ? "" : "no output rows in common: vacuous comparison";
}

std::vector<StepTrace> eager_run(const Config& cfg, const Weights& w, int num_blocks,
                                 const std::vector<StepInput>& steps, const Corrupt& corrupt = {}) {
  std::vector<StepTrace> t =
      gpu::run_steps(cfg, w, num_blocks, steps, boundary::plan_preset("eager", cfg));
  if (corrupt) corrupt(t);
  return t;
}

/// The batch in its own order, in `perm`'s order, and perm[0] alone, every variant's steps
/// padded to the same sizes (the prefill step to the whole batch's prefill tokens, the last step
/// to the batch's tokens + `pad`): every row the same bits. Across capture sizes the build does
/// not promise it (docs/DECISIONS.md, "Capture, replay and the GPU properties").
std::string check_request_rows(const Config& cfg, const std::vector<gen::Req>& reqs,
                               const std::vector<int>& perm, int pad, Poison poison,
                               const Corrupt& corrupt = {}) {
  const Weights w = Weights::generate(cfg, 21);
  const int blocks = testing::blocks_for(cfg, reqs);
  int prefill = 0, tokens = 0;
  for (const gen::Req& r : reqs) prefill += r.prefill, tokens += r.q;
  const auto run = [&](const std::vector<int>& order, const Corrupt& c) {
    int mine = 0;  // the variant's own tokens
    for (int r : order) mine += reqs[static_cast<std::size_t>(r)].q;
    const std::vector<StepInput> steps =
        testing::batch_inputs(cfg, 21, reqs, order, tokens + pad - mine, poison, prefill);
    return stage_rows(steps, eager_run(cfg, w, blocks, steps, c));
  };
  std::vector<int> own(reqs.size());
  std::iota(own.begin(), own.end(), 0);
  const StageRows a = run(own, {});
  if (std::string e = same_bits(a, run(perm, corrupt)); !e.empty()) return "in another order: " + e;
  if (std::string e = same_bits(a, run({perm[0]}, {})); !e.empty()) return "alone: " + e;
  return "";
}

/// Appends `b`'s rows to `a` (the same stage, one request's consecutive positions).
void append_rows(Tensor& a, const Tensor& b) {
  a.data.insert(a.data.end(), b.data.begin(), b.data.end());
  a.shape[0] += b.shape[0];
}

/// One request: a prefill of ctx tokens, then q tokens in one verify step padded by `pad`, served
/// under `plan`; against ctx, then the q tokens one a step (eager). Each run must pass the
/// oracle, and the one-at-a-time run's rows (every stage), read as the verify step's candidate,
/// must pass the verify step's gates.
std::string check_verify(const Config& cfg, int ctx, int q, int pad, const std::string& plan,
                         const Corrupt& corrupt = {}) {
  const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 22));
  const int blocks = (ctx + q) / cfg.block_size + 6;
  ScenarioBuilder vb(cfg, 22, blocks), ob(cfg, 22, blocks);
  const std::vector<StepInput> verify{vb.step({{0, ctx}}), vb.step({{0, q}}, q + pad)};
  std::vector<StepInput> one{ob.step({{0, ctx}})};
  for (int i = 0; i < q; ++i) one.push_back(ob.step({{0, 1}}));
  const std::vector<StepTrace> vt =
      gpu::run_steps(cfg, *w, blocks, verify, boundary::plan_preset(plan, cfg));
  if (const Judgement j = judge(cfg, w, blocks, verify, vt); !j.failures.empty())
    return "the verify run under " + plan + ": " + j.failures.front();
  std::vector<StepTrace> ot = eager_run(cfg, *w, blocks, one);
  if (const Judgement j = judge(cfg, w, blocks, one, ot); !j.failures.empty())
    return "the tokens decoded one at a time: " + j.failures.front();
  if (corrupt) corrupt(ot);
  // The candidate: the prefill step as it ran, and the verify step made of the q decode steps'
  // rows, every stage (its own quantized indexer keys and queries judge its sets).
  std::vector<StepTrace> cand{ot[0], ot[1]};
  for (int i = 2; i <= q; ++i) {
    StepTrace& step = cand[1];
    for (int l = 0; l < cfg.num_layers; ++l)
      for (std::size_t k = 0; k < step.layers[l].tensors.size(); ++k)
        append_rows(step.layers[l].tensors[k],
                    ot[static_cast<std::size_t>(i)].layers[l].tensors[k]);
    append_rows(step.output, ot[static_cast<std::size_t>(i)].output);
  }
  const Judgement j = judge(cfg, w, blocks, verify, cand);
  if (!j.failures.empty()) return "one at a time vs the verify step: " + j.failures.front();
  const bool output_judged = std::any_of(j.rows.begin(), j.rows.end(), [](const auto& r) {
    return r.step == 1 && r.layer < 0 && r.provided;
  });
  return output_judged ? "" : "the verify step's output was not judged";
}

/// Only failures of vacuous gates (the scenario, not the GPU): RapidCheck discards the case.
bool unjudgeable(const std::string& e) {
  return e.find("vacuous") != std::string::npos;
}

TEST(GpuRequestProperty, ARequestsRowsDoNotDependOnItsBatchOrPadding) {
  DSV32_REQUIRE_GPU();
  const bool ok = rc::check("batch x order x padding: every stage's bits", [] {
    const Config cfg = *gen::config();
    const std::vector<gen::Req> reqs = *gen::batch();
    const std::vector<int> perm = *gen::permutation(static_cast<int>(reqs.size()));
    const int pad = *rc::gen::inRange(0, 17);
    const Poison poison = *rc::gen::element(Poison::nan, Poison::huge);
    if (const std::string e = check_request_rows(cfg, reqs, perm, pad, poison); !e.empty())
      RC_FAIL(e);
  });
  EXPECT_TRUE(ok);
}

TEST(GpuRequestProperty, AVerifyStepEqualsTheSameTokensDecodedOneAtATime) {
  DSV32_REQUIRE_GPU();
  const bool ok = rc::check("context x draft length x plan", [] {
    const Config cfg = *gen::config();
    const int ctx = *rc::gen::inRange(1, 3 * cfg.index_topk + 8);  // past K, usually
    const int q = *rc::gen::inRange(2, 5);
    const int pad = *rc::gen::inRange(0, 4);
    const std::string plan = *rc::gen::element<std::string>("eager", "full-and-piecewise");
    const std::string e = check_verify(cfg, ctx, q, pad, plan);
    RC_LOG() << "plan " << plan << "\n";
    if (!e.empty() && !unjudgeable(e)) RC_FAIL(e);
    RC_PRE(e.empty());
  });
  EXPECT_TRUE(ok);
}

Config fixed_config() {
  Config c = preset("tiny-fs");
  c.num_heads = 4;
  return c;
}

TEST(GpuRequestPropertyCanFail, EachCheckRejectsACorruptedRun) {
  DSV32_REQUIRE_GPU();
  const Config cfg = fixed_config();
  // One bit of one output element: not the same bits.
  const Corrupt flip = [](std::vector<StepTrace>& t) {
    double& x = t.back().output.data.at(t.back().output.data.size() / 2);
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits ^= 1;
    std::memcpy(&x, &bits, sizeof bits);
  };
  EXPECT_NE(check_request_rows(cfg, {{12, 1}, {3, 4}, {0, 6}}, {2, 0, 1}, 5, Poison::nan, flip),
            "");
  // A wrong verify row map: the first two decoded tokens' outputs swapped.
  const Corrupt shift = [](std::vector<StepTrace>& t) {
    std::swap(t[1].output.data, t[2].output.data);
  };
  EXPECT_NE(check_verify(cfg, 40, 3, 1, "eager", shift), "");
  EXPECT_EQ(check_verify(cfg, 40, 3, 1, "full-and-piecewise"), "");
}

}  // namespace
}  // namespace dsv32

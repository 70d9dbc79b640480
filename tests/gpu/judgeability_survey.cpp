// How often is a random scenario unjudgeable? Runs the oracle's T0 through gpu::judge (T0 and
// T1 against themselves) on RapidCheck's random configs and batches and counts the stages whose
// gate is vacuous (docs/TOLERANCES.md). No GPU needed.
// Usage: RC_PARAMS="max_success=3000 seed=10" judgeability_survey
#include <rapidcheck.h>

#include <iostream>
#include <map>

#include "dsv32/judge/judge.hpp"
#include "support/runs.hpp"

int main() {
  using namespace dsv32;
  std::map<std::string, int> vacuous;  // "stage kv_cache" -> count
  int cases = 0, unjudgeable = 0, other = 0;
  const bool ok = rc::check("judgeability", [&] {
    const Config cfg = *gen::config();
    const std::vector<gen::Req> reqs = *gen::batch();
    const int blocks = testing::blocks_for(cfg, reqs);
    const auto w = std::make_shared<const Weights>(Weights::generate(cfg, 41));
    const testing::Run run = testing::run_batch(cfg, w, 41, reqs, {});
    const Judgement j = judge(cfg, w, blocks, run.inputs, run.traces);
    ++cases;
    unjudgeable += j.failures.empty() ? 0 : 1;
    other += static_cast<int>(j.failures.size()) - j.vacuous;
    for (const std::string& f : j.failures) {
      std::string stage = f.substr(0, f.find(' '));
      stage = stage.substr(stage.rfind('/') + 1);
      ++vacuous[stage + " kv_cache=" + std::string(to_string(cfg.kv_cache))];
    }
  });
  std::cout << cases << " scenarios, " << unjudgeable << " with a vacuous gate, " << other
            << " other failures\nstage                     vacuous gates\n";
  for (const auto& [k, v] : vacuous) std::cout << k << "  " << v << "\n";
  return ok && other == 0 ? 0 : 1;
}

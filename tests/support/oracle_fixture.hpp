// Small helpers shared by oracle tests: build a config's weights and run steps.
#pragma once

#include <memory>
#include <vector>

#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/scenario.hpp"

namespace dsv32::testing {

/// One oracle with its own scenario builder, weights from `seed`.
struct Rig {
  Rig(const Config& c, std::uint64_t seed, Mode mode = Mode::exact, int num_blocks = 64)
      : cfg(c),
        weights(std::make_shared<Weights>(Weights::generate(c, seed))),
        oracle(c, weights, mode, num_blocks),
        builder(c, seed, num_blocks) {}
  StepTrace run(const std::vector<StepRequest>& reqs, int capture = 0, Poison pad = Poison::nan) {
    last = builder.step(reqs, capture, pad);
    return oracle.step(last);
  }
  Config cfg;
  std::shared_ptr<Weights> weights;
  Oracle oracle;
  ScenarioBuilder builder;
  StepInput last;
};

/// Max |a - b| over two tensors of equal shape.
inline double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i) m = std::max(m, std::abs(a.data[i] - b.data[i]));
  return m;
}

}  // namespace dsv32::testing

#include "dsv32/gpu/bisect.hpp"

#include "dsv32/gpu/stack.hpp"

namespace dsv32::gpu {

BisectReport bisect(const Config& cfg, const std::shared_ptr<const Weights>& weights,
                    int num_blocks, const std::vector<StepInput>& steps, const boundary::Plan& plan,
                    const std::string& mutant,
                    const std::function<void(const std::string&)>& progress) {
  const PlanRunner on_gpu = [&](const boundary::Plan& p, const std::string& stack_mutant) {
    return run_steps(cfg, *weights, num_blocks, steps, p, stack_mutant);
  };
  return dsv32::bisect(cfg, weights, num_blocks, steps, plan, mutant, on_gpu, progress);
}

}  // namespace dsv32::gpu

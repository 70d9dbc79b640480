// The bisect tool on the GPU stack: the engine of dsv32/judge/bisect.hpp with every run on a
// fresh gpu::Stack.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv32/judge/bisect.hpp"

namespace dsv32::gpu {

using dsv32::BisectReport;

/// Bisects `plan` on `steps` ("" mutant: none; a plan mutant is applied to the plan, a stack
/// mutant switched on in every run), each run on a fresh stack. `progress` gets a line per run.
BisectReport bisect(const Config& cfg, const std::shared_ptr<const Weights>& weights,
                    int num_blocks, const std::vector<StepInput>& steps, const boundary::Plan& plan,
                    const std::string& mutant = "",
                    const std::function<void(const std::string&)>& progress = {});

}  // namespace dsv32::gpu

// The bisect engine (BOUNDARIES.md section 4): given steps, a plan and optionally a mutant, names
// the op whose move across the eager boundary breaks bitwise equality with `eager`, or, for a
// data bug, the first stage that fails the oracle. CUDA-free: the runs come from a callback
// (gpu/bisect.hpp runs them on the GPU stack).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/oracle/oracle.hpp"

namespace dsv32 {

/// What bisect found (printed as to_string's name: none, data, eager-segment, boundary,
/// dispatch).
enum class BisectVerdict : std::uint8_t {
  /// The plan gives eager's bits and eager passes the oracle.
  none,
  /// Eager itself fails the oracle (where/op: the first failing stage).
  data,
  /// breakable-eager (every op eager through the capture machinery) already differs from eager
  /// (where/op: the first divergent stage).
  eager_segment,
  /// Capturing `op` of `layer` (with every op before it as the plan has it) is what first makes
  /// the run differ from eager (where: the first divergent stage of that run).
  boundary,
  /// A dispatch plan (full-and-piecewise) differs at a step that is not a uniform decode while
  /// its piecewise plan alone gives eager's bits: the full graph served that step (op empty). A
  /// fault of the piecewise plan is bisected as that plan's (detail names it).
  dispatch,
};
std::string_view to_string(BisectVerdict v);
std::ostream& operator<<(std::ostream& os, BisectVerdict v);

struct BisectReport {
  BisectVerdict verdict = BisectVerdict::none;
  std::string op;  // the op's name (printed), or empty
  int layer = -1;
  std::string where;
  std::string detail;
  int runs = 0;  // stack runs the search took
  std::string summary() const;
};

/// Runs the steps under `plan` with the stack mutant `stack_mutant` ("" none) switched on, on a
/// fresh implementation, and returns their traces.
using PlanRunner = std::function<std::vector<StepTrace>(const boundary::Plan& plan,
                                                        const std::string& stack_mutant)>;

/// Bisects `plan` on `steps` ("" mutant: none; a plan mutant is applied to the plan, a stack
/// mutant handed to every run). `progress` gets a line per run. Assumes that capturing more
/// ops never repairs a run.
BisectReport bisect(const Config& cfg, const std::shared_ptr<const Weights>& weights,
                    int num_blocks, const std::vector<StepInput>& steps, const boundary::Plan& plan,
                    const std::string& mutant, const PlanRunner& run,
                    const std::function<void(const std::string&)>& progress = {});

}  // namespace dsv32

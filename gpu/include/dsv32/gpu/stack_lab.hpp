// A stack's lab (Stack::lab): what benchmarks, ablations and the mutant tests do to a stack,
// apart from serving it. Host-only header.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "dsv32/gpu/stack.hpp"

namespace dsv32::gpu {

class StackLab {
 public:
  explicit StackLab(Stack::Impl& impl) : impl_(impl) {}
  StackLab(const StackLab&) = delete;
  StackLab& operator=(const StackLab&) = delete;

  const StackOptions& options() const;
  /// Turns on one stack mutant of BOUNDARIES.md section 4 ("" turns it off; plan mutants go
  /// through mutate_plan); drops the captures held. Throws PlanError for other names.
  void set_mutant(const std::string& name);
  /// Timing only (`dsv32 bench-gpu --dispatch-us`): a framework's host cost, modelled as a busy
  /// wait of `eager_op_us` on the host before each op run eagerly (an `eager` step's ops, a
  /// captured plan's eager ops at replay: a Python dispatcher's cost per op call) and of
  /// `graph_launch_us` before each graph segment's launch at replay. 0 and 0 (the default)
  /// model nothing. Results do not change; only the host's time does.
  void set_host_costs(double eager_op_us, double graph_launch_us);
  /// Timing only (`dsv32 bench-gpu --ablate`): from now on the launches labelled `label` (as
  /// launch_labels names them) are not made; "" makes every launch again. Drops the captures
  /// held when the label changes (one recorded with a launch missing must not replay a full
  /// step; the same label again keeps them). A step run so is wrong by design: nothing that
  /// judges results calls this.
  void skip_launch(const std::string& label);
  /// The labels of the launches one eager step of `in` makes, in order, from running it:
  /// "op:kernel" for a kernel of ours (its name without namespace or template arguments, e.g.
  /// "q_b_proj:gemv"), "op:cuBLAS what" for a cuBLAS call, "o_proj:all-gather" for the
  /// tensor-parallel gather. A layer's launches repeat for every layer under the same labels.
  std::vector<std::string> launch_labels(const StepInput& in);
  /// Fills the cache entries of positions [0, ctx) of every request of `in` with deterministic
  /// pseudo-random values (benchmarks: long contexts without running their prefill).
  void synthesize_context(const StepInput& in);
  /// Mean milliseconds of one step under `plan` over `repeats` timed runs (CUDA events, after a
  /// warm-up run that also captures).
  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats);
  /// Milliseconds the host spent launching one step in the last time_step (the median batch's
  /// launch loop over its repeats). Well under the step's own time, the GPU's work set the
  /// step's time; near it, the host's launches did (or a full launch queue blocked the host,
  /// which takes far more launches than a benchmark's 10 repeats make).
  double last_host_ms() const;
  /// Mean milliseconds of each op of layer 0 run `repeats` times back to back in isolation after
  /// one eager run of the step (every buffer then holds the step's values): the ops of the
  /// `eager` plan, then `latent_copy` and `uv_proj_static`. `graph`: the repeats captured as one
  /// CUDA graph and replayed (the GPU's time; eagerly, an op of short kernels and cuBLAS calls
  /// can be bound by the host's launches). `device_driven`: the H ops' device-driven variants
  /// (`full`'s; the step must then be a uniform decode).
  std::vector<std::pair<Op, double>> time_ops(const StepInput& in, int repeats, bool graph = true,
                                              bool device_driven = false);
  /// Rows [0, T) of the residual stream as it is on the device now (tests of the capture).
  std::vector<double> residual(int T);

 private:
  Stack::Impl& impl_;
};

}  // namespace dsv32::gpu

// The stack's lab machinery (timing.cu), apart from what serves a step: a framework's host
// costs as modelled by `dsv32 bench-gpu --dispatch-us`, and the timing ablation that leaves
// launches out (`--ablate`) with the labels it names launches by.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "../kernels/launch.cuh"
#include "dsv32/gpu/graph.hpp"
#include "launch_state.cuh"

namespace dsv32::gpu::stack {

/// StackLab::set_host_costs: us of host time before each op run eagerly and each graph launch.
class HostCosts {
 public:
  void set(double eager_op_us, double graph_launch_us);
  /// The modelled cost of one op run under `st` (none while a graph records).
  void charge_op(const LaunchState& st) const;
  /// Replays `g` with the modelled cost before each graph segment's launch.
  void replay(BreakableGraph& g) const;

 private:
  double op_us_ = 0, graph_us_ = 0;
};

/// StackLab::skip_launch and StackLab::launch_labels: a launch is labelled "op:kernel" (a kernel of
/// ours), "op:cuBLAS what" or "o_proj:all-gather"; the one labelled as set is left out, and
/// every label is recorded while labels are recorded.
class Ablation final : public k::LaunchFilter {
 public:
  /// What a Launch consults: this while a launch is left out or labels are recorded, else
  /// nullptr (a normal launch builds no label).
  k::LaunchFilter* filter();
  /// Leaves out the launches labelled `label` ("" none); false when it was already so.
  bool set_skip(const std::string& label);
  void start_recording();
  std::vector<std::string> stop_recording();
  bool skip_kernel(const char* op, const void* kernel) override;
  /// A cuBLAS call of `op` ("op:cuBLAS what", without a leading "op " in `what`).
  bool skip_blas(const std::string& op, const std::string& what);
  /// A launch labelled `label` itself.
  bool skip_label(const char* label);

 private:
  template <class L>
  bool bypass(L&& label);
  const std::string& kernel_label(const void* kernel);
  std::string skip_;
  bool recording_ = false;
  std::vector<std::string> labels_;
  std::map<const void*, std::string> kernel_labels_;
};

}  // namespace dsv32::gpu::stack

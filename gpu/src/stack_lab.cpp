// A stack's lab (gpu/stack_lab.hpp): the calls forwarded to the implementation on the stack's
// device, and run_steps, what the plan tests, the mutant tests and bisect run.
#include "dsv32/gpu/stack_lab.hpp"

#include <stdexcept>

#include "stack/impl.cuh"

namespace dsv32::gpu {

const StackOptions& StackLab::options() const {
  return impl_.options;
}

void StackLab::set_mutant(const std::string& name) {
  const detail::DeviceGuard on(impl_.device);
  impl_.set_mutant(boundary::stack_mutant(name));
}

void StackLab::set_host_costs(double eager_op_us, double graph_launch_us) {
  if (!(eager_op_us >= 0) || !(graph_launch_us >= 0))
    throw std::invalid_argument("set_host_costs: costs must be finite and >= 0");
  impl_.set_host_costs(eager_op_us, graph_launch_us);
}

void StackLab::skip_launch(const std::string& label) {
  const detail::DeviceGuard on(impl_.device);
  impl_.skip_launch(label);
}

std::vector<std::string> StackLab::launch_labels(const StepInput& in) {
  const detail::DeviceGuard on(impl_.device);
  return impl_.launch_labels(in);
}

void StackLab::synthesize_context(const StepInput& in) {
  const detail::DeviceGuard on(impl_.device);
  impl_.synthesize_context(in);
}

double StackLab::time_step(const boundary::Plan& plan, const StepInput& in, int repeats) {
  const detail::DeviceGuard on(impl_.device);
  return impl_.time_step(plan, in, repeats);
}

double StackLab::last_host_ms() const {
  return impl_.last_host_ms();
}

std::vector<std::pair<Op, double>> StackLab::time_ops(const StepInput& in, int repeats, bool graph,
                                                      bool device_driven) {
  const detail::DeviceGuard on(impl_.device);
  return impl_.time_ops(in, repeats, graph, device_driven);
}

std::vector<double> StackLab::residual(int T) {
  const detail::DeviceGuard on(impl_.device);
  return impl_.residual(T);
}

std::vector<StepTrace> run_steps(const Config& cfg, const Weights& weights, int num_blocks,
                                 const std::vector<StepInput>& steps, const boundary::Plan& plan,
                                 const std::string& mutant, int* captures,
                                 const StackOptions& options) {
  StackOptions opt = options;
  const boundary::StackMutant m = boundary::stack_mutant(mutant);
  if (m == boundary::StackMutant::int32_offset && opt.block_offset == 0)
    opt.block_offset = far_block_offset(cfg);
  Stack stack(cfg, weights, num_blocks, max_capture_size(steps), 0, nullptr, opt);
  if (m != boundary::StackMutant::none) stack.lab().set_mutant(mutant);
  std::vector<StepTrace> out;
  for (const StepInput& in : steps) out.push_back(stack.run(plan, in));
  if (captures) *captures = stack.report().captures;
  return out;
}

}  // namespace dsv32::gpu

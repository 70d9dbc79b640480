// The public Stack: construction for the config's storage type, and the calls forwarded to
// its implementation (gpu/src/stack/) on the stack's device.
#include "dsv32/gpu/stack.hpp"

#include <iterator>

#include "kernels/topk_select.cuh"
#include "stack/impl.cuh"

namespace dsv32::gpu {

static_assert(std::size(kTopkRowPathNames) == k::kTopkRowPaths, "a name for each row path");

Stack::Stack(const Config& cfg, const Weights& weights, int num_blocks, int max_tokens, int device,
             RankGather* gather, const StackOptions& options) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  const int count = device_count();
  if (device < 0 || device >= count)
    throw CudaError("gpu stack: device " + std::to_string(device) + " is not visible (" +
                    std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + ")");
  const detail::DeviceGuard on(device);
  if (cfg.precision == Precision::bf16)
    impl_ = std::make_unique<stack::StackImpl<__nv_bfloat16>>(cfg, weights, num_blocks, max_tokens,
                                                              device, gather, options);
  else
    impl_ = std::make_unique<stack::StackImpl<float>>(cfg, weights, num_blocks, max_tokens, device,
                                                      gather, options);
}

Stack::~Stack() {
  if (!impl_) return;
  const detail::DeviceGuard on(impl_->device, std::nothrow);  // frees on the stack's device
  impl_.reset();
}

std::vector<StepTrace> run_steps(const Config& cfg, const Weights& weights, int num_blocks,
                                 const std::vector<StepInput>& steps, const boundary::Plan& plan,
                                 const std::string& mutant, int* captures,
                                 const StackOptions& options) {
  StackOptions opt = options;
  if (mutant == "int32-offset" && opt.block_offset == 0) opt.block_offset = far_block_offset(cfg);
  Stack stack(cfg, weights, num_blocks, max_capture_size(steps), 0, nullptr, opt);
  if (!mutant.empty()) stack.set_mutant(mutant);
  std::vector<StepTrace> out;
  for (const StepInput& in : steps) out.push_back(stack.run(plan, in));
  if (captures) *captures = stack.capture_count();
  return out;
}

StepTrace Stack::step(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(boundary::plan_preset("eager", impl_->cfg), in, false);
}

CaptureInfo Stack::capture(const boundary::Plan& plan, int T, bool allow_host_capture) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->capture(plan, T, allow_host_capture);
}

StepTrace Stack::replay(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, true);
}

StepTrace Stack::run(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, false);
}

std::vector<double> Stack::residual(int T) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->residual(T);
}

void Stack::synthesize_context(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  impl_->synthesize_context(in);
}

double Stack::time_step(const boundary::Plan& plan, const StepInput& in, int repeats) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->time_step(plan, in, repeats);
}

double Stack::last_host_ms() const {
  return impl_->last_host_ms();
}

std::vector<std::pair<std::string, double>> Stack::time_ops(const StepInput& in, int repeats,
                                                            bool graph, bool device_driven) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->time_ops(in, repeats, graph, device_driven);
}

void Stack::set_host_costs(double eager_op_us, double graph_launch_us) {
  if (!(eager_op_us >= 0) || !(graph_launch_us >= 0))
    throw std::invalid_argument("set_host_costs: costs must be finite and >= 0");
  impl_->op_cost_us = eager_op_us;
  impl_->graph_cost_us = graph_launch_us;
}

void Stack::set_mutant(const std::string& name) {
  const detail::DeviceGuard on(impl_->device);
  impl_->set_mutant(name);
}

std::size_t Stack::copy_form_bytes() const {
  return impl_->copy_form_bytes();
}

int Stack::capture_count() const {
  return impl_->capture_count();
}

const std::vector<Served>& Stack::served() const {
  return impl_->served;
}

const std::map<std::string, long>& Stack::kernel_paths() const {
  const detail::DeviceGuard on(impl_->device);
  impl_->reported = impl_->paths;
  const std::vector<long> rows = impl_->topk_row_paths();
  for (int p = 0; p < k::kTopkRowPaths; ++p)
    if (rows[p] > 0) impl_->reported[kTopkRowPathNames[p]] = rows[p];
  return impl_->reported;
}

int Stack::indexer_forks() const {
  return impl_->indexer_forks();
}

int Stack::indexer_leads() const {
  return impl_->indexer_leads();
}

void Stack::skip_launch(const std::string& label) {
  const detail::DeviceGuard on(impl_->device);
  impl_->skip_launch(label);
}

std::vector<std::string> Stack::launch_labels(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->launch_labels(in);
}

const Config& Stack::config() const {
  return impl_->cfg;
}

const StackOptions& Stack::options() const {
  return impl_->options;
}

long long far_block_offset(const Config& cfg) {
  const long long row = stack::widest_cache_row(cfg);
  const long long slots = ((1LL << 31) + row - 1) / row;
  return (slots + cfg.block_size - 1) / cfg.block_size;
}

std::vector<std::pair<std::string, bool>> StackOptions::fields() const {
  return {{"pdl", pdl}, {"overlap", overlap}, {"index_mma", index_mma}, {"topk_bins", topk_bins}};
}

}  // namespace dsv32::gpu

// The serving Stack: construction for the config's storage type, and the calls forwarded to
// its implementation (gpu/src/stack/) on the stack's device. Its lab is stack_lab.cu.
#include "dsv32/gpu/stack.hpp"

#include "dsv32/gpu/stack_lab.hpp"

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
  lab_ = std::make_unique<StackLab>(*impl_);
}

Stack::~Stack() {
  lab_.reset();
  if (!impl_) return;
  const detail::DeviceGuard on(impl_->device, std::nothrow);  // frees on the stack's device
  impl_.reset();
}

StepTrace Stack::step(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(boundary::plan_preset(boundary::PlanPreset::eager, impl_->cfg), in, false);
}

CaptureInfo Stack::capture(const boundary::Plan& plan, int T, bool allow_host_capture) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->capture(plan, T, allow_host_capture);
}

void Stack::prepare(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  impl_->prepare(plan, in);
}

StepTrace Stack::replay(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, true);
}

StepTrace Stack::run(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, false);
}

StackReport Stack::report() const {
  const detail::DeviceGuard on(impl_->device);
  return impl_->report();
}

const Config& Stack::config() const {
  return impl_->cfg;
}

StackLab& Stack::lab() {
  return *lab_;
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

// The planted bugs' seams (faults.cuh): each hands back what it was given unless its mutant is
// set. Every branch on a mutant of the stack lives here.
#include <algorithm>
#include <cstdint>

#include "../kernels/fused_q.cuh"
#include "../kernels/sparse_mqa.cuh"
#include "faults.cuh"

namespace dsv32::gpu::stack {

using detail::check;
using M = boundary::StackMutant;

template <class S>
Faults<S>::Faults(const Config& cfg, int max_tokens)
    : max_tokens_(max_tokens), block_size_(cfg.block_size) {}

template <class S>
Faults<S>::~Faults() {
  if (side_) cudaStreamDestroy(side_);
}

template <class S>
void Faults<S>::set(M mutant) {
  if (mutant == M::unjoined_stream && !side_)
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "side stream");
  // What the stale-* mutants keep of a capture's metadata (the serving stack holds none).
  if (mutant == M::stale_positions && !positions_seen_)
    positions_seen_ = detail::zeros<int>(max_tokens_);
  if ((mutant == M::stale_full_metadata || mutant == M::stale_short_prefill) && !live_seen_)
    live_seen_ = detail::zeros<int>(max_tokens_ + 3);
  mutant_ = mutant;
  baked_short_.clear();
  block_owner_.clear();
}

template <class S>
const boundary::Plan& Faults<S>::serving(const boundary::Plan& plan, const StepInput& in) const {
  return mutant_ == M::full_for_mixed && plan.device_driven ? plan : plan.serving(in);
}

/// padded-cache-write: padded rows mapped to slot 0, not skipped. reused-block-skip: a token
/// whose cache block served another request before (that request finished, the block was
/// handed on) does not write its cache entries, so that the old request's keys, scales and
/// latents stay where the new one reads its own; the record keeps a block's first owner.
template <class S>
void Faults<S>::edit_slots(const StepInput& in, std::vector<long long>& slots) {
  if (mutant_ == M::padded_cache_write) std::replace(slots.begin(), slots.end(), -1LL, 0LL);
  if (mutant_ != M::reused_block_skip) return;
  for (std::size_t r = 0; r < in.requests.size(); ++r) {
    const RequestStep& rq = in.requests[r];
    for (int i = 0; i < rq.q; ++i) {
      const int block = rq.block_table.at((rq.ctx + i) / block_size_);
      const auto [it, fresh] = block_owner_.try_emplace(block, rq.id);
      if (!fresh && it->second != rq.id) slots[in.token_start[r] + i] = -1;
    }
  }
}

/// int32-offset: the slot as a 32-bit element offset of its widest cache row would have it,
/// wrapped past 2^31 (negative: the write is skipped).
template <class S>
long long Faults<S>::placed_slot(long long slot, long long row) const {
  if (mutant_ != M::int32_offset) return slot;
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(slot * row)) / row;
}

/// verify-stride: an odd q strided as the next even one.
template <class S>
int Faults<S>::live_stride(int q) const {
  return mutant_ == M::verify_stride && q > 1 && q % 2 == 1 ? q + 1 : q;
}

template <class S>
void Faults<S>::at_capture(const int* positions, const int* live, int T, cudaStream_t s) {
  if (mutant_ == M::stale_positions)
    check(cudaMemcpyAsync(positions_seen_->get(), positions, T * sizeof(int),
                          cudaMemcpyDeviceToDevice, s),
          "positions snapshot");
  if (mutant_ == M::stale_full_metadata || mutant_ == M::stale_short_prefill)
    check(cudaMemcpyAsync(live_seen_->get(), live, (T + 3) * sizeof(int), cudaMemcpyDeviceToDevice,
                          s),
          "device metadata snapshot");
}

template <class S>
void Faults<S>::edit_meta(k::Meta& m, const LaunchState& st) const {
  if (!st.in_graph()) return;
  if (mutant_ == M::stale_positions) m.positions = positions_seen_->get();
  if (!st.device_driven) return;
  if (mutant_ == M::stale_full_metadata) m.live = live_seen_->get();
  if (mutant_ == M::stale_short_prefill) m.short_prefill = live_seen_->get() + 1;
}

/// F layers clear the shared top-k rows; no-topk-clear skips it, shared-layer-clears clears in
/// S layers too.
template <class S>
bool Faults<S>::clears_topk(bool full_layer) const {
  return full_layer ? mutant_ != M::no_topk_clear : mutant_ == M::shared_layer_clears;
}

template <class S>
void Faults<S>::after_fused_q(const k::Launch& go, const k::Dims& d, const k::Meta& m, S* qpack,
                              int stride, int offset) const {
  if (mutant_ == M::double_rope)  // the rotation again, in place on qR
    k::launch_q_rope(go, d, m, qpack, stride, offset, qpack, stride, offset);
}

/// baked-short-prefill: the decision made once, at capture, and replayed.
template <class S>
bool Faults<S>::short_prefill(int l, bool decided, const LaunchState& st) {
  if (mutant_ != M::baked_short_prefill) return decided;
  if (st.capturing) {
    baked_short_[l] = decided;
    return decided;
  }
  const auto it = baked_short_.find(l);
  return it != baked_short_.end() ? it->second : decided;
}

template <class S>
k::TopkFault Faults<S>::topk_fault() const {
  return mutant_ == M::topk_bin_overflow ? k::TopkFault::bin_overflow
         : mutant_ == M::topk_edge       ? k::TopkFault::edge
         : mutant_ == M::topk_long_row   ? k::TopkFault::long_row
                                         : k::TopkFault::none;
}

/// fp8-tile-scale: the backend's gather dequantizes every tile of a latent with tile 0's scale
/// (right while Lkv fits one tile of 128 values).
template <class S>
k::LatentFault Faults<S>::latent_fault() const {
  return mutant_ == M::fp8_tile_scale ? k::LatentFault::first_tile_scale : k::LatentFault::none;
}

template <class S>
k::ShareFault Faults<S>::share_fault() const {
  return mutant_ == M::dcp_global_as_local ? k::ShareFault::global_as_local
         : mutant_ == M::dcp_share_prefix  ? k::ShareFault::share_prefix
                                           : k::ShareFault::none;
}

template <class S>
k::FinishFault Faults<S>::finish_fault() const {
  return mutant_ == M::dcp_lse_base2        ? k::FinishFault::lse_base2
         : mutant_ == M::dcp_empty_rank_nan ? k::FinishFault::divide_empty
                                            : k::FinishFault::none;
}

template <class S>
bool Faults<S>::merge_adds_every_rank() const {
  return mutant_ == M::dcp_empty_rank_nan;
}

template <class S>
void Faults<S>::before_backend(cudaStream_t s, const LaunchState& st) const {
  if (mutant_ == M::unjoined_stream && st.in_eager_segment())  // the race is certain
    k::launch_spin(s, 2'000'000);
}

template <class S>
S* Faults<S>::uv_output(S* out, std::size_t elements) {
  if (mutant_ != M::fresh_output) return out;
  fresh_.push_back(detail::zeros<S>(elements));
  return fresh_.back()->get();
}

template <class S>
cudaStream_t Faults<S>::uv_stream(cudaStream_t s, const LaunchState& st) {
  return mutant_ == M::unjoined_stream && st.in_eager_segment() ? side_ : s;
}

template <class S>
void Faults<S>::finish_step() const {
  if (side_) check(cudaStreamSynchronize(side_), "side stream");
}

template class Faults<float>;
template class Faults<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

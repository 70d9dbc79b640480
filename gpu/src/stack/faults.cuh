// Planted bugs (BOUNDARIES.md section 4, the stack's mutants) as one value the serving code
// consults at a few named seams (faults.cu). With no mutant set every seam hands back what it
// was given: the serving files hold no branch on a mutant.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../buffers.cuh"
#include "../kernels/dcp.cuh"
#include "../kernels/launch.cuh"
#include "../kernels/params.cuh"
#include "../kernels/sparse_mqa.cuh"
#include "../kernels/topk_select.cuh"
#include "dsv32/boundary/plan.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "launch_state.cuh"

namespace dsv32::gpu::stack {

template <class S>
class Faults {
 public:
  Faults(const Config& cfg, int max_tokens);
  ~Faults();
  Faults(const Faults&) = delete;
  Faults& operator=(const Faults&) = delete;

  /// Plants `mutant` (none: the stack as it should be) and forgets what the last one recorded.
  void set(boundary::StackMutant mutant);
  boundary::StackMutant mutant() const { return mutant_; }

  // The seams, in the order a step meets them.
  /// The plan that serves step `in` under `plan` (full-for-mixed: the full graph serves all).
  const boundary::Plan& serving(const boundary::Plan& plan, const StepInput& in) const;
  /// The step's cache slots before far placement (padded-cache-write, reused-block-skip).
  void edit_slots(const StepInput& in, std::vector<long long>& slots);
  /// A placed slot as the cache write uses it (int32-offset: wrapped past 2^31 elements of a
  /// `row`-element cache row).
  long long placed_slot(long long slot, long long row) const;
  /// The new tokens a request the device-driven metadata records (verify-stride).
  int live_stride(int q) const;
  /// A capture saw positions and the device metadata: kept for the stale-* mutants.
  void at_capture(const int* positions, const int* live, int T, cudaStream_t s);
  /// The metadata an op reads (stale-positions, stale-full-metadata, stale-short-prefill: a
  /// graph op reads what the capture saw).
  void edit_meta(k::Meta& m, const LaunchState& st) const;
  /// Whether layer `full`'s norm_rope_cache clears the shared top-k rows.
  bool clears_topk(bool full_layer) const;
  /// After fused_q: double-rope rotates qR once more, in place.
  void after_fused_q(const k::Launch& go, const k::Dims& d, const k::Meta& m, S* qpack, int stride,
                     int offset) const;
  /// indexer_topk's short-prefill decision for layer l (baked-short-prefill: the capture's).
  bool short_prefill(int l, bool decided, const LaunchState& st);
  /// The top-k select's planted bug (topk-bin-overflow, topk-edge, topk-long-row).
  k::TopkFault topk_fault() const;
  /// The backend's read of an fp8_ds_mla latent (fp8-tile-scale: tile 0's scale for every tile).
  k::LatentFault latent_fault() const;
  /// The DCP ranks' planted bugs, a seam each: a rank's share (dcp-global-as-local,
  /// dcp-share-prefix), its partial's finish (dcp-lse-base2; dcp-empty-rank-nan's 0 / 0), and
  /// whether the merge adds every rank's weighted partial, an empty one's too
  /// (dcp-empty-rank-nan's 0 x NaN).
  k::ShareFault share_fault() const;
  k::FinishFault finish_fault() const;
  bool merge_adds_every_rank() const;
  /// Before the backend's products on `s` (unjoined-stream: a slow backend in an eager segment).
  void before_backend(cudaStream_t s, const LaunchState& st) const;
  /// Where uv_proj writes (fresh-output: a new buffer each call, `elements` long).
  S* uv_output(S* out, std::size_t elements);
  /// The stream uv_proj runs on (unjoined-stream: a side stream in an eager segment).
  cudaStream_t uv_stream(cudaStream_t s, const LaunchState& st);
  /// The step's end: unjoined-stream's side stream is waited for before the trace reads.
  void finish_step() const;

 private:
  boundary::StackMutant mutant_ = boundary::StackMutant::none;
  int max_tokens_, block_size_;
  std::map<int, bool> baked_short_;  // baked-short-prefill: layer -> the capture's decision
  std::map<int, int> block_owner_;   // reused-block-skip: the request each block first served
  std::vector<std::unique_ptr<detail::DeviceBuffer<S>>> fresh_;            // fresh-output's buffers
  std::unique_ptr<detail::DeviceBuffer<int>> positions_seen_, live_seen_;  // stale-*
  cudaStream_t side_ = nullptr;                                            // unjoined-stream
};

}  // namespace dsv32::gpu::stack

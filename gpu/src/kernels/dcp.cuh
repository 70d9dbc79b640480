// Decode context parallelism emulated on one GPU (MATH.md, "Context-parallel shards"): a rank's
// share of the top-k rows and the LSE merge of the ranks' partial attention. sparse_mqa runs
// its kernels once a rank over that rank's share, then merges (stack/attention.cu).
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// share[t, k] = topk[t, k] where rank `rank` of `world` owns that position (owner(p) =
/// floor(p / interleave) mod world), else -1: the share in place, with -1 holes (the layout
/// FlashMLA's kernel masks entry by entry, as mqa_gather and mqa_softmax do).
void launch_dcp_share(const Launch& go, const Dims& d, const Meta& m, int rows, const int* topk,
                      int* share, int world, int interleave, int rank);
/// Per (token, head): lse = m + log sum_r exp(lse_r - m) over the ranks whose lse_r is finite;
/// olat = sum_r S(exp(lse_r - lse) olat_r) in rank order, each partial sum rounded to S (vLLM's
/// bf16 path; an fp32 stack rounds nothing); a rank with a non-finite lse adds nothing; no rank:
/// olat 0, lse -inf. part_olat[r] at r * rows_stride * H * L, part_lse[r] at r * rows_stride * H.
/// Also into the layer's trace copy of olat.
template <class S>
void launch_dcp_merge(const Launch& go, const Dims& d, const Meta& m, int rows, int world,
                      long long rows_stride, const S* part_olat, const float* part_lse, S* olat,
                      S* olat_trace, float* lse);

}  // namespace dsv32::gpu::k

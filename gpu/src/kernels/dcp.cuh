// Decode context parallelism emulated on one GPU (MATH.md, "Context-parallel shards"): a rank's
// share of the top-k rows and the LSE merge of the ranks' partial attention. sparse_mqa runs
// its kernels once a rank over that rank's share, then merges (stack/attention.cu).
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// A planted bug of a rank's share (the DCP mutants, docs/GPU.md; the others are the finish's,
/// sparse_mqa.cuh's FinishFault, and the merge's `every_rank`): global_as_local keeps global
/// positions where the rank's local ones belong (the converter skipped, vllm#46514);
/// share_prefix reads an in-place share as a prefix of its valid count (keys after the first
/// holes lost).
enum class ShareFault { none, global_as_local, share_prefix };

/// share[t, k] = l(topk[t, k]), the rank's local position (l(p) = floor(p / (I W)) I + p mod I),
/// where rank `rank` of `world` owns that position (owner(p) = floor(p / I) mod W), else -1: the
/// share in place, with -1 holes (the layout FlashMLA's kernel masks entry by entry, as
/// mqa_gather and mqa_softmax do). mqa_gather reads a local position through DcpView.
void launch_dcp_share(const Launch& go, const Dims& d, const Meta& m, int rows, const int* topk,
                      int* share, int world, int interleave, int rank,
                      ShareFault fault = ShareFault::none);
/// Per (token, head): lse = m + log sum_r exp(lse_r - m) over the ranks whose lse_r is finite;
/// olat = sum_r S(exp(lse_r - lse) olat_r) in rank order, each partial sum rounded to S (vLLM's
/// bf16 path; an fp32 stack rounds nothing); a rank with a non-finite lse adds nothing; no rank:
/// olat 0, lse -inf. part_olat[r] at r * rows_stride * H * L, part_lse[r] at r * rows_stride * H.
/// Also into the layer's trace copy of olat. `every_rank` (mutant empty-rank-nan): every rank's
/// weighted partial is added, an empty one's too.
template <class S>
void launch_dcp_merge(const Launch& go, const Dims& d, const Meta& m, int rows, int world,
                      long long rows_stride, const S* part_olat, const float* part_lse, S* olat,
                      S* olat_trace, float* lse, bool every_rank = false);

}  // namespace dsv32::gpu::k

// indexer_topk, scores: I(t, j) = kscale_j sum_h omega_h relu(q8_h . k8_j) over each token's
// context, by one of three kernels.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// The score kernels. `grouped` and `per_key` sum in the same fixed order (their bits agree);
/// `mma` takes the dots on tensor cores, in their order (within the bound top-k judging
/// allows), where index_mma_fits.
enum class IndexScoreKernel { grouped, per_key, mma };

constexpr int kIdxMmaHeads = 64;
__host__ __device__ inline bool index_mma_fits(const Dims& d) {
  return d.HI >= 1 && d.HI <= kIdxMmaHeads && d.dI == 128;
}
/// Tokens per index_scores_mma block for T_a rows: 8 at prefill sizes (a prefill chunk's
/// tokens share the keys staged once), else 1 (docs/PERFORMANCE.md).
inline int index_mma_tokens(int rows) {
  return rows >= 256 ? 8 : 1;
}

/// The kernel for `rows` tokens whose longest context is `longest` keys on `sms` SMs: tensor
/// cores where `mma` allows and the shapes fit; else a thread per key once the keys alone fill
/// the SMs, or per (key, head group).
IndexScoreKernel choose_index_scores(const Dims& d, int rows, int longest, int sms, bool mma);
/// Opts the CUDA-core kernels in to the shared memory they need for d (current device).
void allow_index_scores_smem(const Dims& d);
/// scores[t, j] for tokens t < rows and keys j <= positions[t] (row stride ld_scores; with
/// Meta::live, the live rows and their contexts, none when Meta::short_prefill says so).
/// `tokens_per_block`: mma's tokens a block (0: index_mma_tokens(rows)); `max_chunks` (> 0):
/// at most this many chunks of keys in the grid, each block then looping over the chunks
/// gridDim.y apart (a device-driven launch sized for the longest possible context). A score's
/// bits depend on neither.
void launch_index_scores(const Launch& go, IndexScoreKernel kernel, const Dims& d, const Meta& m,
                         const std::uint8_t* q8, const float* omega, IndexCache cache,
                         float* scores, int ld_scores, int rows, int longest,
                         int tokens_per_block = 0, int max_chunks = 0);

}  // namespace dsv32::gpu::k

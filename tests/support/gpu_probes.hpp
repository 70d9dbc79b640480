// Kernel probes of the GPU numerics tests (tests/gpu/gpu_probes.cu): single kernels run through
// their launchers, outside any stack. Host-only header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv32::gpu {

/// The two kernels of indexer_topk's scores (a thread per (key, head group) for few tokens, a
/// thread per key for many) on one random token with `heads` indexer heads and `keys` cached
/// keys (codes from the counter RNG with `seed`): "" when every score agrees bit for bit, else
/// the first difference.
std::string index_score_kernels_disagree(int heads, int keys, std::uint64_t seed);
/// Every score kernel of indexer_topk (the two above and the tensor-core one where it serves
/// `heads`) on the same random token, each score against the exact (fp64) score within the
/// fp32 accumulation bound that top-k judging allows (gamma_{heads 128} times the sum of the
/// terms' magnitudes, TESTING.md section 2): "" when all are within it, else the first miss.
std::string index_scores_off_bound(int heads, int keys, std::uint64_t seed);

/// The tensor-core score kernel with 1, 2, 3, 8 and 16 tokens a block (`tokens` tokens of two
/// requests in alternating runs, each over up to `keys` cached keys): "" when every score
/// agrees bit for bit with one token a block, else the first difference.
std::string index_scores_blocking_disagrees(int tokens, int keys, std::uint64_t seed);

/// indexer_topk's selection kernel, with value bins and with the radix passes alone, on rows
/// of random scores (`levels` > 0: drawn from that many values, so most keys tie; 0: continuous
/// in [0.5, 1.5]; -1: both signs, +0 and -0; -2: -1 with outliers of 1e30; -3: -2 with
/// infinities), row t over lengths[t] keys, against the host's K best by (score as the kernel's
/// key orders it, then the smaller position) in position order: "" when both give exactly
/// that, else the first difference.
std::string topk_select_off(int K, const std::vector<int>& lengths, int levels, std::uint64_t seed);

}  // namespace dsv32::gpu

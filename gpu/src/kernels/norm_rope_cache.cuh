// norm_rope_cache: q_c's RMSNorm, the MLA latent and kR into the cache, the indexer key into
// its cache (F layers), and the shared top-k rows cleared, as one launch.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// Over d.T rows. `index_k`: the indexer key part runs (F layers; kw, g_k, b_k, index, k8_out,
/// kscale_out used); `clear`: the shared top-k rows are set to -1.
template <class S>
void launch_norm_rope_cache(const Launch& go, const Dims& d, const Meta& m, const S* qkv,
                            const S* g_q, S* q_c, const S* g_kv, KvCache<S> cache, S* kR_out,
                            bool index_k, const S* kw, const S* g_k, const S* b_k, IndexCache index,
                            std::uint8_t* k8_out, float* kscale_out, bool clear, int* topk);

}  // namespace dsv32::gpu::k

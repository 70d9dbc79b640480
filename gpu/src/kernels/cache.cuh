// The paged caches outside the ops: the latent read back for the trace, and a benchmark's
// synthesized context.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// out (rows x L) = the latent of rows [0, rows) as the cache reads it back (the trace's `c`).
template <class S>
void launch_read_latent(const Launch& go, int rows, const Dims& d, const Meta& m, KvCache<S> cache,
                        S* out);
/// Deterministic pseudo-random cache entries for positions [0, ctx) of one request whose block
/// table is `table` (device); the indexer cache too where `full`.
template <class S>
void launch_synthesize(const Launch& go, const Dims& d, const int* table, int ctx, KvCache<S> cache,
                       IndexCache index, bool full);

}  // namespace dsv32::gpu::k

// indexer_topk, selection: each row's K best positions by score, in position order.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// Rows [0, rows) of `topk` (stride d.K) from the scores of positions 0 .. positions[t] (row
/// stride ld_scores). `bins`: value bins ahead of the radix passes (else the radix passes
/// alone); both give the exact set.
void launch_topk_select(const Launch& go, bool bins, const Dims& d, const Meta& m,
                        const float* scores, int ld_scores, int rows, int* topk);

}  // namespace dsv32::gpu::k

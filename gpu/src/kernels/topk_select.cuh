// indexer_topk, selection: each row's K best positions by score, in position order.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// Rows [0, rows) of `topk` (stride d.K) from the scores of positions 0 .. positions[t] (row
/// stride ld_scores). `bins`: value bins ahead of the radix passes (else the radix passes
/// alone); both give the exact set.
/// `fault`: a planted bug (mutants, docs/GPU.md): bin_overflow keeps the first kTopkResolve
/// keys a crowded threshold bin delivers and drops the rest (topk-bin-overflow); edge takes a
/// row of K + 1 keys for a short one, 0 .. K - 1 (topk-edge); long_row walks each thread's keys
/// in the general select only as far as the short path holds them (kTopkFast), so that past
/// 16384 keys a row's keys beyond a thread's first 16 are never candidates (topk-long-row).
enum class TopkFault { none, bin_overflow, edge, long_row };

/// The path each row took, counted on the device (StackReport::kernel_paths); what each means and
/// its name: gpu::kTopkRowPathNames (dsv32/gpu/stack.hpp), in this order.
enum TopkRowPath { kTopkWithinK, kTopkShortBins, kTopkBinRanked, kTopkCrowdedBin, kTopkRadixRow };
constexpr int kTopkRowPaths = 5;

/// `path_counts` (kTopkRowPaths ints, or null): each row adds 1 to its path's count.
void launch_topk_select(const Launch& go, bool bins, const Dims& d, const Meta& m,
                        const float* scores, int ld_scores, int rows, int* topk,
                        TopkFault fault = TopkFault::none, int* path_counts = nullptr);

}  // namespace dsv32::gpu::k

// residual_add, and the rank sum of a tensor-parallel o_proj.
#pragma once

#include "launch.cuh"

namespace dsv32::gpu::k {

/// h = S(h + y) over n values.
template <class S>
void launch_residual_add(const Launch& go, S* h, const S* y, long long n);
/// y = S(sum of parts[r] over r = 0 .. ranks - 1 in rank order), n values each.
template <class S>
void launch_sum_ranks(const Launch& go, const S* parts, int ranks, long long n, S* y);

}  // namespace dsv32::gpu::k

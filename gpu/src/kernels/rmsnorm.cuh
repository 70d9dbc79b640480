// input_norm: RMSNorm rows of the residual stream.
#pragma once

#include "launch.cuh"

namespace dsv32::gpu::k {

/// out = S(in / sqrt(mean(in^2) + eps) * g) for `rows` rows of n values.
template <class S>
void launch_rmsnorm(const Launch& go, int rows, const S* in, int in_ld, const S* g, S* out,
                    int out_ld, int n, float eps);

}  // namespace dsv32::gpu::k

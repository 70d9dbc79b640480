// Row RMSNorm by one block, shared by input_norm (rmsnorm.cu) and norm_rope_cache.
#pragma once

#include "common.cuh"

namespace dsv32::gpu::k {

/// A thread's first kR values of v (i = threadIdx.x + j blockDim.x, j < kR), 0 past n.
template <int kR, class S>
__device__ __forceinline__ void load_strided(const S* v, int n, float (&r)[kR]) {
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    r[j] = i < n ? ld(v[i]) : 0.f;
  }
}

/// One row's RMSNorm by one block: y = S(x / sqrt(mean(x^2) + eps) * g), a thread summing its
/// squares in ascending i, then a fixed shuffle tree. The thread's first kR values of x are
/// loaded together and those of g come in `gr` (load_strided: the callers read the weights
/// before waiting on the kernel ahead, as weights are constant); the rest are read as needed.
/// 1 / sqrt(mean(x^2) + eps) of a row by one block, the thread's first kR values in xr
/// (load_strided), the rest read from x; a thread's squares in ascending i, then a fixed
/// shuffle tree.
template <int kR, class S>
__device__ __forceinline__ float rms_inv(const float (&xr)[kR], const S* x, int n, float eps,
                                         float* sh) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kR; ++j)
    if (threadIdx.x + j * blockDim.x < n) ss += xr[j] * xr[j];
  for (int i = threadIdx.x + kR * blockDim.x; i < n; i += blockDim.x) ss += ld(x[i]) * ld(x[i]);
  return 1.f / sqrtf(block_sum(ss, sh) / static_cast<float>(n) + eps);
}

template <int kR, class S>
__device__ __forceinline__ void rmsnorm_row(const S* x, const float (&gr)[kR], const S* g, S* y,
                                            int n, float eps, float* sh) {
  float xr[kR];
  load_strided(x, n, xr);
  const float inv = rms_inv(xr, x, n, eps, sh);
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < n) y[i] = st<S>(xr[j] * inv * gr[j]);
  }
  for (int i = threadIdx.x + kR * blockDim.x; i < n; i += blockDim.x)
    y[i] = st<S>(ld(x[i]) * inv * ld(g[i]));
}

}  // namespace dsv32::gpu::k

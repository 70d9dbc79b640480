#include "common.cuh"
#include "elementwise.cuh"

namespace dsv32::gpu::k {

/// residual_add: h = S(h + y) over T rows.
template <class S>
__global__ void residual_add(S* h, const S* y, long long n) {
  stream_order();
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = st<S>(ld(h[i]) + ld(y[i]));
}

/// Tensor-parallel o_proj: y = S(sum over ranks r = 0, 1, ... of parts[r]) with an fp32
/// accumulator in rank order, every rank the same bits (parts: `ranks` gathered blocks of n).
template <class S>
__global__ void sum_ranks(const S* parts, int ranks, long long n, S* y) {
  stream_order();
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int r = 0; r < ranks; ++r) acc += ld(parts[r * n + i]);
  y[i] = st<S>(acc);
}

template <class S>
void launch_residual_add(const Launch& go, S* h, const S* y, long long n) {
  go(residual_add<S>, static_cast<unsigned>((n + 255) / 256), 256, 0, h, y, n);
}
template <class S>
void launch_sum_ranks(const Launch& go, const S* parts, int ranks, long long n, S* y) {
  go(sum_ranks<S>, static_cast<unsigned>((n + 255) / 256), 256, 0, parts, ranks, n, y);
}

#define DSV32_INSTANTIATE(S)                                                    \
  template void launch_residual_add<S>(const Launch&, S*, const S*, long long); \
  template void launch_sum_ranks<S>(const Launch&, const S*, int, long long, S*);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

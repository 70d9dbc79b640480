#include "uk_absorb.cuh"
#include "weight_load.cuh"

namespace dsv32::gpu::k {

template <class S, int R>
__global__ void __launch_bounds__(kUkThreads)
    uk_small(Dims d, const S* q, const S* w_kv_b, S* qpack) {
  constexpr int V = 16 / sizeof(S);
  extern __shared__ float uk_sm[];  // R x dn query values, then slices x R x L partial sums
  const int h = blockIdx.x, pieces = d.L / V, slices = kUkThreads / pieces;
  const int p = threadIdx.x % pieces, sl = threadIdx.x / pieces;
  const int i0 = d.dn * sl / slices, i1 = d.dn * (sl + 1) / slices;
  const S* wh = w_kv_b + static_cast<long long>(h) * (d.dn + d.dv) * d.L + p * V;
  uint4 wq[kUkBatch];
  const auto fetch = [&](int ib) {
#pragma unroll
    for (int b = 0; b < kUkBatch; ++b) {
      const auto* row = reinterpret_cast<const uint4*>(wh + static_cast<long long>(ib + b) * d.L);
      wq[b] = ib + b < i1 ? ld_weight(row) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  fetch(i0);
  stream_order();
  float* qs = uk_sm;
  for (int w = threadIdx.x; w < R * d.dn; w += blockDim.x)
    qs[w] = ld(q[(static_cast<long long>(w / d.dn) * d.H + h) * (d.dn + d.dr) + w % d.dn]);
  __syncthreads();
  float acc[R][V];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < V; ++j) acc[r][j] = 0.f;
  for (int ib = i0; ib < i1; ib += kUkBatch) {
    if (ib != i0) fetch(ib);
#pragma unroll
    for (int b = 0; b < kUkBatch; ++b) {
      if (ib + b >= i1) break;
      float wv[V];
      unpack16<S>(wq[b], wv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float qv = qs[r * d.dn + ib + b];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[r][j] = fmaf(qv, wv[j], acc[r][j]);
      }
    }
  }
  float* part = uk_sm + R * d.dn;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < V; ++j) part[(sl * R + r) * d.L + p * V + j] = acc[r][j];
  __syncthreads();
  for (int w = threadIdx.x; w < R * d.L; w += blockDim.x) {
    const int r = w / d.L, c = w % d.L;
    float sum = 0.f;
    for (int s2 = 0; s2 < slices; ++s2) sum += part[(s2 * R + r) * d.L + c];
    qpack[(static_cast<long long>(r) * d.H + h) * (d.L + d.dr) + c] = st<S>(sum);
  }
}

template <class S>
void launch_uk_small(const Launch& go, const Dims& d, int rows, const S* q, const S* w_kv_b,
                     S* qpack) {
  with_rows(rows, [&](auto R) {
    go(uk_small<S, decltype(R)::value>, d.H, kUkThreads, uk_small_smem<S>(d, rows), d, q, w_kv_b,
       qpack);
  });
}

template <class S>
void allow_uk_small_smem() {
  for (int rows = 1; rows <= kGemvMaxRows; ++rows)
    with_rows(rows, [](auto R) {
      detail::check(cudaFuncSetAttribute(uk_small<S, decltype(R)::value>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kUkSmemMax)),
                    "uk_small shared memory");
    });
}

#define DSV32_INSTANTIATE(S)                                                                 \
  template void launch_uk_small<S>(const Launch&, const Dims&, int, const S*, const S*, S*); \
  template void allow_uk_small_smem<S>();
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

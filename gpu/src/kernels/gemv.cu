#include "gemv.cuh"
#include "weight_load.cuh"

namespace dsv32::gpu::k {

/// Projections of decode batches (T <= kGemvMaxRows rows): y (R x n) = S(x (R x k) W^T), W (n x
/// k) row-major, fp32 accumulation, reading W once at full bandwidth (cuBLAS's GEMMs of one row
/// run at 1.1-20x their weight-read floor). A group of `ksplit` warps computes kGemvOuts outputs
/// for all R rows, warp q of the group summing the q-th of ksplit contiguous slices of k (long
/// rows are split so that enough warps stream the weights; short ones are not, as each split
/// costs a reduction): a lane sums its 16-byte pieces of the slice in ascending order, then a
/// fixed shuffle tree per warp and the group's warps in order. The order depends only on k, so
/// every plan gets the same bits. Needs k a multiple of 16 / sizeof(S) and 16-byte aligned rows
/// (gemv_fits). Grid ceil(n / (kGemvOuts kGemvWarps / ksplit)), kGemvThreads threads.
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvOuts = 4;

/// Warps sharing one group of outputs: 1, 2, 4 or 8, about one per 1536 values of k, and more
/// (up to 8, at least 512 values each) where fewer blocks than `sms` would stream the weights
/// otherwise (indexer_wk_proj's 192 outputs: 24 blocks at ksplit 4). `batch`: independent
/// products in the grid (uv_proj's heads). Depends on the weight's shape and the device only.
__host__ __device__ inline int gemv_ksplit(int n, int k, int sms, int batch = 1) {
  int s = 1;
  while (s < kGemvWarps && (s * 2) * 1536 <= k) s *= 2;
  const auto blocks = [&](int ks) {
    const int per = kGemvOuts * (kGemvWarps / ks);
    return static_cast<long long>(batch) * ((n + per - 1) / per);
  };
  while (s < kGemvWarps && s * 2 * 512 <= k && blocks(s) < sms) s *= 2;
  return s;
}

/// A lane's weight pieces loaded together before any is used (the loads of kGemvBatch
/// iterations x kGemvOuts rows in flight at once; a loop that loads and uses a piece at a time
/// left a cold 30 MB weight streaming at half the bandwidth).
constexpr int kGemvBatch = 4;

/// Grid (ceil(n / (kGemvOuts kGemvWarps / ksplit)), batch): product b reads x + b xs, w + b ws
/// and writes y + b ys.
template <class S, int R>
__global__ void __launch_bounds__(kGemvThreads)
    gemv(const S* x, int ldx, long long xs, const S* w, long long ws, S* y, int ldy, long long ys,
         int n, int k, int ksplit) {
  constexpr int V = 16 / sizeof(S);
  __shared__ float part[kGemvWarps][R][kGemvOuts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / ksplit, q = warp % ksplit, groups = kGemvWarps / ksplit;
  x += blockIdx.y * xs;
  w += blockIdx.y * ws;
  y += blockIdx.y * ys;
  const int n0 = (blockIdx.x * groups + group) * kGemvOuts;
  const int nvec = k / V, v0 = nvec * q / ksplit, v1 = nvec * (q + 1) / ksplit;
  uint4 wq[kGemvBatch][kGemvOuts];
  const auto fetch = [&](int vb) {
#pragma unroll
    for (int u = 0; u < kGemvBatch; ++u)
#pragma unroll
      for (int o = 0; o < kGemvOuts; ++o) {
        const int v = vb + 32 * u;
        const auto* row = reinterpret_cast<const uint4*>(w + static_cast<long long>(n0 + o) * k);
        wq[u][o] = v < v1 && n0 + o < n ? ld_weight(row + v) : make_uint4(0u, 0u, 0u, 0u);
      }
  };
  // The first batch is read before waiting on the kernel ahead (weights are constant): blocks
  // resident while it runs start with it loaded. Not at 4 rows: there it costs registers enough
  // to leave one block an SM.
  constexpr bool kEarly = R <= 3;
  if (kEarly && n0 < n) fetch(v0 + lane);
  stream_order();
  float acc[R][kGemvOuts];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 0; o < kGemvOuts; ++o) acc[r][o] = 0.f;
  if (n0 < n) {
    for (int vb = v0 + lane; vb < v1; vb += 32 * kGemvBatch) {
      if (!kEarly || vb != v0 + lane) fetch(vb);
#pragma unroll
      for (int u = 0; u < kGemvBatch; ++u) {
        const int v = vb + 32 * u;
        if (v >= v1) break;
        float xv[R][V];
#pragma unroll
        for (int r = 0; r < R; ++r)
          unpack16<S>(*reinterpret_cast<const uint4*>(x + static_cast<long long>(r) * ldx + v * V),
                      xv[r]);
#pragma unroll
        for (int o = 0; o < kGemvOuts; ++o) {
          float wv[V];
          unpack16<S>(wq[u][o], wv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < V; ++j) acc[r][o] = fmaf(xv[r][j], wv[j], acc[r][o]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int o = 0; o < kGemvOuts; ++o) {
      const float s = warp_sum(acc[r][o]);
      if (lane == 0) part[warp][r][o] = s;
    }
  __syncthreads();
  if (threadIdx.x < groups * R * kGemvOuts) {
    const int g = threadIdx.x / (R * kGemvOuts), r = threadIdx.x / kGemvOuts % R,
              o = threadIdx.x % kGemvOuts;
    const int out = (blockIdx.x * groups + g) * kGemvOuts + o;
    if (out < n) {
      float s = 0.f;
      for (int qq = 0; qq < ksplit; ++qq) s += part[g * ksplit + qq][r][o];
      y[static_cast<long long>(r) * ldy + out] = st<S>(s);
    }
  }
}

static_assert(kGemvMaxRows == 4, "with_rows instantiates 1 .. 4 rows");

template <class S>
void launch_gemv(const Launch& go, const S* x, int ldx, long long xs, const S* w, long long ws,
                 S* y, int ldy, long long ys, int batch, int rows, int n, int k, int sms) {
  const int ksplit = gemv_ksplit(n, k, sms, batch);
  const int per_block = kGemvOuts * (kGemvWarps / ksplit);
  const dim3 grid(static_cast<unsigned>((n + per_block - 1) / per_block),
                  static_cast<unsigned>(batch));
  with_rows(rows, [&](auto R) {
    go(gemv<S, decltype(R)::value>, grid, kGemvThreads, 0, x, ldx, xs, w, ws, y, ldy, ys, n, k,
       ksplit);
  });
}

#define DSV32_INSTANTIATE(S)                                                                     \
  template void launch_gemv<S>(const Launch&, const S*, int, long long, const S*, long long, S*, \
                               int, long long, int, int, int, int, int);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

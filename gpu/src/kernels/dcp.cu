#include "common.cuh"
#include "dcp.cuh"

namespace dsv32::gpu::k {
namespace {

/// Grid (rows), 128 threads over the row's K entries.
__global__ void dcp_share(Dims d, Meta m, const int* topk, int* share, int world, int interleave,
                          int rank, ShareFault fault) {
  stream_order();
  // A padded row (device-driven: past the live rows) gets no entry, as the F layer's clear
  // leaves it in the shared rows.
  const bool live = static_cast<int>(blockIdx.x) < live_rows(m, blockIdx.x + 1);
  const long long row = static_cast<long long>(blockIdx.x) * d.K;
  const long long span = static_cast<long long>(interleave) * world;
  int valid = 0;  // share-prefix: the row's owned entries (the same in every thread)
  for (int base = 0; base < d.K; base += blockDim.x) {  // uniform trip count: the count below
    const int k = base + threadIdx.x;
    const int p = live && k < d.K ? topk[row + k] : -1;
    const bool owned = p >= 0 && (p / interleave) % world == rank;
    if (k < d.K) {
      const int local = static_cast<int>((p / span) * interleave + p % interleave);
      share[row + k] = !owned ? -1 : fault == ShareFault::global_as_local ? p : local;
    }
    valid += __syncthreads_count(owned);
  }
  if (fault != ShareFault::share_prefix) return;
  __syncthreads();  // every entry written before the prefix is cut
  for (int k = valid + threadIdx.x; k < d.K; k += blockDim.x) share[row + k] = -1;
}

/// Grid (rows, H), 128 threads over the latent.
template <class S>
__global__ void dcp_merge(Dims d, Meta m, int world, long long rows_stride, const S* part_olat,
                          const float* part_lse, S* olat, S* olat_trace, float* lse,
                          bool every_rank) {
  stream_order();
  if (static_cast<int>(blockIdx.x) >= live_rows(m, blockIdx.x + 1)) return;
  const long long th = static_cast<long long>(blockIdx.x) * d.H + blockIdx.y;
  const long long lse_stride = rows_stride * d.H, olat_stride = lse_stride * d.L;
  float mx = -INFINITY;
  for (int r = 0; r < world; ++r)
    if (const float v = part_lse[r * lse_stride + th]; isfinite(v)) mx = fmaxf(mx, v);
  float total = -INFINITY;
  if (mx != -INFINITY) {
    float s = 0.f;
    for (int r = 0; r < world; ++r)
      if (const float v = part_lse[r * lse_stride + th]; isfinite(v)) s += expf(v - mx);
    total = mx + logf(s);  // one rank: m + log 1 = m
  }
  for (int c = threadIdx.x; c < d.L; c += blockDim.x) {
    float acc = 0.f;
    bool first = true;
    for (int r = 0; r < world; ++r) {
      const float v = part_lse[r * lse_stride + th];
      if (!isfinite(v) && !every_rank) continue;  // an empty rank adds exactly nothing
      const float x = rnd<S>(expf(v - total) * ld(part_olat[r * olat_stride + th * d.L + c]));
      acc = first ? x : rnd<S>(acc + x);
      first = false;
    }
    olat[th * d.L + c] = st<S>(acc);
    olat_trace[th * d.L + c] = st<S>(acc);
  }
  if (threadIdx.x == 0) lse[th] = total;
}

}  // namespace

void launch_dcp_share(const Launch& go, const Dims& d, const Meta& m, int rows, const int* topk,
                      int* share, int world, int interleave, int rank, ShareFault fault) {
  go(dcp_share, dim3(rows), 128, 0, d, m, topk, share, world, interleave, rank, fault);
}

template <class S>
void launch_dcp_merge(const Launch& go, const Dims& d, const Meta& m, int rows, int world,
                      long long rows_stride, const S* part_olat, const float* part_lse, S* olat,
                      S* olat_trace, float* lse, bool every_rank) {
  go(dcp_merge<S>, dim3(rows, d.H), 128, 0, d, m, world, rows_stride, part_olat, part_lse, olat,
     olat_trace, lse, every_rank);
}

template void launch_dcp_merge<float>(const Launch&, const Dims&, const Meta&, int, int, long long,
                                      const float*, const float*, float*, float*, float*, bool);
template void launch_dcp_merge<bf16>(const Launch&, const Dims&, const Meta&, int, int, long long,
                                     const bf16*, const float*, bf16*, bf16*, float*, bool);

}  // namespace dsv32::gpu::k

#include "sparse_mqa.cuh"

namespace dsv32::gpu::k {

/// sparse_mqa: per (token, head), softmax over the selected set of sigma * [ql; qR] . [c; kR]
/// read from the cache; P rounded to S before P.V; olat = S(sum P c / l), lse = m + log l
/// (natural log). A row with no valid index gives olat = 0 and lse = -inf.
///
/// Four steps, the two products on tensor cores through cuBLAS (stack.cu): the selected key
/// rows gathered from the paged cache into a dense (T_a, K, L + dr) array (mqa_gather), the
/// scores as one batched GEMM over the tokens (depth L + dr: the query is stored packed as
/// [ql; qR]), the softmax of each (token, head) (mqa_softmax), P.V as one batched GEMM, and the
/// division by l (mqa_finish). Every step is deterministic: the gather and the element-wise
/// steps have no reductions but fixed shuffle trees, and cuBLAS picks the same kernels for the
/// same shapes.
constexpr int kMqaThreads = 256;
constexpr int kMqaGatherRows = kMqaThreads / 32;  // key rows per gather block, a warp each

/// keys[t, k, :] = [c; kR] of token t's k-th selected position as the cache reads back (an fp8
/// entry dequantized and rounded to S), zeros where the index is -1. Grid (T_a, ceil(K / 8)),
/// 256 threads: a warp a row, the lanes over its columns; a plain cache row moves in 16-byte
/// pieces when its parts allow (`vec`: L and dr times sizeof(S) multiples of 16). The sets also
/// go to the layer's trace copy (the shared buffer is overwritten by the next F layer).
/// `fault`: a planted bug (LatentFault).
template <class S>
__global__ void __launch_bounds__(kMqaThreads)
    mqa_gather(Dims d, Meta m, KvCache<S> cache, const int* topk, S* keys, bool vec,
               int* topk_trace, LatentFault fault, DcpView view) {
  stream_order();
  const int t = blockIdx.x, k = blockIdx.y * kMqaGatherRows + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  int r, p;
  if (k >= d.K || !token_of(m, t, r, p)) return;
  const int W = d.L + d.dr;
  S* dst = keys + (static_cast<long long>(t) * d.K + k) * W;
  int j = topk[static_cast<long long>(t) * d.K + k];
  if (lane == 0) topk_trace[static_cast<long long>(t) * d.K + k] = j;  // the layer's sets
  if (j >= 0 && view.world > 1) {  // a rank's local position: the global one it holds
    const long long g = static_cast<long long>(j / view.interleave) * view.interleave * view.world +
                        static_cast<long long>(view.rank) * view.interleave + j % view.interleave;
    j = g <= p ? static_cast<int>(g) : -1;  // past the token: nothing this rank wrote for it
  }
  if (j < 0) {
    for (int i = lane; i < W; i += 32) dst[i] = st<S>(0.f);
    return;
  }
  const long long sl = slot_of(d, m, r, j);
  if (vec && !d.fp8_kv) {
    constexpr int per = 16 / sizeof(S);
    const uint4* lat = reinterpret_cast<const uint4*>(cache.latent + sl * d.L);
    const uint4* rope = reinterpret_cast<const uint4*>(cache.rope + sl * d.dr);
    uint4* out = reinterpret_cast<uint4*>(dst);
    for (int i = lane; i < d.L / per; i += 32) out[i] = lat[i];
    for (int i = lane; i < d.dr / per; i += 32) out[d.L / per + i] = rope[i];
    return;
  }
  const bool tile0_scale = fault == LatentFault::first_tile_scale;  // the same in every thread
  for (int i = lane; i < d.L; i += 32)
    dst[i] = d.fp8_kv ? st<S>(latent_at(d, cache, sl, i, tile0_scale)) : cache.latent[sl * d.L + i];
  for (int i = lane; i < d.dr; i += 32) dst[d.L + i] = cache.rope[sl * d.dr + i];
}

/// Softmax statistics of each (token, head) over the scores z: m = max z, P = S(exp(z - m)),
/// l = sum P before rounding (0 when no index is valid). A block per (token, head), its
/// threads over the K entries (coalesced; the first kMqaSoftmaxRegs per thread read once into
/// registers), the max and sum as block-wide fixed shuffle trees; grid (T_a, H), kMqaThreads
/// threads.
constexpr int kMqaSoftmaxRegs = 8;  // K = 2048 over 256 threads

template <class S>
__global__ void __launch_bounds__(kMqaThreads)
    mqa_softmax(Dims d, Meta m, const int* topk, const float* z, S* p, float* ml) {
  stream_order();
  __shared__ float sh[32];
  const int t = blockIdx.x, h = blockIdx.y;
  if (t >= live_rows(m, t + 1)) return;  // the same in every thread
  const long long th = static_cast<long long>(t) * d.H + h, row_at = th * d.K;
  const int* row = topk + static_cast<long long>(t) * d.K;
  // Entry r of this thread: k = threadIdx.x + r blockDim.x, its index and score loaded
  // together (the score array is dense: an invalid index's entry exists but is not used);
  // `see` and `emit` test the index, so a NaN score stays a score.
  int ir[kMqaSoftmaxRegs];
  float zr[kMqaSoftmaxRegs];
#pragma unroll
  for (int r = 0; r < kMqaSoftmaxRegs; ++r) {
    const int k = threadIdx.x + r * blockDim.x;
    ir[r] = k < d.K ? row[k] : -1;
    zr[r] = k < d.K ? z[row_at + k] : 0.f;
  }
  float mx = -FLT_MAX;
  int any = 0;
  const auto see = [&](int j, float v) {
    if (j >= 0) mx = fmaxf(mx, v), any = 1;
  };
#pragma unroll
  for (int r = 0; r < kMqaSoftmaxRegs; ++r) see(ir[r], zr[r]);
  for (int k = threadIdx.x + kMqaSoftmaxRegs * blockDim.x; k < d.K; k += blockDim.x)
    see(row[k], z[row_at + k]);
  const bool valid = __syncthreads_or(any);
  mx = block_max(mx, sh);
  float part = 0.f;
  const auto emit = [&](int k, int j, float v) {
    if (k >= d.K) return;
    const float e = j >= 0 ? expf(v - mx) : 0.f;
    part += e;
    p[row_at + k] = st<S>(e);  // P in the storage precision before P.V
  };
#pragma unroll
  for (int r = 0; r < kMqaSoftmaxRegs; ++r) emit(threadIdx.x + r * blockDim.x, ir[r], zr[r]);
  for (int k = threadIdx.x + kMqaSoftmaxRegs * blockDim.x; k < d.K; k += blockDim.x)
    emit(k, row[k], z[row_at + k]);
  const float l = block_sum(part, sh);
  if (threadIdx.x == 0) {
    ml[2 * th] = mx;
    ml[2 * th + 1] = valid ? l : 0.f;
  }
}

/// olat[t, h, :] = S(acc[t, h, :] / l) (0 where no index is valid), also into the layer's trace
/// copy (the backend's buffer rotates); lse = m + log l. Grid (T_a, H), 128 threads. `fault`:
/// a DCP mutant's partial (FinishFault).
template <class S>
__global__ void mqa_finish(Dims d, Meta m, const float* acc, const float* ml, S* olat,
                           S* olat_trace, float* lse, FinishFault fault) {
  stream_order();
  if (static_cast<int>(blockIdx.x) >= live_rows(m, blockIdx.x + 1)) return;
  const long long th = static_cast<long long>(blockIdx.x) * d.H + blockIdx.y;
  const float l = ml[2 * th + 1];
  const bool divide = l > 0.f || fault == FinishFault::divide_empty;  // 0 / 0 where not
  for (int c = threadIdx.x; c < d.L; c += blockDim.x) {
    const S v = st<S>(divide ? acc[th * d.L + c] / l : 0.f);
    olat[th * d.L + c] = v;
    olat_trace[th * d.L + c] = v;
  }
  const float scale = fault == FinishFault::lse_base2 ? 1.4426950408889634f : 1.f;  // log2(e)
  if (threadIdx.x == 0) lse[th] = l > 0.f ? scale * (ml[2 * th] + logf(l)) : -INFINITY;
}

/// Busy-waits `cycles` clock cycles (mutant unjoined-stream: a slow backend on the main stream).
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

template <class S>
void launch_mqa_gather(const Launch& go, const Dims& d, const Meta& m, int rows, KvCache<S> cache,
                       const int* topk, S* keys, bool vec, int* topk_trace, LatentFault fault,
                       DcpView view) {
  go(mqa_gather<S>, dim3(rows, (d.K + kMqaGatherRows - 1) / kMqaGatherRows), kMqaThreads, 0, d, m,
     cache, topk, keys, vec, topk_trace, fault, view);
}
template <class S>
void launch_mqa_softmax(const Launch& go, const Dims& d, const Meta& m, int rows, const int* topk,
                        const float* z, S* p, float* ml) {
  go(mqa_softmax<S>, dim3(rows, d.H), kMqaThreads, 0, d, m, topk, z, p, ml);
}
template <class S>
void launch_mqa_finish(const Launch& go, const Dims& d, const Meta& m, int rows, const float* acc,
                       const float* ml, S* olat, S* olat_trace, float* lse, FinishFault fault) {
  go(mqa_finish<S>, dim3(rows, d.H), 128, 0, d, m, acc, ml, olat, olat_trace, lse, fault);
}

void launch_spin(cudaStream_t stream, long long cycles) {
  spin<<<1, 1, 0, stream>>>(cycles);
}

#define DSV32_INSTANTIATE(S)                                                                     \
  template void launch_mqa_gather<S>(const Launch&, const Dims&, const Meta&, int, KvCache<S>,   \
                                     const int*, S*, bool, int*, LatentFault, DcpView);          \
  template void launch_mqa_softmax<S>(const Launch&, const Dims&, const Meta&, int, const int*,  \
                                      const float*, S*, float*);                                 \
  template void launch_mqa_finish<S>(const Launch&, const Dims&, const Meta&, int, const float*, \
                                     const float*, S*, S*, float*, FinishFault);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

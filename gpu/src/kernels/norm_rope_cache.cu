#include "indexer_quant.cuh"
#include "norm.cuh"
#include "norm_rope_cache.cuh"

namespace dsv32::gpu::k {

/// norm_rope_cache, MLA part: c = RMSNorm(ckv) * g_kv, kR = rope(kpe_raw); cache insert at the
/// token's slot (skipped when slot < 0); kR also to its trace buffer. One block, token t; `c`
/// L floats and `sh` 32 of shared memory.
template <int kR, class S>
__device__ __forceinline__ void kv_insert(const Dims& d, const Meta& m, int t, const S* qkv,
                                          const float (&gr)[kR], const S* g_kv,
                                          const KvCache<S>& cache, S* kR_out, float* c, float* sh) {
  const S* row = qkv + static_cast<long long>(t) * (d.Rq + d.L + d.dr);
  const S* ckv = row + d.Rq;
  float xr[kR];
  load_strided(ckv, d.L, xr);
  const float inv = rms_inv(xr, ckv, d.L, d.eps, sh);  // c kept in fp32 (quantized from it)
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < d.L) c[i] = xr[j] * inv * gr[j];
  }
  for (int i = threadIdx.x + kR * blockDim.x; i < d.L; i += blockDim.x)
    c[i] = ld(ckv[i]) * inv * ld(g_kv[i]);
  __syncthreads();
  const long long slot = m.slots[t];
  const int p = m.positions[t];
  for (int i = threadIdx.x; i < d.dr / 2; i += blockDim.x) {
    float a = ld(row[d.Rq + d.L + 2 * i]), b = ld(row[d.Rq + d.L + 2 * i + 1]);
    const long long r = static_cast<long long>(p) * (d.dr / 2) + i;
    rope_pair(a, b, m.rope_cos[r], m.rope_sin[r]);
    kR_out[static_cast<long long>(t) * d.dr + 2 * i] = st<S>(a);
    kR_out[static_cast<long long>(t) * d.dr + 2 * i + 1] = st<S>(b);
    if (slot >= 0) {
      cache.rope[slot * d.dr + 2 * i] = st<S>(a);
      cache.rope[slot * d.dr + 2 * i + 1] = st<S>(b);
    }
  }
  if (slot < 0) return;
  if (!d.fp8_kv) {
    for (int i = threadIdx.x; i < d.L; i += blockDim.x) cache.latent[slot * d.L + i] = st<S>(c[i]);
    return;
  }
  for (int tile = 0; tile < d.tiles; ++tile) {  // quantized straight from fp32
    const int t0 = tile * 128, t1 = min(d.L, t0 + 128);
    float amax = 0.f;
    for (int i = t0 + threadIdx.x; i < t1; i += blockDim.x) amax = fmaxf(amax, fabsf(c[i]));
    const float scale = fmaxf(block_max(amax, sh) / 448.f, FLT_MIN);
    for (int i = t0 + threadIdx.x; i < t1; i += blockDim.x)
      cache.codes[slot * d.L + i] = float_to_e4m3(c[i] / scale);
    if (threadIdx.x == 0) cache.scales[slot * d.tiles + tile] = scale;
  }
}

/// norm_rope_cache, indexer part (F layers): kI = LayerNorm(kraw) * g_k + b_k, rotated and
/// quantized; trace buffers and, for slot >= 0, the indexer cache. One block of 128, token t;
/// `v` 128 floats and `sh` 32 of shared memory.
template <class S>
__device__ __forceinline__ void index_k_insert(const Dims& d, const Meta& m, int t, const S* kw,
                                               float g_k, float b_k, const IndexCache& cache,
                                               std::uint8_t* k8_out, float* kscale_out, float* v,
                                               float* sh) {
  const int i = threadIdx.x;
  const float x = ld(kw[static_cast<long long>(t) * (d.dI + d.HI) + i]);
  const float mean = block_sum(x, sh) / 128.f;
  const float var = block_sum((x - mean) * (x - mean), sh) / 128.f;
  v[i] = (x - mean) / sqrtf(var + d.ieps) * g_k + b_k;
  rotate_quantize(d, m, v, sh, m.positions[t], k8_out + static_cast<long long>(t) * 128,
                  kscale_out + t);
  __syncthreads();
  const long long slot = m.slots[t];
  if (slot < 0) return;
  cache.codes[slot * 128 + i] = k8_out[static_cast<long long>(t) * 128 + i];
  if (i == 0) cache.scales[slot] = kscale_out[t];
}

/// norm_rope_cache as one launch: grid (T, 4), kNormRopeThreads threads; blockIdx.y picks the
/// part for token t = blockIdx.x: 0 q_c = RMSNorm(cq) * g_q, 1 the MLA latent and kR into the
/// cache (kv_insert), 2 the indexer key into its cache (F layers: `index_k`), 3 the shared
/// top-k row t cleared to -1 (`clear`: F layers, or a mutant's choice). The parts touch
/// disjoint data. Dynamic shared memory: L + 32 floats.
constexpr int kNormRopeThreads = 128;  // index_k_insert's vector: a thread per dimension
constexpr int kNrcRegs = 12;           // q_lora_rank = 1536 over 128 threads

template <class S>
__global__ void __launch_bounds__(kNormRopeThreads)
    norm_rope_cache(Dims d, Meta m, const S* qkv, const S* g_q, S* q_c, const S* g_kv,
                    KvCache<S> cache, S* kR_out, bool index_k, const S* kw, const S* g_k,
                    const S* b_k, IndexCache index, std::uint8_t* k8_out, float* kscale_out,
                    bool clear, int* topk) {
  // The part's weights into registers before waiting on the kernel ahead (constant).
  float gr[kNrcRegs];
  switch (blockIdx.y) {
    case 0:
      load_strided(g_q, d.Rq, gr);
      break;
    case 1:
      load_strided(g_kv, d.L, gr);
      break;
    case 2:
      if (index_k) gr[0] = ld(g_k[threadIdx.x]), gr[1] = ld(b_k[threadIdx.x]);
      break;
    default:
      break;
  }
  stream_order();
  extern __shared__ float smem[];
  float* sh = smem;        // 32
  float* buf = smem + 32;  // L (kv_insert) or 128 (index_k_insert)
  const int t = blockIdx.x;
  switch (blockIdx.y) {
    case 0:
      rmsnorm_row(qkv + static_cast<long long>(t) * (d.Rq + d.L + d.dr), gr, g_q,
                  q_c + static_cast<long long>(t) * d.Rq, d.Rq, d.eps, sh);
      break;
    case 1:
      kv_insert(d, m, t, qkv, gr, g_kv, cache, kR_out, buf, sh);
      break;
    case 2:
      if (index_k) index_k_insert(d, m, t, kw, gr[0], gr[1], index, k8_out, kscale_out, buf, sh);
      break;
    default:
      if (clear)
        for (int k = threadIdx.x; k < d.K; k += blockDim.x)
          topk[static_cast<long long>(t) * d.K + k] = -1;
  }
}

template <class S>
void launch_norm_rope_cache(const Launch& go, const Dims& d, const Meta& m, const S* qkv,
                            const S* g_q, S* q_c, const S* g_kv, KvCache<S> cache, S* kR_out,
                            bool index_k, const S* kw, const S* g_k, const S* b_k, IndexCache index,
                            std::uint8_t* k8_out, float* kscale_out, bool clear, int* topk) {
  go(norm_rope_cache<S>, dim3(d.T, 4), kNormRopeThreads, (max(d.L, 128) + 32) * sizeof(float), d, m,
     qkv, g_q, q_c, g_kv, cache, kR_out, index_k, kw, g_k, b_k, index, k8_out, kscale_out, clear,
     topk);
}

#define DSV32_INSTANTIATE(S)                                                                     \
  template void launch_norm_rope_cache<S>(                                                       \
      const Launch&, const Dims&, const Meta&, const S*, const S*, S*, const S*, KvCache<S>, S*, \
      bool, const S*, const S*, const S*, IndexCache, std::uint8_t*, float*, bool, int*);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

// The ops' kernels (BOUNDARIES.md section 1), templated on the storage type S (bf16 or float).
#pragma once

#include "kernels.cuh"

namespace dsv32::gpu::k {

/// Geometry and switches the kernels need, copied by value into every launch.
struct Dims {
  int T, D, H, Rq, L, dn, dr, dv, HI, dI, K, B;
  int max_blocks;  // columns of the block table
  float eps, ieps, sigma, head_norm;
  bool neox, hadamard, fp8_kv;
  bool padded_write;  // mutant padded-cache-write: slot -1 rows go to slot 0
  int tiles;          // fp8_ds_mla tiles of the latent
};

/// Device pointers of the step metadata.
struct Meta {
  const int* positions;         // (T), padded rows 0
  const long long* slots;       // (T), padded rows -1
  const int* request_of_token;  // (T_a)
  const int* block_table;       // (R, max_blocks)
  const float* rope_cos;        // (positions, dr/2)
  const float* rope_sin;
};

/// The MLA latent cache: S values, or fp8_ds_mla codes + tile scales; rope part in S.
template <class S>
struct KvCache {
  S* latent;            // (slots, L) when not fp8
  std::uint8_t* codes;  // (slots, L) when fp8
  float* scales;        // (slots, tiles) when fp8
  S* rope;              // (slots, dr)
};

struct IndexCache {
  std::uint8_t* codes;  // (slots, dI)
  float* scales;        // (slots)
};

__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = x * c - y * s;
  b = x * s + y * c;
}

/// RMSNorm rows: out = S(in / sqrt(mean(in^2) + eps) * g). One block of kNormThreads per row;
/// the loops unrolled so that a thread's loads are in flight together (a decode step has one
/// row: latency, not bandwidth, is its cost).
constexpr int kNormThreads = 1024;

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

/// input_norm. Grid (T), kNormThreads threads.
constexpr int kNormRegs = 8;  // D = 7168 over 1024 threads
template <class S>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm(const S* in, int in_ld, const S* g, S* out, int out_ld, int n, float eps) {
  float gr[kNormRegs];
  load_strided(g, n, gr);
  stream_order();
  __shared__ float sh[32];
  rmsnorm_row(in + static_cast<long long>(blockIdx.x) * in_ld, gr, g,
              out + static_cast<long long>(blockIdx.x) * out_ld, n, eps, sh);
}

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
  long long slot = m.slots[t];
  if (slot < 0 && d.padded_write) slot = 0;
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

/// One latent value read back from the cache (fp8: code * scale in fp32, then S).
template <class S>
__device__ __forceinline__ float latent_at(const Dims& d, const KvCache<S>& cache, long long slot,
                                           int i) {
  if (!d.fp8_kv) return ld(cache.latent[slot * d.L + i]);
  return rnd<S>(e4m3_to_float(cache.codes[slot * d.L + i]) *
                cache.scales[slot * d.tiles + i / 128]);
}

/// The latent of the real tokens as read back from the cache (the trace's `c`).
template <class S>
__global__ void read_latent(Dims d, Meta m, KvCache<S> cache, S* out) {
  stream_order();
  const int t = blockIdx.x;
  const long long slot = m.slots[t];
  for (int i = threadIdx.x; i < d.L; i += blockDim.x)
    out[static_cast<long long>(t) * d.L + i] = st<S>(latent_at(d, cache, slot, i));
}

/// RoPE (indexer layout) on the first dr values, optional Hadamard, then fp8 with a ue8m0
/// scale, for one 128-vector held in shared memory `v` by a block of 128 threads.
__device__ __forceinline__ void rotate_quantize(const Dims& d, const Meta& m, float* v, float* sh,
                                                int p, std::uint8_t* codes, float* scale_out) {
  const int i = threadIdx.x;
  __syncthreads();
  if (i < d.dr / 2) {
    const int a = d.neox ? i : 2 * i, b = d.neox ? i + d.dr / 2 : 2 * i + 1;
    const long long r = static_cast<long long>(p) * (d.dr / 2) + i;
    rope_pair(v[a], v[b], m.rope_cos[r], m.rope_sin[r]);
  }
  __syncthreads();
  if (d.hadamard) {
    for (int h = 1; h < 128; h <<= 1) {
      float mine = 0.f;
      const int partner = i ^ h;
      mine = (i & h) ? v[partner] - v[i] : v[i] + v[partner];
      __syncthreads();
      v[i] = mine;
      __syncthreads();
    }
    v[i] *= 0.08838834764831845f;  // 1/sqrt(128)
    __syncthreads();
  }
  const int e = ue8m0_exponent(block_max(fabsf(v[i]), sh));
  codes[i] = float_to_e4m3(v[i] / ldexpf(1.f, e));
  if (i == 0) *scale_out = ldexpf(1.f, e);
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
  long long slot = m.slots[t];
  if (slot < 0 && d.padded_write) slot = 0;
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

/// fused_q, MLA part: qR = S(rope(q's rope part)) for every head: the dr values of (token t,
/// head h) at src + (t H + h) src_stride + src_off go rotated to dst + (t H + h) dst_stride +
/// dst_off (in place allowed). Pair w = h dr / 2 + i of token t.
template <class S>
__device__ __forceinline__ void q_rope_pair(const Dims& d, const Meta& m, int t, int w,
                                            const S* src, int src_stride, int src_off, S* dst,
                                            int dst_stride, int dst_off) {
  const int p = m.positions[t], half = d.dr / 2;
  if (w >= d.H * half) return;
  const int h = w / half, i = w % half;
  const long long th = static_cast<long long>(t) * d.H + h;
  const S* from = src + th * src_stride + src_off;
  float a = ld(from[2 * i]), b = ld(from[2 * i + 1]);
  const long long r = static_cast<long long>(p) * half + i;
  rope_pair(a, b, m.rope_cos[r], m.rope_sin[r]);
  S* to = dst + th * dst_stride + dst_off;
  to[2 * i] = st<S>(a);
  to[2 * i + 1] = st<S>(b);
}

/// fused_q, indexer part (F layers), head h of token t: rotate and quantize qI; omega = w *
/// qscale * dI^-1/2 * HI^-1/2. A block of 128 threads; `v` 128 and `sh` 32 floats of shared
/// memory.
template <class S>
__device__ __forceinline__ void index_q_head(const Dims& d, const Meta& m, int t, int h,
                                             const S* qI, const S* kw, std::uint8_t* q8,
                                             float* qscale, float* omega, float* v, float* sh) {
  const int i = threadIdx.x;
  const long long row = static_cast<long long>(t) * d.HI + h;
  v[i] = ld(qI[row * 128 + i]);
  rotate_quantize(d, m, v, sh, m.positions[t], q8 + row * 128, qscale + row);
  __syncthreads();
  if (i == 0)
    omega[row] =
        ld(kw[static_cast<long long>(t) * (d.dI + d.HI) + d.dI + h]) * qscale[row] * d.head_norm;
}

/// fused_q: grid (T, q_rope_blocks(d) + (F layer ? HI : 0)) as one launch, kFusedQThreads
/// threads; block role y = blockIdx.y + y_off: y < q_rope_blocks(d) rotates qR (a thread per
/// (head, pair)), the others quantize indexer head y - q_rope_blocks(d). The parts touch
/// disjoint data, so they may also run as two launches (y_off 0 with q_rope_blocks(d) rows of
/// blocks, and y_off q_rope_blocks(d) with HI), on two streams.
constexpr int kFusedQThreads = 128;  // index_q_head's vector: a thread per dimension
__host__ __device__ inline int q_rope_blocks(const Dims& d) {
  return (d.H * (d.dr / 2) + kFusedQThreads - 1) / kFusedQThreads;
}
template <class S>
__global__ void __launch_bounds__(kFusedQThreads)
    fused_q(Dims d, Meta m, const S* q, int q_stride, int q_off, S* qpack, int qpack_stride,
            int qpack_off, const S* qI, const S* kw, std::uint8_t* q8, float* qscale, float* omega,
            int y_off) {
  stream_order();
  __shared__ float v[128];
  __shared__ float sh[32];
  const int t = blockIdx.x, y = blockIdx.y + y_off, nrope = q_rope_blocks(d);
  if (y < nrope)
    q_rope_pair(d, m, t, y * kFusedQThreads + threadIdx.x, q, q_stride, q_off, qpack, qpack_stride,
                qpack_off);
  else
    index_q_head(d, m, t, y - nrope, qI, kw, q8, qscale, omega, v, sh);
}

/// q_rope alone (mutant double-rope: the rotation again, in place). Grid (T, q_rope_blocks(d)),
/// kFusedQThreads threads.
template <class S>
__global__ void __launch_bounds__(kFusedQThreads)
    q_rope(Dims d, Meta m, const S* src, int src_stride, int src_off, S* dst, int dst_stride,
           int dst_off) {
  stream_order();
  q_rope_pair(d, m, blockIdx.x, blockIdx.y * kFusedQThreads + threadIdx.x, src, src_stride, src_off,
              dst, dst_stride, dst_off);
}

__device__ __forceinline__ long long slot_of(const Dims& d, const Meta& m, int r, int pos) {
  return static_cast<long long>(m.block_table[r * d.max_blocks + pos / d.B]) * d.B + pos % d.B;
}

/// indexer_topk, scores: I(t, j) = kscale_j sum_h omega_h relu(q8_h . k8_j), j <= p(t), in
/// fp32 with a fixed summation order: each dot sequential over the 128 dims; the heads in
/// kIdxGroups groups (group g: heads g, g + kIdxGroups, ...), each group's sum sequential, then
/// the groups' sums in order. Two kernels compute exactly that, so a score does not depend on
/// which ran: index_scores_grouped for few blocks (a thread per (key, group)) and
/// index_scores_keys once the keys alone fill the SMs (a thread per key, its codes in
/// registers). A thread keeps kIdxChunk of a group's dots in flight at once (the order of each
/// dot and of the group's sum is unchanged): the token's q codes are staged in shared memory as
/// floats, laid out so that one dimension i of a chunk's heads is kIdxChunk consecutive floats
/// (two 16-byte broadcast loads feed kIdxChunk FMAs).
constexpr int kIdxGroups = 8;
constexpr int kIdxChunk = 8;  // heads of one group whose dots run together
constexpr int kIdxThreads = 32 * kIdxGroups;
constexpr int kIdxKeyThreads = 128;
constexpr int kIdxBlockKeys = 64;  // keys of an index_scores_grouped block: two a thread

/// Chunks per group: ceil(ceil(HI / kIdxGroups) / kIdxChunk).
__host__ __device__ inline int index_chunks(const Dims& d) {
  const int per_group = (d.HI + kIdxGroups - 1) / kIdxGroups;
  return (per_group + kIdxChunk - 1) / kIdxChunk;
}
__host__ __device__ inline int index_q_floats(const Dims& d) {
  return kIdxGroups * index_chunks(d) * 128 * kIdxChunk;
}
__host__ __device__ inline std::size_t index_scores_smem(const Dims& d) {
  return sizeof(float) * (static_cast<std::size_t>(index_q_floats(d)) + d.HI +
                          kIdxBlockKeys * (129 + kIdxGroups + 1));
}

/// Staged word w of a token's query codes (stage_index_q's order): head u of its chunk of
/// kIdxChunk heads, word wl (4 codes) of the head's 32, chunk group gc.
struct IndexQWord {
  int u, wl, gc;
};
__device__ __forceinline__ IndexQWord index_q_word(int w) {
  return {w % kIdxChunk, (w / kIdxChunk) % 32, w / (kIdxChunk * 32)};
}

/// Stages the token's q8 codes (as floats; 0 for the padding heads h >= HI) and omegas in
/// shared memory: q of head h = g + kIdxGroups (c kIdxChunk + u), dimension i at
/// ((g C + c) 128 + i) kIdxChunk + u, C = index_chunks(d); then the HI omegas. Work item w
/// reads one 4-byte word (dimensions 4 wl .. 4 wl + 3) of head u of chunk (g, c) = w / 256, a
/// thread's words loaded together, then stored: the 32 lanes of a warp cover 8 heads x 4 words,
/// and each lane writes its four values in an order rotated by wl, so that a warp's 32 stores
/// hit 32 different banks (in plain order all 32 lanes hit one bank: a block spent longer
/// staging q than computing the scores).
__device__ __forceinline__ void stage_index_q(const Dims& d, int t, const std::uint8_t* q8,
                                              const float* omega, float* sq) {
  const int n = index_q_floats(d), C = index_chunks(d);
  const unsigned int* src =
      reinterpret_cast<const unsigned int*>(q8 + static_cast<long long>(t) * d.HI * 128);
  constexpr int kBatch = 8;  // words loaded together (HI = 64: a thread's whole share at once)
  for (int w0 = threadIdx.x; w0 < n / 4; w0 += kBatch * blockDim.x) {
    unsigned int word[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int w = w0 + b * blockDim.x;
      const IndexQWord p = index_q_word(w);
      const int h = p.gc / C + kIdxGroups * ((p.gc % C) * kIdxChunk + p.u);
      word[b] = w < n / 4 && h < d.HI ? src[h * 32 + p.wl] : 0u;  // code 0 is +0
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int w = w0 + b * blockDim.x;
      if (w >= n / 4) break;
      const IndexQWord p = index_q_word(w);
      float* dst = sq + (p.gc * 128 + 4 * p.wl) * kIdxChunk + p.u;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int q = (r + p.wl) & 3;
        dst[q * kIdxChunk] = e4m3_to_float(static_cast<std::uint8_t>(word[b] >> (8 * q)));
      }
    }
  }
  for (int w = threadIdx.x; w < d.HI; w += blockDim.x)
    sq[n + w] = omega[static_cast<long long>(t) * d.HI + w];
}

/// The 128 codes of a key as floats, 16 codes (one 16-byte load) at a time.
__device__ __forceinline__ void decode16(const std::uint8_t* codes, float* out) {
  const uint4 w = *reinterpret_cast<const uint4*>(codes);
  const unsigned int words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int q = 0; q < 16; ++q)
    out[q] = e4m3_to_float(static_cast<std::uint8_t>(words[q / 4] >> (8 * (q % 4))));
}

/// Group g's sums over its heads for NK keys whose 128 code values `key(kk, i)` returns: chunk
/// by chunk, kIdxChunk dots per key at once (the query's two 16-byte loads of a dimension serve
/// all NK keys), each sequential over i; then acc = fma(omega_h, relu(dot_h), acc) in ascending
/// head order. kUnroll: 128 where the key is in registers (indexed statically).
template <int NK, int kUnroll, class Key>
__device__ __forceinline__ void index_group_sums(const Dims& d, const float* sq, int g, Key key,
                                                 float (&acc)[NK]) {
  const int C = index_chunks(d);
  const float* om = sq + index_q_floats(d);
#pragma unroll
  for (int kk = 0; kk < NK; ++kk) acc[kk] = 0.f;
  for (int c = 0; c < C; ++c) {
    const float4* qc = reinterpret_cast<const float4*>(sq + (g * C + c) * 128 * kIdxChunk);
    float dot[NK][kIdxChunk];
#pragma unroll
    for (int kk = 0; kk < NK; ++kk)
#pragma unroll
      for (int u = 0; u < kIdxChunk; ++u) dot[kk][u] = 0.f;
#pragma unroll kUnroll
    for (int i = 0; i < 128; ++i) {
      const float4 a = qc[2 * i], b = qc[2 * i + 1];
#pragma unroll
      for (int kk = 0; kk < NK; ++kk) {
        const float kv = key(kk, i);
        dot[kk][0] = fmaf(a.x, kv, dot[kk][0]);
        dot[kk][1] = fmaf(a.y, kv, dot[kk][1]);
        dot[kk][2] = fmaf(a.z, kv, dot[kk][2]);
        dot[kk][3] = fmaf(a.w, kv, dot[kk][3]);
        dot[kk][4] = fmaf(b.x, kv, dot[kk][4]);
        dot[kk][5] = fmaf(b.y, kv, dot[kk][5]);
        dot[kk][6] = fmaf(b.z, kv, dot[kk][6]);
        dot[kk][7] = fmaf(b.w, kv, dot[kk][7]);
      }
    }
#pragma unroll
    for (int u = 0; u < kIdxChunk; ++u) {
      const int h = g + kIdxGroups * (c * kIdxChunk + u);
#pragma unroll
      for (int kk = 0; kk < NK; ++kk)
        if (h < d.HI) acc[kk] = fmaf(om[h], fmaxf(dot[kk][u], 0.f), acc[kk]);
    }
  }
}
static_assert(kIdxChunk == 8, "index_group_sums unrolls two float4 per dimension");

/// kIdxBlockKeys keys of one token a block; thread (lane, group g) = (tid % 32, tid / 32) sums
/// group g for keys lane and lane + 32 (two keys a thread: each query load serves two dots, and
/// shared-memory reads, not FMAs, bounded this kernel); key codes staged in shared memory (rows
/// padded to 129 floats: no bank conflicts), their scales read with them. Grid (T_a, ceil(len /
/// kIdxBlockKeys)), 256 threads.
__global__ void __launch_bounds__(kIdxThreads)
    index_scores_grouped(Dims d, Meta m, const std::uint8_t* q8, const float* omega,
                         IndexCache cache, float* scores, int ld_scores) {
  stream_order();
  extern __shared__ float4 smem4[];
  constexpr int NB = kIdxBlockKeys;
  float* sq = reinterpret_cast<float*>(smem4);  // q codes, then HI omegas
  float* keys = sq + index_q_floats(d) + d.HI;  // NB x 129
  float* part = keys + NB * 129;                // kIdxGroups x NB
  float* kscale = part + kIdxGroups * NB;       // NB
  const int t = blockIdx.x, j0 = blockIdx.y * NB, tid = threadIdx.x;
  const int p = m.positions[t], r = m.request_of_token[t];
  stage_index_q(d, t, q8, omega, sq);
  for (int w = tid; w < NB * 8; w += blockDim.x) {  // a 16-code piece of a key each
    const int kk = w / 8, piece = w % 8, j = j0 + kk;
    float v[16];
    if (j <= p) {
      const long long slot = slot_of(d, m, r, j);
      decode16(cache.codes + slot * 128 + piece * 16, v);
      if (piece == 0) kscale[kk] = cache.scales[slot];
    } else {
      for (int q = 0; q < 16; ++q) v[q] = 0.f;
    }
    for (int q = 0; q < 16; ++q) keys[kk * 129 + piece * 16 + q] = v[q];
  }
  __syncthreads();
  const int lane = tid % 32, g = tid / 32;
  float sums[2];
  index_group_sums<2, 4>(
      d, sq, g, [&](int kk, int i) { return keys[(lane + 32 * kk) * 129 + i]; }, sums);
  part[g * NB + lane] = sums[0];
  part[g * NB + lane + 32] = sums[1];
  __syncthreads();
  const int j = j0 + tid;
  if (tid < NB && j <= p) {
    float total = 0.f;
    for (int gg = 0; gg < kIdxGroups; ++gg) total += part[gg * NB + tid];
    scores[static_cast<long long>(t) * ld_scores + j] = kscale[tid] * total;
  }
}

/// A thread per key, its 128 codes in registers, the groups' sums in registers. Grid (T_a,
/// ceil(len / 128)), 128 threads.
__global__ void __launch_bounds__(kIdxKeyThreads)
    index_scores_keys(Dims d, Meta m, const std::uint8_t* q8, const float* omega, IndexCache cache,
                      float* scores, int ld_scores) {
  stream_order();
  extern __shared__ float4 smem4[];
  float* sq = reinterpret_cast<float*>(smem4);  // q codes, then HI omegas
  const int t = blockIdx.x;
  stage_index_q(d, t, q8, omega, sq);
  __syncthreads();
  const int j = blockIdx.y * blockDim.x + threadIdx.x, p = m.positions[t];
  if (j > p) return;
  const long long s = slot_of(d, m, m.request_of_token[t], j);
  float kv[128];
#pragma unroll
  for (int v = 0; v < 8; ++v) decode16(cache.codes + s * 128 + 16 * v, kv + 16 * v);
  float total = 0.f;
#pragma unroll 1
  for (int g = 0; g < kIdxGroups; ++g) {
    float sum[1];
    index_group_sums<1, 128>(
        d, sq, g, [&](int, int i) { return kv[i]; }, sum);
    total += sum[0];
  }
  scores[static_cast<long long>(t) * ld_scores + j] = cache.scales[s] * total;
}

/// indexer_topk, scores on tensor cores: the same I(t, j) = kscale_j sum_h omega_h relu(q8_h .
/// k8_j) with the dots as one product Q (heads x 128) K^T (128 x keys) through mma.sync in f16
/// with fp32 accumulation (e4m3 values are exact in f16 and their products in fp32; the fp32
/// sums are in the tensor cores' order, within the gamma_n bound that top-k judging allows:
/// GpuNumerics.IndexScoresWithinTheirAccumulationBound), then omega_h relu(.) summed over a
/// warp's 16 heads in a fixed shuffle tree and over the head tiles in order. A block takes
/// kIdxMmaKeys keys of one token: the token's q codes and the keys' codes are staged in shared
/// memory as f16 (rows padded by 8: conflict-free fragment loads); warp w takes head tile w % 4
/// and keys 32 (w / 4) .. + 32. A block takes `per_block` consecutive tokens in turn, staging
/// the keys once per request among them (a prefill chunk's tokens share the keys); a score's
/// arithmetic does not depend on which block computed it. HI <= kIdxMmaHeads, dI = 128
/// (index_mma_fits). Grid (ceil(T_a / per_block), ceil(len / kIdxMmaKeys)), kIdxMmaThreads
/// threads.
constexpr int kIdxMmaThreads = 256;
constexpr int kIdxMmaKeys = 64;
constexpr int kIdxMmaHeads = 64;
constexpr int kIdxMmaRow = 128 + 8;  // f16 per staged row

/// Tokens per index_scores_mma block for T_a rows: 8 at prefill sizes (T = 512: indexer_topk
/// 592 -> 508 us on the H200; 16 gave 506), else 1 (at T = 8 and 64, 4 and 8 were slower).
inline int index_mma_tokens(int rows) {
  return rows >= 256 ? 8 : 1;
}

__host__ __device__ inline bool index_mma_fits(const Dims& d) {
  return d.HI >= 1 && d.HI <= kIdxMmaHeads && d.dI == 128;
}

/// 16 e4m3 codes (one 16-byte load) as 16 f16 values at dst (32 bytes, 16-byte aligned).
__device__ __forceinline__ void e4m3x16_to_f16(const uint4& w, __half* dst) {
  const unsigned int words[4] = {w.x, w.y, w.z, w.w};
  unsigned int h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2_raw v = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    h[i] = static_cast<unsigned int>(v.x) | (static_cast<unsigned int>(v.y) << 16);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(h[0], h[1], h[2], h[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kIdxMmaThreads)
    index_scores_mma(Dims d, Meta m, const std::uint8_t* q8, const float* omega, IndexCache cache,
                     float* scores, int ld_scores, int rows, int per_block, bool early) {
  __shared__ __align__(16) __half qh[kIdxMmaHeads * kIdxMmaRow];
  __shared__ __align__(16) __half kh[kIdxMmaKeys * kIdxMmaRow];
  __shared__ float om[kIdxMmaHeads], ksc[kIdxMmaKeys], part[kIdxMmaHeads / 16][kIdxMmaKeys];
  const int t0 = blockIdx.x * per_block, t1 = min(rows, t0 + per_block);
  const int j0 = blockIdx.y * kIdxMmaKeys, tid = threadIdx.x, HT = (d.HI + 15) / 16;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  // Stages request r's keys for token t: up to the last position any of the block's tokens of
  // r reaches (a key past a token's position is staged but its score is not written).
  const auto stage = [&](int t, int r, int p) {
    int last = p;
    for (int u = t + 1; u < t1; ++u)
      if (m.request_of_token[u] == r) last = max(last, m.positions[u]);
    __syncthreads();  // the previous token's products are done with kh
    for (int i = tid; i < kIdxMmaKeys * 8; i += blockDim.x) {  // a 16-code piece of a key
      const int kk = i / 8, piece = i % 8, j = j0 + kk;
      uint4 w = zero;
      if (j <= last) {
        const long long slot = slot_of(d, m, r, j);
        w = __ldg(reinterpret_cast<const uint4*>(cache.codes + slot * 128) + piece);
        if (piece == 0) ksc[kk] = cache.scales[slot];
      }
      e4m3x16_to_f16(w, kh + kk * kIdxMmaRow + piece * 16);
    }
  };
  int staged = -1;  // the request whose keys are in kh
  // The first token's keys before the wait: the index cache and the step's metadata are
  // written before the indexer's chain starts (norm_rope_cache, the fork's event or, on one
  // stream, two launches back: a resident block's predecessor has passed its own wait, so the
  // one before that has completed), so only q8 and omega need the wait.
  if (early && t0 < t1 && j0 <= m.positions[t0]) {
    staged = m.request_of_token[t0];
    stage(t0, staged, m.positions[t0]);
  }
  stream_order();
  for (int t = t0; t < t1; ++t) {
    const int p = m.positions[t], r = m.request_of_token[t];
    if (j0 > p) continue;  // the same in every thread
    if (r != staged) {
      stage(t, r, p);
      staged = r;
    }
    for (int i = tid; i < HT * 16 * 8; i += blockDim.x) {  // a 16-code piece of a head's q
      const int h = i / 8, piece = i % 8;
      const auto* row =
          reinterpret_cast<const uint4*>(q8 + (static_cast<long long>(t) * d.HI + h) * 128);
      const uint4 w = h < d.HI ? __ldg(row + piece) : zero;
      e4m3x16_to_f16(w, qh + h * kIdxMmaRow + piece * 16);
    }
    for (int h = tid; h < HT * 16; h += blockDim.x)
      om[h] = h < d.HI ? omega[static_cast<long long>(t) * d.HI + h] : 0.f;
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
    const int ht = warp % 4, kq = warp / 4;
    if (ht < HT) {
      float acc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
      const __half* qa = qh + (ht * 16 + g) * kIdxMmaRow + q * 2;
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const __half* pa = qa + ks * 16;
        const unsigned a[4] = {*reinterpret_cast<const unsigned*>(pa),
                               *reinterpret_cast<const unsigned*>(pa + 8 * kIdxMmaRow),
                               *reinterpret_cast<const unsigned*>(pa + 8),
                               *reinterpret_cast<const unsigned*>(pa + 8 * kIdxMmaRow + 8)};
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const __half* pb = kh + (kq * 32 + nt * 8 + g) * kIdxMmaRow + ks * 16 + q * 2;
          mma_f16(acc[nt], a, *reinterpret_cast<const unsigned*>(pb),
                  *reinterpret_cast<const unsigned*>(pb + 8));
        }
      }
      // Lane (g, q) holds heads ht 16 + g and + 8 for keys 2q, 2q + 1 of each 8-key tile.
      const float oa = om[ht * 16 + g], ob = om[ht * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = fmaf(ob, fmaxf(acc[nt][2 + e], 0.f), oa * fmaxf(acc[nt][e], 0.f));
          for (int o = 4; o < 32; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          if (g == 0) part[ht][kq * 32 + nt * 8 + q * 2 + e] = v;
        }
    }
    __syncthreads();  // part is complete; qh and om are free for the next token
    const int j = j0 + tid;
    if (tid < kIdxMmaKeys && j <= p) {
      float total = part[0][tid];
      for (int h = 1; h < HT; ++h) total += part[h][tid];
      scores[static_cast<long long>(t) * ld_scores + j] = ksc[tid] * total;
    }
  }
}

/// Busy-waits `cycles` clock cycles (mutant unjoined-stream: a slow backend on the main stream).
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

/// Inclusive prefix sum over the lanes of a warp (a fixed shuffle sequence).
__device__ __forceinline__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x % 32;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Total order on (score, position): larger score first, then smaller position; unique keys.
/// The score's bits as an unsigned integer in that order sit in the upper half (-0 below +0;
/// NaN beyond the infinities, by its bits).
__device__ __forceinline__ unsigned long long topk_key(float score, int j) {
  unsigned int b = __float_as_uint(score);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(b) << 32) | (0xFFFFFFFFu - static_cast<unsigned int>(j));
}

/// The score a key was made from (topk_key's inverse on its upper half).
__device__ __forceinline__ float topk_score(unsigned long long key) {
  const unsigned int b = static_cast<unsigned int>(key >> 32);
  return __uint_as_float((b & 0x80000000u) ? (b & 0x7FFFFFFFu) : ~b);
}

/// indexer_topk, selection: rows [0, T_a) of the shared buffer. All of 0..p in order when
/// p + 1 <= K, else the K best keys of (score, position) (topk_key's order), written in
/// ascending position order. One block per token; the set is the same as a full 8-pass radix
/// select's, whichever path below finds it.
///
/// Warp w owns the positions [w 32 per, (w + 1) 32 per), per = ceil(n / kTopkThreads), lane l
/// of it w 32 per + 32 r + l for r = 0 .. per - 1 (loads coalesced). One SM runs all of it, so
/// its instructions and barriers are its time.
///
/// kBins (the default; DSV32_TOPK_BINS=0 selects the radix select alone): a first pass puts
/// each score in one of kTopkBins equal-width bins over [min, max] of the row (topk_bin: a
/// rounded difference, a rounded product, a truncation and a clamp, each non-decreasing, so a
/// higher bin never holds a lower key); a scan of the bins from the top finds the bin holding
/// the K-th best key. With continuous scores that bin holds a few keys (about 10 of 8193 for
/// the benchmark's index scores), which are ranked against each other in shared memory: one
/// pass over the row for the bounds, one for the bins, one to place the chosen positions.
/// Rows of up to kTopkFast keys a thread take a short path with their bins in registers; longer
/// rows do the same through `each`. A row with a non-finite score or one value skips the bins;
/// a threshold bin with more than kTopkResolve keys (heavy ties, an outlier stretching the
/// range) is resolved by the radix passes restricted to that bin.
///
/// The radix passes count the 8-bit digits of the keys that match the prefix so far: where a
/// warp's 32 digits agree (a row's scores mostly share their leading digits) one lane adds 32,
/// else each lane adds 1 (integer counts: the sum does not depend on atomic order). After each
/// pass the digit's bucket is found by warp 0 (a lane per 8 digits, a shuffle scan over lanes);
/// once the whole bucket is needed (its count is what is left of K) every key with the prefix
/// is taken and the passes stop (without bins); once it holds at most kTopkResolve keys they
/// are ranked against each other and the K-th best is found directly. The chosen keys are
/// placed by a scan over the warps' counts and ballots within each warp, in position order.
constexpr int kTopkThreads = 1024;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkRegs = 16;      // keys held in registers by the radix select alone
constexpr int kTopkResolve = 128;  // a bucket this small is resolved by rank, not more passes
constexpr int kTopkBins = 2 * kTopkThreads;  // two a thread in the scan
constexpr int kTopkFast = 16;                // keys a thread on the short path (topk_short)
static_assert(kTopkWarps == 32, "the per-warp scans read one warp's entry a lane");
static_assert(kTopkBins < 0xFFFF, "two bins to a register");

/// The bin of score v of a row whose smallest score is lo (scale = kTopkBins / (max - lo)).
__device__ __forceinline__ int topk_bin(float v, float lo, float scale) {
  return min(kTopkBins - 1, __float2int_rz(__fmul_rn(__fsub_rn(v, lo), scale)));
}

/// The k_left-th best of cand[0, count) (count <= kTopkResolve, filled and visible, `above`
/// zeroed), by rank against each other: keys are unique, so ranks are, and neither depends on
/// the candidates' slots (atomic order). Each of the block's thread groups counts the keys
/// above a candidate among its share of the others; integer sums, so the order of the adds
/// does not matter. Every thread gets the key.
__device__ __forceinline__ unsigned long long topk_kth(const unsigned long long* cand, int* above,
                                                       int count, int k_left,
                                                       unsigned long long* kth) {
  constexpr int kShare = kTopkResolve * kTopkResolve / kTopkThreads;
  const int i = threadIdx.x % kTopkResolve, c0 = threadIdx.x / kTopkResolve * kShare;
  if (i < count && c0 < count) {
    const unsigned long long mine = cand[i];
    int a = 0;
#pragma unroll 4
    for (int c = c0; c < min(count, c0 + kShare); ++c) a += cand[c] > mine;
    if (a > 0) atomicAdd(&above[i], a);
  }
  __syncthreads();
  if (threadIdx.x < count && above[threadIdx.x] == k_left - 1) *kth = cand[threadIdx.x];
  __syncthreads();
  return *kth;
}

/// The shared state of topk_select's bins.
struct TopkBinsShared {
  unsigned int hist[kTopkBins];
  int warp_at[kTopkWarps];
  float warp_lo[kTopkWarps], warp_hi[kTopkWarps];
  int bin, k_left, count;
};

/// The row's bounds from each thread's (lo, hi, bad), reduced over the block (every warp
/// reduces the 32 warps' bounds itself, in the same order: the same values in every thread);
/// zeroes the bins on the way. False where the row has a non-finite score or one value.
__device__ __forceinline__ bool topk_bounds(TopkBinsShared& sh, float l, float h, bool bad,
                                            float& lo, float& scale) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  l = -warp_max(-l);
  h = warp_max(h);
  if (lane == 0) {
    sh.warp_lo[warp] = l;
    sh.warp_hi[warp] = h;
  }
  for (int b = threadIdx.x; b < kTopkBins; b += blockDim.x) sh.hist[b] = 0;
  bad = __syncthreads_or(bad);
  lo = -warp_max(-sh.warp_lo[lane]);
  const float range = __fsub_rn(warp_max(sh.warp_hi[lane]), lo);
  scale = __fdiv_rn(static_cast<float>(kTopkBins), range);
  return !bad && range > 0.f && isfinite(range) && isfinite(scale);
}

/// After the bins are counted (sh.hist complete, not yet synchronized): the bin of the K-th
/// best key, how many of its keys are taken (k_left) and how many it holds, in every thread.
/// Thread i holds bins kTopkBins - 1 - 2i and the one below; the threads before it, every
/// higher bin (a scan within the warp, then over the warps' totals, redone by each warp).
__device__ __forceinline__ void topk_threshold(TopkBinsShared& sh, int K, int& bin, int& k_left,
                                               int& count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  const int b0 = kTopkBins - 1 - 2 * static_cast<int>(threadIdx.x);
  const int c0 = static_cast<int>(sh.hist[b0]), c1 = static_cast<int>(sh.hist[b0 - 1]);
  const int incl = warp_inclusive_scan(c0 + c1);
  if (lane == 31) sh.warp_at[warp] = incl;
  __syncthreads();
  const int wt = sh.warp_at[lane], wincl = warp_inclusive_scan(wt);
  const int acc = __shfl_sync(0xffffffffu, wincl - wt, warp) + incl - (c0 + c1);
  if (acc < K && acc + c0 + c1 >= K) {  // one thread: n > K keys in all
    const bool upper = acc + c0 >= K;
    sh.count = upper ? c0 : c1;
    sh.k_left = upper ? K - acc : K - acc - c0;
    sh.bin = upper ? b0 : b0 - 1;
  }
  __syncthreads();
  bin = sh.bin;
  k_left = sh.k_left;
  count = sh.count;
}

/// topk_select's short path for a row of n > K keys, at most P a thread: warp w owns the
/// positions [w 32 P, (w + 1) 32 P), lane l of it w 32 P + 32 r + l for r < P. Everything per
/// key is unrolled and branch-free where it can be: a position past the row reads the row's last
/// score (the bounds do not move) and counts nowhere. The bins stay in registers (16 bits each,
/// plus one; 0 past the row), the scores are read again for the bins (L1) and for the few keys
/// of the threshold bin. True when it wrote the row; false (the same in every thread) when the
/// row needs the general select: a non-finite score, one value, or more than kTopkResolve keys
/// in the threshold bin.
template <int P>
__device__ __noinline__ bool topk_short(int n, int K, const float* sc, int* out,
                                        TopkBinsShared& bsh, int* warp_at, unsigned long long* cand,
                                        int* above, int* ncand, unsigned long long* kth_sh) {
  static_assert(P % 2 == 0, "two bins to a register");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j0 = warp * 32 * P + lane;
  float l = INFINITY, h = -INFINITY, lo, scale;
  bool bad = false;
#pragma unroll
  for (int r = 0; r < P; ++r) {
    const float v = sc[min(j0 + 32 * r, n - 1)];
    l = fminf(l, v);
    h = fmaxf(h, v);
    bad |= !isfinite(v);
  }
  if (threadIdx.x < kTopkResolve) above[threadIdx.x] = 0;
  if (threadIdx.x == 0) *ncand = 0;
  if (!topk_bounds(bsh, l, h, bad, lo, scale)) return false;
  unsigned int packed[P / 2];
#pragma unroll
  for (int r = 0; r < P; r += 2) {
    unsigned int pk = 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = j0 + 32 * (r + e);
      const int b = topk_bin(sc[min(j, n - 1)], lo, scale);
      if (j < n) {
        atomicAdd(&bsh.hist[b], 1u);
        pk |= static_cast<unsigned int>(b + 1) << (16 * e);
      }
    }
    packed[r / 2] = pk;
  }
  const auto bins = [&](int r) {
    return static_cast<int>((packed[r / 2] >> (16 * (r % 2))) & 0xFFFFu) - 1;
  };
  int bin, k_left, count;
  topk_threshold(bsh, K, bin, k_left, count);
  if (count > kTopkResolve) return false;
#pragma unroll
  for (int r = 0; r < P; ++r)
    if (bins(r) == bin) {
      const int j = j0 + 32 * r;
      cand[atomicAdd(ncand, 1)] = topk_key(sc[j], j);
    }
  __syncthreads();
  const unsigned long long kth = topk_kth(cand, above, count, k_left, kth_sh);
  // Keys of higher bins, and those of the threshold bin >= the K-th best: r by r, a ballot a
  // warp; the warps' counts scanned by every warp for itself.
  const auto take = [&](int r) {  // recomputed where needed: registers
    const int j = j0 + 32 * r, b = bins(r);
    bool in = b > bin;
    if (b == bin) in = topk_key(sc[j], j) >= kth;
    return __ballot_sync(0xffffffffu, in);
  };
  int mine = 0;
#pragma unroll
  for (int r = 0; r < P; ++r) mine += __popc(take(r));
  if (lane == 0) warp_at[warp] = mine;
  __syncthreads();
  const int wm = warp_at[lane];
  int at = __shfl_sync(0xffffffffu, warp_inclusive_scan(wm) - wm, warp);
  const unsigned int below = (1u << lane) - 1u;
#pragma unroll
  for (int r = 0; r < P; ++r) {
    const unsigned int tk = take(r);
    if ((tk >> lane) & 1u) out[at + __popc(tk & below)] = j0 + 32 * r;
    at += __popc(tk);
  }
  return true;  // K keys taken: n > K distinct keys, so the K-th best exists
}

template <bool kBins>
__global__ void __launch_bounds__(kTopkThreads)
    topk_select(Dims d, Meta m, const float* scores, int ld_scores, int* topk) {
  stream_order();
  __shared__ TopkBinsShared bsh;
  __shared__ int warp_at[kTopkWarps + 1];
  __shared__ unsigned long long prefix_sh, cand[kTopkResolve];
  __shared__ int above[kTopkResolve];
  __shared__ int k_left_sh, done_sh, count_sh, ncand;
  const int t = blockIdx.x, n = m.positions[t] + 1, K = d.K, lane = threadIdx.x % 32,
            warp = threadIdx.x / 32;
  int* out = topk + static_cast<long long>(t) * K;
  const float* sc = scores + static_cast<long long>(t) * ld_scores;
  if (n <= K) {  // entries n.. keep the -1 that norm_rope_cache cleared them to
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = j;
    return;
  }
  const int per = (n + blockDim.x - 1) / blockDim.x;  // the same in every thread
  const int j0 = warp * 32 * per + lane;              // position of r = 0; r adds 32
  const unsigned int below = (1u << lane) - 1u;
  if constexpr (kBins) {
    // The short path (topk_short): rows of up to kTopkFast keys a thread. Rows it cannot
    // finish (a non-finite score, one value, a crowded threshold bin) go on to the general
    // select below.
    if (per <= kTopkFast) {
      bool done = false;
      if (per <= 4)
        done = topk_short<4>(n, K, sc, out, bsh, warp_at, cand, above, &ncand, &prefix_sh);
      else if (per <= 8)
        done = topk_short<8>(n, K, sc, out, bsh, warp_at, cand, above, &ncand, &prefix_sh);
      else if (per <= 10)
        done = topk_short<10>(n, K, sc, out, bsh, warp_at, cand, above, &ncand, &prefix_sh);
      else if (per <= 12)
        done = topk_short<12>(n, K, sc, out, bsh, warp_at, cand, above, &ncand, &prefix_sh);
      else
        done = topk_short<16>(n, K, sc, out, bsh, warp_at, cand, above, &ncand, &prefix_sh);
      if (done) return;  // the same in every thread
      __syncthreads();   // the short path's shared values are read before the select reuses them
    }
  }
  constexpr int kRegs = kBins ? 8 : kTopkRegs;
  unsigned long long kr[kRegs];
#pragma unroll
  for (int r = 0; r < kRegs; ++r) {
    const int j = j0 + 32 * r;
    kr[r] = r < per && j < n ? topk_key(sc[j], j) : 0ull;
  }
  // f(j, key, valid) for the thread's positions j = j0 + 32 r, r = 0 .. per - 1 in order (the
  // same count in every thread, so whole warps meet in the votes); the first kRegs keys from
  // registers.
  const auto each = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < kRegs; ++r)
      if (r < per) f(j0 + 32 * r, kr[r], j0 + 32 * r < n);
    for (int r = kRegs; r < per; ++r) {
      const int j = j0 + 32 * r;
      const bool valid = j < n;
      f(j, valid ? topk_key(sc[j], j) : 0ull, valid);
    }
  };
  // The k_left-th best of the `count` keys for which in(key) holds (topk_kth).
  const auto resolve = [&](auto&& in, int count, int k_left) {
    if (threadIdx.x == 0) ncand = 0;
    if (threadIdx.x < kTopkResolve) above[threadIdx.x] = 0;
    __syncthreads();
    each([&](int, unsigned long long kk, bool valid) {
      if (valid && in(kk)) cand[atomicAdd(&ncand, 1)] = kk;
    });
    __syncthreads();
    return topk_kth(cand, above, count, k_left, &prefix_sh);
  };
  unsigned long long prefix = 0, mask = 0;
  int k_left = K;
  bool found = false;  // prefix is the K-th best key itself
  int bin = -1;        // with bins, the bin of the K-th best key
  float lo = 0.f, scale = 0.f;
  if constexpr (kBins) {
    float l = INFINITY, h = -INFINITY;
    bool bad = false;
    each([&](int, unsigned long long kk, bool valid) {
      if (valid) {
        const float v = topk_score(kk);
        l = fminf(l, v);
        h = fmaxf(h, v);
        bad |= !isfinite(v);
      }
    });
    if (topk_bounds(bsh, l, h, bad, lo, scale)) {
      each([&](int, unsigned long long kk, bool valid) {
        if (valid) atomicAdd(&bsh.hist[topk_bin(topk_score(kk), lo, scale)], 1u);
      });
      int count;
      topk_threshold(bsh, K, bin, k_left, count);
      if (count <= kTopkResolve) {
        prefix = resolve(
            [&](unsigned long long kk) { return topk_bin(topk_score(kk), lo, scale) == bin; },
            count, k_left);
        found = true;
      }
    }
  }
  // Radix passes (restricted to the threshold bin where one was found).
  const auto in_bin = [&](unsigned long long kk) {
    return !kBins || bin < 0 || topk_bin(topk_score(kk), lo, scale) == bin;
  };
  unsigned int* hist = bsh.hist;  // the first 256 serve as the digits' counts
  for (int shift = 56; shift >= 0 && !found; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    each([&](int, unsigned long long kk, bool valid) {
      constexpr unsigned int kNone = 0xFFFFFFFFu;
      const unsigned int digit = valid && (kk & mask) == prefix && in_bin(kk)
                                     ? static_cast<unsigned int>((kk >> shift) & 0xFF)
                                     : kNone;
      const unsigned int first = __shfl_sync(0xffffffffu, digit, 0);
      if (__all_sync(0xffffffffu, digit == first)) {
        if (lane == 0 && digit != kNone) atomicAdd(&hist[digit], 32u);
      } else if (digit != kNone) {
        atomicAdd(&hist[digit], 1u);
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds digits 255 - 8l down to 248 - 8l; the lanes before it, every higher digit.
      int c[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) sum += c[q] = static_cast<int>(hist[255 - 8 * lane - q]);
      const int incl = warp_inclusive_scan(sum);
      int acc = incl - sum;
      if (acc < k_left && incl >= k_left) {  // the K-th best key's digit is in this lane's range
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          if (acc + c[q] >= k_left) {
            prefix_sh = prefix | (static_cast<unsigned long long>(255 - 8 * lane - q) << shift);
            k_left_sh = k_left - acc;
            done_sh = c[q] == k_left - acc;
            count_sh = c[q];
            break;
          }
          acc += c[q];
        }
      }
    }
    __syncthreads();
    prefix = prefix_sh;
    k_left = k_left_sh;
    mask |= 0xFFull << shift;
    const bool done = done_sh;
    const int count = count_sh;
    // Without bins, a bucket taken whole ends the passes: prefix's lower bits are 0, so every
    // key of the bucket is >= it and every key below it is < it. Within a bin, keys of lower
    // bins may share the prefix: the passes go on until the bucket is small enough to rank.
    if (done && (!kBins || bin < 0)) break;
    if (count <= kTopkResolve) {
      prefix = resolve([&](unsigned long long kk) { return (kk & mask) == prefix && in_bin(kk); },
                       count, k_left);
      break;
    }
  }
  // prefix is the K-th best key (or, after a whole bucket, the least key it could be); every
  // key >= it, in ascending position order: the warps' counts scanned in warp order, then
  // within a warp r by r, lanes in order.
  int mine = 0;
  each([&](int, unsigned long long kk, bool valid) { mine += valid && kk >= prefix; });
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
  if (lane == 0) warp_at[warp] = mine;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int v = lane < kTopkWarps ? warp_at[lane] : 0;
    const int incl = warp_inclusive_scan(v);
    if (lane < kTopkWarps) warp_at[lane] = incl - v;
    if (lane == 31) warp_at[kTopkWarps] = incl;
  }
  __syncthreads();
  int at = warp_at[warp];
  const int total = warp_at[kTopkWarps];
  each([&](int j, unsigned long long kk, bool valid) {
    const bool take = valid && kk >= prefix;
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    if (take) out[at + __popc(ballot & below)] = j;
    at += __popc(ballot);
  });
  for (int j = total + threadIdx.x; j < K; j += blockDim.x) out[j] = -1;
}

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
template <class S>
__global__ void __launch_bounds__(kMqaThreads)
    mqa_gather(Dims d, Meta m, KvCache<S> cache, const int* topk, S* keys, bool vec,
               int* topk_trace) {
  stream_order();
  const int t = blockIdx.x, k = blockIdx.y * kMqaGatherRows + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (k >= d.K) return;
  const int W = d.L + d.dr;
  S* dst = keys + (static_cast<long long>(t) * d.K + k) * W;
  const int j = topk[static_cast<long long>(t) * d.K + k];
  if (lane == 0) topk_trace[static_cast<long long>(t) * d.K + k] = j;  // the layer's sets
  if (j < 0) {
    for (int i = lane; i < W; i += 32) dst[i] = st<S>(0.f);
    return;
  }
  const long long sl = slot_of(d, m, m.request_of_token[t], j);
  if (vec && !d.fp8_kv) {
    constexpr int per = 16 / sizeof(S);
    const uint4* lat = reinterpret_cast<const uint4*>(cache.latent + sl * d.L);
    const uint4* rope = reinterpret_cast<const uint4*>(cache.rope + sl * d.dr);
    uint4* out = reinterpret_cast<uint4*>(dst);
    for (int i = lane; i < d.L / per; i += 32) out[i] = lat[i];
    for (int i = lane; i < d.dr / per; i += 32) out[d.L / per + i] = rope[i];
    return;
  }
  for (int i = lane; i < d.L; i += 32)
    dst[i] = d.fp8_kv ? st<S>(latent_at(d, cache, sl, i)) : cache.latent[sl * d.L + i];
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
    mqa_softmax(Dims d, const int* topk, const float* z, S* p, float* ml) {
  stream_order();
  __shared__ float sh[32];
  const int t = blockIdx.x, h = blockIdx.y;
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
/// copy (the backend's buffer rotates); lse = m + log l. Grid (T_a, H), 128 threads.
template <class S>
__global__ void mqa_finish(Dims d, const float* acc, const float* ml, S* olat, S* olat_trace,
                           float* lse) {
  stream_order();
  const long long th = static_cast<long long>(blockIdx.x) * d.H + blockIdx.y;
  const float l = ml[2 * th + 1];
  for (int c = threadIdx.x; c < d.L; c += blockDim.x) {
    const S v = st<S>(l > 0.f ? acc[th * d.L + c] / l : 0.f);
    olat[th * d.L + c] = v;
    olat_trace[th * d.L + c] = v;
  }
  if (threadIdx.x == 0) lse[th] = l > 0.f ? ml[2 * th] + logf(l) : -INFINITY;
}

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
constexpr int kGemvMaxRows = 4;

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

/// The values of a 16-byte piece of S.
template <class S>
__device__ __forceinline__ void unpack16(const uint4& u, float* out) {
  if constexpr (sizeof(S) == 4) {
    out[0] = __uint_as_float(u.x), out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z), out[3] = __uint_as_float(u.w);
  } else {
    const unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      out[2 * q] = __uint_as_float(words[q] << 16);
      out[2 * q + 1] = __uint_as_float(words[q] & 0xFFFF0000u);
    }
  }
}

/// A weight's 16 bytes, read once a step. `stream`: through the read-only path, not allocated
/// in L1, and evict-first in L2 (an L2 cache policy), so that the step's 400 MB of weights
/// streaming through the 50 MB L2 do not evict what the latency-bound kernels read (the
/// caches' rows, the activations); else plain __ldg. The values are the same either way (the
/// A/B is in docs/PERFORMANCE.md).
__device__ __forceinline__ uint4 ld_weight(const uint4* p, bool stream) {
  if (!stream) return __ldg(p);
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
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
         int n, int k, int ksplit, bool stream) {
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
        wq[u][o] = v < v1 && n0 + o < n ? ld_weight(row + v, stream) : make_uint4(0u, 0u, 0u, 0u);
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

/// uk_absorb at capture sizes up to kGemvMaxRows (R rows): ql[t, h, c] = S(sum_i qN[t, h, i]
/// W_UK[h][i][c]) into qpack's ql part. A block per head; thread (piece p, slice s) owns the
/// 16-byte piece p of W_UK[h]'s rows in slice s of i, sums them in ascending i, and the
/// slices' partial sums are added in slice order: a fixed order, independent of R. The first
/// kUkBatch rows' pieces are read before waiting on the kernel ahead (weights are constant).
/// Needs L / (16 / sizeof(S)) a power of two up to kUkThreads (uk_small_fits). Grid (H),
/// kUkThreads threads, uk_small_smem bytes of dynamic shared memory. 512 threads: at dsv32
/// sizes (bf16, L = 512, dn = 128) a slice is 16 rows, so a head's whole 128 KB is read before
/// the wait, in one round trip (256 threads take two).
constexpr int kUkThreads = 512;
constexpr int kUkBatch = 16;
constexpr std::size_t kUkSmemMax = 160 * 1024;  // opted in per kernel (stack.cu)

template <class S>
__host__ __device__ inline int uk_pieces(const Dims& d) {
  return d.L / static_cast<int>(16 / sizeof(S));
}
template <class S>
inline std::size_t uk_small_smem(const Dims& d, int rows) {
  const int slices = kUkThreads / uk_pieces<S>(d);
  return sizeof(float) * static_cast<std::size_t>(rows) * (d.dn + slices * d.L);
}
template <class S>
inline bool uk_small_fits(const Dims& d, int rows) {
  const int pieces = uk_pieces<S>(d);
  return rows >= 1 && rows <= kGemvMaxRows && d.L % (16 / sizeof(S)) == 0 && pieces >= 1 &&
         pieces <= kUkThreads && (pieces & (pieces - 1)) == 0 &&
         uk_small_smem<S>(d, rows) <= kUkSmemMax;
}

template <class S, int R>
__global__ void __launch_bounds__(kUkThreads)
    uk_small(Dims d, const S* q, const S* w_kv_b, S* qpack, bool stream) {
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
      wq[b] = ib + b < i1 ? ld_weight(row, stream) : make_uint4(0u, 0u, 0u, 0u);
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

/// Whether gemv serves a projection: k in whole 16-byte pieces, rows 16-byte aligned, and a
/// shape where it beat cuBLAS on the H200 (bench-gpu --per-op, dsv32 sizes; the ratios are in
/// docs/PERFORMANCE.md): weights of up to 2^24 values at 1-4 rows, and every shape at one row.
/// Not o_proj at 2-4 rows, where cuBLAS is faster.
template <class S>
inline bool gemv_fits(int rows, int n, const void* x, int ldx, const void* w, int k) {
  constexpr int V = 16 / sizeof(S);
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool shape =
      (rows <= kGemvMaxRows && static_cast<long long>(n) * k <= (1LL << 24)) || rows == 1;
  return rows >= 1 && shape && k % V == 0 && ldx % V == 0 && aligned(x) && aligned(w);
}

/// Deterministic pseudo-random fill of the cache entries of positions [0, ctx) of one request
/// (benchmarks: long contexts without running their prefill). Grid (ctx), 128 threads.
__device__ __forceinline__ float hash_unit(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) * 0x1p-24f * 2.f - 1.f;
}

template <class S>
__global__ void synthesize(Dims d, const int* table, int ctx, KvCache<S> cache, IndexCache index,
                           bool full) {
  const int p = blockIdx.x;
  if (p >= ctx) return;
  const long long slot = static_cast<long long>(table[p / d.B]) * d.B + p % d.B;
  for (int i = threadIdx.x; i < d.L; i += blockDim.x) {
    const float v = 2.f * hash_unit(slot * 1024 + i);
    if (d.fp8_kv)
      cache.codes[slot * d.L + i] = float_to_e4m3(v * 100.f);
    else
      cache.latent[slot * d.L + i] = st<S>(v);
  }
  if (d.fp8_kv && threadIdx.x < d.tiles) cache.scales[slot * d.tiles + threadIdx.x] = 0.02f;
  for (int i = threadIdx.x; i < d.dr; i += blockDim.x)
    cache.rope[slot * d.dr + i] = st<S>(hash_unit(slot * 1024 + 600 + i));
  if (!full) return;
  for (int i = threadIdx.x; i < 128; i += blockDim.x)
    index.codes[slot * 128 + i] = float_to_e4m3(300.f * hash_unit(slot * 1024 + 700 + i));
  if (threadIdx.x == 0) index.scales[slot] = 0.01f;
}

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

}  // namespace dsv32::gpu::k

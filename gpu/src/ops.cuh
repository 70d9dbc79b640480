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
  int tiles;  // fp8_ds_mla tiles of the latent
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

template <class S>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm(const S* in, int in_ld, const S* g, S* out, int out_ld, int n, float eps) {
  __shared__ float sh[32];
  const S* x = in + static_cast<long long>(blockIdx.x) * in_ld;
  float ss = 0.f;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += ld(x[i]) * ld(x[i]);
  const float inv = 1.f / sqrtf(block_sum(ss, sh) / static_cast<float>(n) + eps);
  S* y = out + static_cast<long long>(blockIdx.x) * out_ld;
#pragma unroll 4
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = st<S>(ld(x[i]) * inv * ld(g[i]));
}

/// norm_rope_cache, MLA part: c = RMSNorm(ckv) * g_kv, kR = rope(kpe_raw); cache insert at the
/// token's slot (skipped when slot < 0); kR also to its trace buffer. One block per token.
template <class S>
__global__ void kv_insert(Dims d, Meta m, const S* qkv, const S* g_kv, KvCache<S> cache,
                          S* kR_out) {
  extern __shared__ float smem[];
  float* c = smem;         // L
  float* sh = smem + d.L;  // 32
  const int t = blockIdx.x;
  const S* row = qkv + static_cast<long long>(t) * (d.Rq + d.L + d.dr);
  float ss = 0.f;
  for (int i = threadIdx.x; i < d.L; i += blockDim.x) {
    c[i] = ld(row[d.Rq + i]);
    ss += c[i] * c[i];
  }
  const float inv = 1.f / sqrtf(block_sum(ss, sh) / static_cast<float>(d.L) + d.eps);
  for (int i = threadIdx.x; i < d.L; i += blockDim.x) c[i] = c[i] * inv * ld(g_kv[i]);
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
/// quantized; trace buffers and, for slot >= 0, the indexer cache. One block of 128 per token.
template <class S>
__global__ void index_k_insert(Dims d, Meta m, const S* kw, const S* g_k, const S* b_k,
                               IndexCache cache, std::uint8_t* k8_out, float* kscale_out) {
  __shared__ float v[128];
  __shared__ float sh[32];
  const int t = blockIdx.x, i = threadIdx.x;
  const float x = ld(kw[static_cast<long long>(t) * (d.dI + d.HI) + i]);
  const float mean = block_sum(x, sh) / 128.f;
  const float var = block_sum((x - mean) * (x - mean), sh) / 128.f;
  v[i] = (x - mean) / sqrtf(var + d.ieps) * ld(g_k[i]) + ld(b_k[i]);
  rotate_quantize(d, m, v, sh, m.positions[t], k8_out + static_cast<long long>(t) * 128,
                  kscale_out + t);
  __syncthreads();
  long long slot = m.slots[t];
  if (slot < 0 && d.padded_write) slot = 0;
  if (slot < 0) return;
  cache.codes[slot * 128 + i] = k8_out[static_cast<long long>(t) * 128 + i];
  if (i == 0) cache.scales[slot] = kscale_out[t];
}

/// Clears the shared top-k rows [0, T) to -1 (F layers, in norm_rope_cache).
__global__ void topk_clear(int* topk, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) topk[i] = -1;
}

/// fused_q, MLA part: qR = S(rope(q's rope part)) for every head. One block per token.
template <class S>
__global__ void q_rope(Dims d, Meta m, const S* q, S* qR) {
  const int t = blockIdx.x, p = m.positions[t], half = d.dr / 2;
  for (int w = threadIdx.x; w < d.H * half; w += blockDim.x) {
    const int h = w / half, i = w % half;
    const S* src = q + static_cast<long long>(t) * d.H * (d.dn + d.dr) + h * (d.dn + d.dr) + d.dn;
    float a = ld(src[2 * i]), b = ld(src[2 * i + 1]);
    const long long r = static_cast<long long>(p) * half + i;
    rope_pair(a, b, m.rope_cos[r], m.rope_sin[r]);
    S* dst = qR + static_cast<long long>(t) * d.H * d.dr + h * d.dr;
    dst[2 * i] = st<S>(a);
    dst[2 * i + 1] = st<S>(b);
  }
}

/// fused_q, indexer part (F layers): per (token, head) rotate and quantize qI; omega =
/// w * qscale * dI^-1/2 * HI^-1/2. Grid (T, HI), 128 threads.
template <class S>
__global__ void index_q(Dims d, Meta m, const S* qI, const S* kw, std::uint8_t* q8, float* qscale,
                        float* omega) {
  __shared__ float v[128];
  __shared__ float sh[32];
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  const long long row = static_cast<long long>(t) * d.HI + h;
  v[i] = ld(qI[row * 128 + i]);
  rotate_quantize(d, m, v, sh, m.positions[t], q8 + row * 128, qscale + row);
  __syncthreads();
  if (i == 0)
    omega[row] =
        ld(kw[static_cast<long long>(t) * (d.dI + d.HI) + d.dI + h]) * qscale[row] * d.head_norm;
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
/// registers). The token's q8 is staged in shared memory.
constexpr int kIdxGroups = 8;
constexpr int kIdxThreads = 32 * kIdxGroups;
constexpr int kIdxKeyThreads = 128;

__host__ __device__ inline std::size_t index_scores_smem(const Dims& d) {
  return sizeof(float) * (static_cast<std::size_t>(d.HI) * 128 + d.HI + 32 * (129 + kIdxGroups));
}

/// Stages the token's q8 codes (as floats) and omegas in shared memory.
__device__ __forceinline__ void stage_index_q(const Dims& d, int t, const std::uint8_t* q8,
                                              const float* omega, float* sq) {
  for (int w = threadIdx.x; w < d.HI * 128; w += blockDim.x)
    sq[w] = e4m3_to_float(q8[static_cast<long long>(t) * d.HI * 128 + w]);
  for (int w = threadIdx.x; w < d.HI; w += blockDim.x)
    sq[d.HI * 128 + w] = omega[static_cast<long long>(t) * d.HI + w];
}

/// 32 keys of one token a block; thread (lane, group g) = (tid % 32, tid / 32); key codes
/// staged in shared memory (rows padded to 129 floats: no bank conflicts). Grid (T_a,
/// ceil(len / 32)), 256 threads.
__global__ void __launch_bounds__(kIdxThreads)
    index_scores_grouped(Dims d, Meta m, const std::uint8_t* q8, const float* omega,
                         IndexCache cache, float* scores, int ld_scores) {
  extern __shared__ float sq[];            // HI x 128 codes of q, then HI omegas
  const float* om = sq + d.HI * 128;
  float* keys = sq + d.HI * 128 + d.HI;    // 32 x 129
  float* part = keys + 32 * 129;           // kIdxGroups x 32
  const int t = blockIdx.x, j0 = blockIdx.y * 32, tid = threadIdx.x;
  const int p = m.positions[t], r = m.request_of_token[t];
  stage_index_q(d, t, q8, omega, sq);
  for (int w = tid; w < 32 * 128; w += blockDim.x) {
    const int kk = w / 128, i = w % 128, j = j0 + kk;
    keys[kk * 129 + i] =
        j <= p ? e4m3_to_float(cache.codes[slot_of(d, m, r, j) * 128 + i]) : 0.f;
  }
  __syncthreads();
  const int lane = tid % 32, g = tid / 32;
  const float* key = keys + lane * 129;
  float acc = 0.f;
  for (int h = g; h < d.HI; h += kIdxGroups) {
    const float* qh = sq + h * 128;
    float dot = 0.f;
    for (int i = 0; i < 128; ++i) dot = fmaf(qh[i], key[i], dot);
    acc = fmaf(om[h], fmaxf(dot, 0.f), acc);
  }
  part[g * 32 + lane] = acc;
  __syncthreads();
  const int j = j0 + tid;
  if (tid < 32 && j <= p) {
    float total = 0.f;
    for (int gg = 0; gg < kIdxGroups; ++gg) total += part[gg * 32 + tid];
    scores[static_cast<long long>(t) * ld_scores + j] = cache.scales[slot_of(d, m, r, j)] * total;
  }
}

/// A thread per key, its 128 codes in registers, the groups' sums in registers. Grid (T_a,
/// ceil(len / 128)), 128 threads.
__global__ void __launch_bounds__(kIdxKeyThreads)
    index_scores_keys(Dims d, Meta m, const std::uint8_t* q8, const float* omega,
                      IndexCache cache, float* scores, int ld_scores) {
  extern __shared__ float sq[];  // HI x 128 codes of q, then HI omegas
  const float* om = sq + d.HI * 128;
  const int t = blockIdx.x;
  stage_index_q(d, t, q8, omega, sq);
  __syncthreads();
  const int j = blockIdx.y * blockDim.x + threadIdx.x, p = m.positions[t];
  if (j > p) return;
  const long long s = slot_of(d, m, m.request_of_token[t], j);
  float kv[128];
  for (int i = 0; i < 128; ++i) kv[i] = e4m3_to_float(cache.codes[s * 128 + i]);
  float total = 0.f;
#pragma unroll
  for (int g = 0; g < kIdxGroups; ++g) {
    float acc = 0.f;
    for (int h = g; h < d.HI; h += kIdxGroups) {
      float dot = 0.f;
      for (int i = 0; i < 128; ++i) dot = fmaf(sq[h * 128 + i], kv[i], dot);
      acc = fmaf(om[h], fmaxf(dot, 0.f), acc);
    }
    total += acc;
  }
  scores[static_cast<long long>(t) * ld_scores + j] = cache.scales[s] * total;
}

/// Busy-waits `cycles` clock cycles (mutant unjoined-stream: a slow backend on the main stream).
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

/// Total order on (score, position): larger score first, then smaller position; unique keys.
__device__ __forceinline__ unsigned long long topk_key(float score, int j) {
  unsigned int b = __float_as_uint(score);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(b) << 32) | (0xFFFFFFFFu - static_cast<unsigned int>(j));
}

/// Exclusive prefix sum of one int per thread in a fixed order; returns the block total.
__device__ __forceinline__ int block_scan(int v, int* sh, int& total) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int o = 1; o < blockDim.x; o <<= 1) {
    const int add = threadIdx.x >= o ? sh[threadIdx.x - o] : 0;
    __syncthreads();
    sh[threadIdx.x] += add;
    __syncthreads();
  }
  total = sh[blockDim.x - 1];
  const int excl = sh[threadIdx.x] - v;
  __syncthreads();
  return excl;
}

/// indexer_topk, selection: rows [0, T_a) of the shared buffer. All of 0..p in order when
/// p + 1 <= K, else the K best keys by a radix select over 8-bit digits of (score, position),
/// written in ascending position order. After each pass the digit's bucket is found by warp 0
/// (a lane per 8 digits, a shuffle scan over lanes); once the whole bucket is needed (its count
/// is what is left of K: always, after the score's bits, unless scores tie) every key with the
/// prefix is taken and the passes stop. One block (1024 threads) per token; histogram counts do
/// not depend on atomic order, and the set is the same as a full 8-pass select's.
__global__ void topk_select(Dims d, Meta m, const float* scores, int ld_scores, int* topk) {
  __shared__ unsigned int hist[256];
  __shared__ int scan[1024];
  __shared__ unsigned long long prefix_sh;
  __shared__ int k_left_sh, done_sh;
  const int t = blockIdx.x, n = m.positions[t] + 1, K = d.K;
  int* out = topk + static_cast<long long>(t) * K;
  const float* sc = scores + static_cast<long long>(t) * ld_scores;
  if (n <= K) {  // entries n.. keep the -1 that norm_rope_cache cleared them to
    for (int j = threadIdx.x; j < n; j += blockDim.x) out[j] = j;
    return;
  }
  unsigned long long prefix = 0, mask = 0;
  int k_left = K;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const unsigned long long key = topk_key(sc[j], j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds digits 255 - 8l down to 248 - 8l; the lanes before it, every higher digit.
      const int lane = threadIdx.x;
      int c[8], sum = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) sum += c[q] = static_cast<int>(hist[255 - 8 * lane - q]);
      int incl = sum;
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      int acc = incl - sum;
      if (acc < k_left && incl >= k_left) {  // the K-th best key's digit is in this lane's range
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          if (acc + c[q] >= k_left) {
            prefix_sh = prefix | (static_cast<unsigned long long>(255 - 8 * lane - q) << shift);
            k_left_sh = k_left - acc;
            done_sh = c[q] == k_left - acc;
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
    __syncthreads();
    if (done) break;  // prefix's lower bits are 0: every key of the bucket is >= it
  }
  // prefix is the K-th best key; emit every key >= it in ascending position order.
  int base = 0;
  for (int j0 = 0; j0 < n; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    const int keep = j < n && topk_key(sc[j], j) >= prefix;
    int total = 0;
    const int at = block_scan(keep, scan, total);
    if (keep) out[base + at] = j;
    base += total;
  }
  for (int j = base + threadIdx.x; j < K; j += blockDim.x) out[j] = -1;
}

/// sparse_mqa: per (token, head), softmax over the selected set of sigma * [ql; qR] . [c; kR]
/// read from the cache; P rounded to S before P.V; olat = S(sum P c / l), lse = m + log l
/// (natural log). A row with no valid index gives olat = 0 and lse = -inf.
///
/// Four steps, the two products on tensor cores through cuBLAS (stack.cu): the selected key
/// rows gathered from the paged cache into a dense (T_a, K, L + dr) array (mqa_gather), the
/// scores as two batched GEMMs per token (latent and rope parts), the softmax of each (token,
/// head) (mqa_softmax), P.V as one batched GEMM per token, and the division by l (mqa_finish).
/// Every step is deterministic: the gather and the element-wise steps have no reductions but a
/// warp's fixed shuffle tree, and cuBLAS picks the same kernels for the same shapes.
constexpr int kMqaThreads = 256;
constexpr int kMqaGatherRows = kMqaThreads / 32;  // key rows per gather block, a warp each

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// keys[t, k, :] = [c; kR] of token t's k-th selected position as the cache reads back (an fp8
/// entry dequantized and rounded to S), zeros where the index is -1. Grid (T_a, ceil(K / 8)),
/// 256 threads: a warp a row, the lanes over its columns.
template <class S>
__global__ void __launch_bounds__(kMqaThreads)
    mqa_gather(Dims d, Meta m, KvCache<S> cache, const int* topk, S* keys) {
  const int t = blockIdx.x, k = blockIdx.y * kMqaGatherRows + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (k >= d.K) return;
  const int W = d.L + d.dr;
  S* dst = keys + (static_cast<long long>(t) * d.K + k) * W;
  const int j = topk[static_cast<long long>(t) * d.K + k];
  if (j < 0) {
    for (int i = lane; i < W; i += 32) dst[i] = st<S>(0.f);
    return;
  }
  const long long sl = slot_of(d, m, m.request_of_token[t], j);
  for (int i = lane; i < d.L; i += 32)
    dst[i] = d.fp8_kv ? st<S>(latent_at(d, cache, sl, i)) : cache.latent[sl * d.L + i];
  for (int i = lane; i < d.dr; i += 32) dst[d.L + i] = cache.rope[sl * d.dr + i];
}

/// Softmax statistics of each (token, head) over the scores z: m = max z, P = S(exp(z - m)),
/// l = sum P before rounding (0 when no index is valid). One warp per (token, head); grid
/// (T_a, ceil(H / 8)), 256 threads.
template <class S>
__global__ void __launch_bounds__(kMqaThreads)
    mqa_softmax(Dims d, const int* topk, const float* z, S* p, float* ml) {
  const int t = blockIdx.x, h = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (h >= d.H) return;
  const long long row_at = (static_cast<long long>(t) * d.H + h) * d.K;
  const int* row = topk + static_cast<long long>(t) * d.K;
  float mx = -FLT_MAX;
  int valid = 0;
  for (int k = lane; k < d.K; k += 32)
    if (row[k] >= 0) mx = fmaxf(mx, z[row_at + k]), valid = 1;
  mx = warp_max(mx);
  valid = __any_sync(0xffffffffu, valid);
  float part = 0.f;
  for (int k = lane; k < d.K; k += 32) {
    const float e = row[k] >= 0 ? expf(z[row_at + k] - mx) : 0.f;
    part += e;
    p[row_at + k] = st<S>(e);  // P in the storage precision before P.V
  }
  const float l = warp_sum(part);
  if (lane == 0) {
    ml[2 * (static_cast<long long>(t) * d.H + h)] = mx;
    ml[2 * (static_cast<long long>(t) * d.H + h) + 1] = valid ? l : 0.f;
  }
}

/// olat[t, h, :] = S(acc[t, h, :] / l) (0 where no index is valid), lse = m + log l. Grid
/// (T_a, H), 128 threads.
template <class S>
__global__ void mqa_finish(Dims d, const float* acc, const float* ml, S* olat, float* lse) {
  const long long th = static_cast<long long>(blockIdx.x) * d.H + blockIdx.y;
  const float l = ml[2 * th + 1];
  for (int c = threadIdx.x; c < d.L; c += blockDim.x)
    olat[th * d.L + c] = st<S>(l > 0.f ? acc[th * d.L + c] / l : 0.f);
  if (threadIdx.x == 0) lse[th] = l > 0.f ? ml[2 * th] + logf(l) : -INFINITY;
}

/// uv_proj / uv_proj_static: o[t, h, e] = S(sum_i olat[t, h, i] W_UV[h][e][i]), each output one
/// warp's dot: lane l sums i = l, l + 32, ... in ascending order, then a fixed shuffle tree. A
/// row's result therefore depends on neither the number of rows nor the grid (the no-copy form
/// runs T_a rows, the copy form T: both must agree bitwise). A warp keeps its W_UV row in
/// registers (up to 32 * kUvRegs latent columns; more are read as they are needed) and serves
/// rows z, z + gridDim.z, ... Grid (H, ceil(dv / 8), min(rows, kUvRowSplit)), 256 threads.
constexpr int kUvThreads = 256;
constexpr int kUvOuts = kUvThreads / 32;  // outputs e per block, a warp each
constexpr int kUvRegs = 16;
constexpr int kUvRowSplit = 4;  // a warp serves rows/4 rows: W_UV read once per warp

template <class S>
__global__ void __launch_bounds__(kUvThreads)
    uv_bmm(Dims d, int rows, const S* olat, const S* w_kv_b, S* o) {
  const int h = blockIdx.x, e = blockIdx.y * kUvOuts + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (e >= d.dv) return;
  const S* wr = w_kv_b + (static_cast<long long>(h) * (d.dn + d.dv) + d.dn + e) * d.L;
  float wreg[kUvRegs];
#pragma unroll
  for (int j = 0; j < kUvRegs; ++j) {
    const int i = lane + 32 * j;
    wreg[j] = i < d.L ? ld(wr[i]) : 0.f;
  }
  for (int r = blockIdx.z; r < rows; r += gridDim.z) {
    const S* x = olat + (static_cast<long long>(r) * d.H + h) * d.L;
    float a = 0.f;
#pragma unroll
    for (int j = 0; j < kUvRegs; ++j) {
      const int i = lane + 32 * j;
      if (i < d.L) a = fmaf(ld(x[i]), wreg[j], a);
    }
    for (int i = lane + 32 * kUvRegs; i < d.L; i += 32) a = fmaf(ld(x[i]), ld(wr[i]), a);
    a = warp_sum(a);
    if (lane == 0) o[(static_cast<long long>(r) * d.H + h) * d.dv + e] = st<S>(a);
  }
}

/// Launch shape of uv_bmm over `rows` rows.
inline dim3 uv_grid(const Dims& d, int rows) {
  return dim3(d.H, (d.dv + kUvOuts - 1) / kUvOuts, rows < kUvRowSplit ? rows : kUvRowSplit);
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
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = st<S>(ld(h[i]) + ld(y[i]));
}

/// Tensor-parallel o_proj: y = S(sum over ranks r = 0, 1, ... of parts[r]) with an fp32
/// accumulator in rank order, every rank the same bits (parts: `ranks` gathered blocks of n).
template <class S>
__global__ void sum_ranks(const S* parts, int ranks, long long n, S* y) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int r = 0; r < ranks; ++r) acc += ld(parts[r * n + i]);
  y[i] = st<S>(acc);
}

}  // namespace dsv32::gpu::k

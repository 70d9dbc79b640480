#include "index_scores.cuh"

#include <algorithm>

namespace dsv32::gpu::k {

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
  const int t = blockIdx.x, tid = threadIdx.x;
  int r, p;
  if (scores_skipped(m) || !token_of(m, t, r, p) || static_cast<int>(blockIdx.y) * NB > p)
    return;  // the same in every thread
  stage_index_q(d, t, q8, omega, sq);
  // Once unless the grid is capped (a device-driven launch): chunks gridDim.y apart.
  for (int j0 = blockIdx.y * NB; j0 <= p; j0 += gridDim.y * NB) {
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
    __syncthreads();  // kscale and part are read before the next chunk's keys are staged
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
  int r, p;
  if (scores_skipped(m) || !token_of(m, t, r, p) || static_cast<int>(blockIdx.y * blockDim.x) > p)
    return;  // the same in every thread
  stage_index_q(d, t, q8, omega, sq);
  __syncthreads();
  // Once unless the grid is capped (a device-driven launch).
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j <= p; j += gridDim.y * blockDim.x) {
    const long long s = slot_of(d, m, r, j);
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
constexpr int kIdxMmaRow = 128 + 8;  // f16 per staged row

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
                     float* scores, int ld_scores, int rows, int per_block) {
  __shared__ __align__(16) __half qh[kIdxMmaHeads * kIdxMmaRow];
  __shared__ __align__(16) __half kh[kIdxMmaKeys * kIdxMmaRow];
  __shared__ float om[kIdxMmaHeads], ksc[kIdxMmaKeys], part[kIdxMmaHeads / 16][kIdxMmaKeys];
  if (scores_skipped(m)) {  // waits first: every kernel passes the wait (stream_order)
    stream_order();
    return;
  }
  const int t0 = blockIdx.x * per_block, t1 = min(live_rows(m, rows), t0 + per_block);
  // Token u's request and position (token_of; u < t1 is a live row).
  const auto req = [&](int u) { return m.live ? live_request(m, u) : m.request_of_token[u]; };
  const auto pos = [&](int u) { return m.live ? live_position(m, u) : m.positions[u]; };
  int j0 = blockIdx.y * kIdxMmaKeys;  // the block's chunk of keys; more where the grid is capped
  const int tid = threadIdx.x, HT = (d.HI + 15) / 16;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  // Stages request r's keys for token t: up to the last position any of the block's tokens of
  // r reaches (a key past a token's position is staged but its score is not written).
  const auto stage = [&](int t, int r, int p) {
    int last = p;
    for (int u = t + 1; u < t1; ++u)
      if (req(u) == r) last = max(last, pos(u));
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
  int staged = -1, jmax = -1;  // the request whose keys are in kh; the block's last position
  for (int u = t0; u < t1; ++u) jmax = max(jmax, pos(u));
  // The first token's keys before the wait: the index cache and the step's metadata are
  // written before the indexer's chain starts (norm_rope_cache, the fork's event or, on one
  // stream, two launches back: a resident block's predecessor has passed its own wait, so the
  // one before that has completed), so only q8 and omega need the wait.
  if (t0 < t1 && j0 <= pos(t0)) {
    staged = req(t0);
    stage(t0, staged, pos(t0));
  }
  stream_order();
  for (; j0 <= jmax; j0 += gridDim.y * kIdxMmaKeys, staged = -1)  // once unless capped
    for (int t = t0; t < t1; ++t) {
      const int p = pos(t), r = req(t);
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

IndexScoreKernel choose_index_scores(const Dims& d, int rows, int longest, int sms, bool mma) {
  if (mma && index_mma_fits(d)) return IndexScoreKernel::mma;
  if (static_cast<long long>(rows) * ((longest + 127) / 128) >= 2LL * sms)
    return IndexScoreKernel::per_key;
  return IndexScoreKernel::grouped;
}

void allow_index_scores_smem(const Dims& d) {
  const std::size_t smem = index_scores_smem(d);
  for (const void* f : {reinterpret_cast<const void*>(index_scores_grouped),
                        reinterpret_cast<const void*>(index_scores_keys)})
    detail::check(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)),
                  "index_scores shared memory");
}

void launch_index_scores(const Launch& go, IndexScoreKernel kernel, const Dims& d, const Meta& m,
                         const std::uint8_t* q8, const float* omega, IndexCache cache,
                         float* scores, int ld_scores, int rows, int longest, int tokens_per_block,
                         int max_chunks) {
  // Chunks of `keys` keys over `longest`, at most max_chunks (> 0) of them in the grid.
  const auto chunks = [&](int keys) {
    const int n = (longest + keys - 1) / keys;
    return static_cast<unsigned>(max_chunks > 0 ? std::min(n, max_chunks) : n);
  };
  switch (kernel) {
    case IndexScoreKernel::mma: {
      const int per = tokens_per_block > 0 ? tokens_per_block : index_mma_tokens(rows);
      go(index_scores_mma, dim3((rows + per - 1) / per, chunks(kIdxMmaKeys)), kIdxMmaThreads, 0, d,
         m, q8, omega, cache, scores, ld_scores, rows, per);
      break;
    }
    case IndexScoreKernel::per_key:
      go(index_scores_keys, dim3(rows, chunks(kIdxKeyThreads)), kIdxKeyThreads,
         index_scores_smem(d), d, m, q8, omega, cache, scores, ld_scores);
      break;
    case IndexScoreKernel::grouped:
      go(index_scores_grouped, dim3(rows, chunks(kIdxBlockKeys)), kIdxThreads, index_scores_smem(d),
         d, m, q8, omega, cache, scores, ld_scores);
      break;
  }
}

}  // namespace dsv32::gpu::k

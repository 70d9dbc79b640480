#include "cache.cuh"

namespace dsv32::gpu::k {

template <class S>
__global__ void read_latent(Dims d, Meta m, KvCache<S> cache, S* out) {
  stream_order();
  const int t = blockIdx.x;
  const long long slot = m.slots[t];
  for (int i = threadIdx.x; i < d.L; i += blockDim.x)
    out[static_cast<long long>(t) * d.L + i] = st<S>(latent_at(d, cache, slot, i));
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

template <class S>
void launch_read_latent(const Launch& go, int rows, const Dims& d, const Meta& m, KvCache<S> cache,
                        S* out) {
  go(read_latent<S>, rows, 128, 0, d, m, cache, out);
}
template <class S>
void launch_synthesize(const Launch& go, const Dims& d, const int* table, int ctx, KvCache<S> cache,
                       IndexCache index, bool full) {
  go(synthesize<S>, ctx, 128, 0, d, table, ctx, cache, index, full);
}

#define DSV32_INSTANTIATE(S)                                                                    \
  template void launch_read_latent<S>(const Launch&, int, const Dims&, const Meta&, KvCache<S>, \
                                      S*);                                                      \
  template void launch_synthesize<S>(const Launch&, const Dims&, const int*, int, KvCache<S>,   \
                                     IndexCache, bool);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

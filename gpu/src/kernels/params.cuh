// The parameter structs every op's kernels take by value, and the cache addressing they share.
#pragma once

#include "common.cuh"

namespace dsv32::gpu::k {

/// Geometry the kernels need, copied by value into every launch.
struct Dims {
  int T, D, H, Rq, L, dn, dr, dv, HI, dI, K, B;
  int max_blocks;  // columns of the block table
  float eps, ieps, sigma, head_norm;
  bool neox, hadamard, fp8_kv;
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
  /// The device-driven (uniform decode) variants of the H ops read these; nullptr in the
  /// host-driven ones. live: [rows, short-prefill flag, q, seq_len of request 0 .. R-1]: R
  /// requests of q new tokens each (decode: q = 1; speculative verify: 1 + the drafts), rows =
  /// R q; a launch covers the capture size's T rows and exits for t >= rows. short_prefill
  /// (live + 1 for the step's): 1 when every context fits in K (the scores are skipped on the
  /// device).
  const int* live = nullptr;
  const int* short_prefill = nullptr;
};

/// In a device-driven launch: live row t's request, and its position (the request's q new
/// tokens are the last q positions of its sequence).
__device__ __forceinline__ int live_request(const Meta& m, int t) {
  return t / m.live[2];
}
__device__ __forceinline__ int live_position(const Meta& m, int t) {
  const int q = m.live[2];
  return m.live[3 + t / q] - q + t % q;
}

/// Token t's request r and position p: the step's mapping, or in a device-driven launch the
/// uniform decode step's (live_request, live_position). False for a row past the live rows.
__device__ __forceinline__ bool token_of(const Meta& m, int t, int& r, int& p) {
  if (m.live) {
    if (t >= m.live[0]) return false;
    r = live_request(m, t);
    p = live_position(m, t);
    return true;
  }
  r = m.request_of_token[t];
  p = m.positions[t];
  return true;
}

/// Rows a launch covers: `rows`, or in a device-driven launch min(rows, R q).
__device__ __forceinline__ int live_rows(const Meta& m, int rows) {
  return m.live && m.live[0] < rows ? m.live[0] : rows;
}

/// True when a device-driven launch of the scores has no work (the short-prefill shortcut).
__device__ __forceinline__ bool scores_skipped(const Meta& m) {
  return m.short_prefill && *m.short_prefill;
}

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

/// The cache slot of position `pos` of request r (its block table row).
__device__ __forceinline__ long long slot_of(const Dims& d, const Meta& m, int r, int pos) {
  return static_cast<long long>(m.block_table[r * d.max_blocks + pos / d.B]) * d.B + pos % d.B;
}

/// One latent value read back from the cache (fp8: code * scale in fp32, then S).
/// `tile0_scale`: the mutant fp8-tile-scale's read, tile 0's scale for every tile.
template <class S>
__device__ __forceinline__ float latent_at(const Dims& d, const KvCache<S>& cache, long long slot,
                                           int i, bool tile0_scale = false) {
  if (!d.fp8_kv) return ld(cache.latent[slot * d.L + i]);
  return rnd<S>(e4m3_to_float(cache.codes[slot * d.L + i]) *
                cache.scales[slot * d.tiles + (tile0_scale ? 0 : i / 128)]);
}

}  // namespace dsv32::gpu::k

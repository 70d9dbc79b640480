#include "topk_select.cuh"

namespace dsv32::gpu::k {

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
/// kBins (the default; StackOptions::topk_bins off selects the radix select alone): a first pass
/// puts each score in one of kTopkBins equal-width bins over [min, max] of the row (topk_bin: a
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
    topk_select(Dims d, Meta m, const float* scores, int ld_scores, int* topk, TopkFault fault,
                int* path_counts) {
  stream_order();
  __shared__ TopkBinsShared bsh;
  __shared__ int warp_at[kTopkWarps + 1];
  __shared__ unsigned long long prefix_sh, cand[kTopkResolve];
  __shared__ int above[kTopkResolve];
  __shared__ int k_left_sh, done_sh, count_sh, ncand;
  int r_unused, p;
  if (!token_of(m, blockIdx.x, r_unused, p)) return;  // the same in every thread
  const int t = blockIdx.x, n = p + 1, K = d.K, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int* out = topk + static_cast<long long>(t) * K;
  const float* sc = scores + static_cast<long long>(t) * ld_scores;
  const auto count_path = [&](TopkRowPath path) {
    if (path_counts && threadIdx.x == 0) atomicAdd(&path_counts[path], 1);
  };
  if (n <= K || (fault == TopkFault::edge && n == K + 1)) {  // entries n.. keep their -1
    for (int j = threadIdx.x; j < min(n, K); j += blockDim.x) out[j] = j;
    count_path(kTopkWithinK);
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
      if (done) {  // the same in every thread
        count_path(kTopkShortBins);
        return;
      }
      __syncthreads();  // the short path's shared values are read before the select reuses them
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
  // registers. The planted long_row stops at r = kTopkFast (only rows past 16384 keys go on).
  const int walk = fault == TopkFault::long_row ? min(per, kTopkFast) : per;
  const auto each = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < kRegs; ++r)
      if (r < per) f(j0 + 32 * r, kr[r], j0 + 32 * r < n);
    for (int r = kRegs; r < walk; ++r) {
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
      } else if (fault == TopkFault::bin_overflow) {
        // The planted bug: a buffer of kTopkResolve keys for the bin; the keys that arrive
        // after it is full are dropped (which ones: atomic order).
        if (threadIdx.x == 0) ncand = 0;
        if (threadIdx.x < kTopkResolve) above[threadIdx.x] = 0;
        __syncthreads();
        each([&](int, unsigned long long kk, bool valid) {
          if (valid && topk_bin(topk_score(kk), lo, scale) == bin) {
            const int i = atomicAdd(&ncand, 1);
            if (i < kTopkResolve) cand[i] = kk;
          }
        });
        __syncthreads();
        prefix = topk_kth(cand, above, kTopkResolve, min(k_left, kTopkResolve), &prefix_sh);
        found = true;
      }
    }
  }
  count_path(found ? kTopkBinRanked : bin >= 0 ? kTopkCrowdedBin : kTopkRadixRow);
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
    const int slot = at + __popc(ballot & below);
    if (take && slot < K) out[slot] = j;  // never past the row, whatever the select decided
    at += __popc(ballot);
  });
  for (int j = total + threadIdx.x; j < K; j += blockDim.x) out[j] = -1;
}

void launch_topk_select(const Launch& go, bool bins, const Dims& d, const Meta& m,
                        const float* scores, int ld_scores, int rows, int* topk, TopkFault fault,
                        int* path_counts) {
  go(bins ? topk_select<true> : topk_select<false>, rows, kTopkThreads, 0, d, m, scores, ld_scores,
     topk, fault, path_counts);
}

}  // namespace dsv32::gpu::k

// uk_absorb at decode sizes: ql = S(qN W_UK) per head, W_UK read once.
#pragma once

#include <cstddef>

#include "gemv.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

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
constexpr std::size_t kUkSmemMax = 160 * 1024;  // opted in by allow_uk_small_smem

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

/// ql of `rows` tokens (rows <= kGemvMaxRows; uk_small_fits) into qpack's ql part.
template <class S>
void launch_uk_small(const Launch& go, const Dims& d, int rows, const S* q, const S* w_kv_b,
                     S* qpack);
/// Opts every row count's kernel in to kUkSmemMax bytes of shared memory (current device).
template <class S>
void allow_uk_small_smem();

}  // namespace dsv32::gpu::k

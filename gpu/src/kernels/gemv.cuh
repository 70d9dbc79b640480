// Projections of decode batches: y = S(x W^T) for up to kGemvMaxRows rows, W read once.
#pragma once

#include <cstdint>

#include "launch.cuh"

namespace dsv32::gpu::k {

constexpr int kGemvMaxRows = 4;

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

/// `batch` products y + b ys = S((x + b xs) (w + b ws)^T), each `rows` rows (row strides ldx,
/// ldy) by n outputs over depth k, on a device of `sms` SMs.
template <class S>
void launch_gemv(const Launch& go, const S* x, int ldx, long long xs, const S* w, long long ws,
                 S* y, int ldy, long long ys, int batch, int rows, int n, int k, int sms);

}  // namespace dsv32::gpu::k

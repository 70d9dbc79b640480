// Weight streaming shared by the decode projections (gemv.cu, uk_absorb.cu).
#pragma once

#include <type_traits>

#include "common.cuh"

namespace dsv32::gpu::k {

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

/// A weight's 16 bytes, read once a step: through the read-only path, not allocated in L1, and
/// evict-first in L2 (an L2 cache policy), so that the step's weights streaming through L2 do
/// not evict what the latency-bound kernels read (the caches' rows, the activations).
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

/// f(std::integral_constant<int, rows>) for rows 1 .. 4: the decode kernels are instantiated
/// per row count.
template <class F>
void with_rows(int rows, F&& f) {
  switch (rows) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    default:
      f(std::integral_constant<int, 4>{});
      break;
  }
}

}  // namespace dsv32::gpu::k

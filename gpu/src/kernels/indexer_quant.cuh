// The indexer's rotation and fp8 quantization of one 128-vector, shared by norm_rope_cache's
// key part and fused_q's query part.
#pragma once

#include "params.cuh"

namespace dsv32::gpu::k {

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

}  // namespace dsv32::gpu::k

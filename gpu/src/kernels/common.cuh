// Device helpers every kernel family shares. Every reduction runs in a fixed order (shuffle trees,
// sequential loops): no result depends on atomic order or scheduling, so plans can compare bitwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

namespace dsv32::gpu::k {

using bf16 = __nv_bfloat16;

/// Programmatic dependent launch (docs/DECISIONS.md, "PDL"): the stack launches its kernels with
/// programmatic stream serialization, so a kernel's blocks may be resident before the kernel
/// ahead of it in the stream has finished. Every such kernel calls this first, before it reads
/// or writes anything: it waits until the grid ahead has completed and its memory is visible,
/// then lets the next kernel launch (its blocks wait here in turn). Waiting first in every
/// kernel keeps the stream's order transitive (a kernel cannot complete before its
/// predecessor); only the launch latency overlaps. A no-op without a programmatic dependency
/// and below sm_90.
__device__ __forceinline__ void stream_order() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float ld(float v) {
  return v;
}
__device__ __forceinline__ float ld(bf16 v) {
  return __bfloat162float(v);
}
template <class S>
__device__ __forceinline__ S st(float v);
template <>
__device__ __forceinline__ float st<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 st<bf16>(float v) {
  return __float2bfloat16_rn(v);
}
/// v rounded to the storage type and back (the bf16 points of MATH.md section 4).
template <class S>
__device__ __forceinline__ float rnd(float v) {
  return ld(st<S>(v));
}

__device__ __forceinline__ float e4m3_to_float(std::uint8_t c) {
  const __nv_fp8_e4m3 v = *reinterpret_cast<const __nv_fp8_e4m3*>(&c);
  return static_cast<float>(v);
}
__device__ __forceinline__ std::uint8_t float_to_e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The rest uses device intrinsics: only nvcc sees it (the stack's host-only files include these
// headers for the types and launchers, and g++ compiles them).
#if defined(__CUDACC__)
/// Sum over the block in a fixed shuffle tree; every thread gets the result. `sh` >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Max over the block (NaN-ignoring like fmaxf); every thread gets the result.
__device__ __forceinline__ float block_max(float v, float* sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -FLT_MAX;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Exponent of the smallest power of two with max(amax, 1e-4) <= 448 * 2^e (exact compares).
__device__ __forceinline__ int ue8m0_exponent(float amax) {
  const float a = fmaxf(amax, 1e-4f);
  if (!isfinite(a)) return 127;
  int k = 0;
  frexpf(a, &k);
  int e = k - 10;
  while (ldexpf(448.f, e) < a) ++e;
  return e;
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

__device__ __forceinline__ void rope_pair(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = x * c - y * s;
  b = x * s + y * c;
}
#endif  // __CUDACC__

}  // namespace dsv32::gpu::k

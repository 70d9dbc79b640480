// fused_q: the MLA query's rotation (qR) and the indexer query's rotation and quantization.
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

constexpr int kFusedQThreads = 128;  // index_q_head's vector: a thread per dimension
/// Rows of blocks of the rotation part.
__host__ __device__ inline int q_rope_blocks(const Dims& d) {
  return (d.H * (d.dr / 2) + kFusedQThreads - 1) / kFusedQThreads;
}

/// Block roles [y_off, y_off + blocks) of d.T tokens: roles below q_rope_blocks(d) rotate qR
/// into qpack, the others quantize indexer head (role - q_rope_blocks(d)). The two parts touch
/// disjoint data and may run as two launches on two streams.
template <class S>
void launch_fused_q(const Launch& go, const Dims& d, const Meta& m, int y_off, int blocks,
                    const S* q, int q_stride, int q_off, S* qpack, int qpack_stride, int qpack_off,
                    const S* qI, const S* kw, std::uint8_t* q8, float* qscale, float* omega);
/// The rotation alone, src to dst (in place allowed): mutant double-rope.
template <class S>
void launch_q_rope(const Launch& go, const Dims& d, const Meta& m, const S* src, int src_stride,
                   int src_off, S* dst, int dst_stride, int dst_off);

}  // namespace dsv32::gpu::k

#include "fused_q.cuh"
#include "indexer_quant.cuh"

namespace dsv32::gpu::k {

/// fused_q, MLA part: qR = S(rope(q's rope part)) for every head: the dr values of (token t,
/// head h) at src + (t H + h) src_stride + src_off go rotated to dst + (t H + h) dst_stride +
/// dst_off (in place allowed). Pair w = h dr / 2 + i of token t.
template <class S>
__device__ __forceinline__ void q_rope_pair(const Dims& d, const Meta& m, int t, int w,
                                            const S* src, int src_stride, int src_off, S* dst,
                                            int dst_stride, int dst_off) {
  const int p = m.positions[t], half = d.dr / 2;
  if (w >= d.H * half) return;
  const int h = w / half, i = w % half;
  const long long th = static_cast<long long>(t) * d.H + h;
  const S* from = src + th * src_stride + src_off;
  float a = ld(from[2 * i]), b = ld(from[2 * i + 1]);
  const long long r = static_cast<long long>(p) * half + i;
  rope_pair(a, b, m.rope_cos[r], m.rope_sin[r]);
  S* to = dst + th * dst_stride + dst_off;
  to[2 * i] = st<S>(a);
  to[2 * i + 1] = st<S>(b);
}

/// fused_q, indexer part (F layers), head h of token t: rotate and quantize qI; omega = w *
/// qscale * dI^-1/2 * HI^-1/2. A block of 128 threads; `v` 128 and `sh` 32 floats of shared
/// memory.
template <class S>
__device__ __forceinline__ void index_q_head(const Dims& d, const Meta& m, int t, int h,
                                             const S* qI, const S* kw, std::uint8_t* q8,
                                             float* qscale, float* omega, float* v, float* sh) {
  const int i = threadIdx.x;
  const long long row = static_cast<long long>(t) * d.HI + h;
  v[i] = ld(qI[row * 128 + i]);
  rotate_quantize(d, m, v, sh, m.positions[t], q8 + row * 128, qscale + row);
  __syncthreads();
  if (i == 0)
    omega[row] =
        ld(kw[static_cast<long long>(t) * (d.dI + d.HI) + d.dI + h]) * qscale[row] * d.head_norm;
}

/// fused_q: grid (T, q_rope_blocks(d) + (F layer ? HI : 0)) as one launch, kFusedQThreads
/// threads; block role y = blockIdx.y + y_off: y < q_rope_blocks(d) rotates qR (a thread per
/// (head, pair)), the others quantize indexer head y - q_rope_blocks(d). The parts touch
/// disjoint data, so they may also run as two launches (y_off 0 with q_rope_blocks(d) rows of
/// blocks, and y_off q_rope_blocks(d) with HI), on two streams.
template <class S>
__global__ void __launch_bounds__(kFusedQThreads)
    fused_q(Dims d, Meta m, const S* q, int q_stride, int q_off, S* qpack, int qpack_stride,
            int qpack_off, const S* qI, const S* kw, std::uint8_t* q8, float* qscale, float* omega,
            int y_off) {
  stream_order();
  __shared__ float v[128];
  __shared__ float sh[32];
  const int t = blockIdx.x, y = blockIdx.y + y_off, nrope = q_rope_blocks(d);
  if (y < nrope)
    q_rope_pair(d, m, t, y * kFusedQThreads + threadIdx.x, q, q_stride, q_off, qpack, qpack_stride,
                qpack_off);
  else
    index_q_head(d, m, t, y - nrope, qI, kw, q8, qscale, omega, v, sh);
}

/// q_rope alone (mutant double-rope: the rotation again, in place). Grid (T, q_rope_blocks(d)),
/// kFusedQThreads threads.
template <class S>
__global__ void __launch_bounds__(kFusedQThreads)
    q_rope(Dims d, Meta m, const S* src, int src_stride, int src_off, S* dst, int dst_stride,
           int dst_off) {
  stream_order();
  q_rope_pair(d, m, blockIdx.x, blockIdx.y * kFusedQThreads + threadIdx.x, src, src_stride, src_off,
              dst, dst_stride, dst_off);
}

template <class S>
void launch_fused_q(const Launch& go, const Dims& d, const Meta& m, int y_off, int blocks,
                    const S* q, int q_stride, int q_off, S* qpack, int qpack_stride, int qpack_off,
                    const S* qI, const S* kw, std::uint8_t* q8, float* qscale, float* omega) {
  go(fused_q<S>, dim3(d.T, blocks), kFusedQThreads, 0, d, m, q, q_stride, q_off, qpack,
     qpack_stride, qpack_off, qI, kw, q8, qscale, omega, y_off);
}
template <class S>
void launch_q_rope(const Launch& go, const Dims& d, const Meta& m, const S* src, int src_stride,
                   int src_off, S* dst, int dst_stride, int dst_off) {
  go(q_rope<S>, dim3(d.T, q_rope_blocks(d)), kFusedQThreads, 0, d, m, src, src_stride, src_off, dst,
     dst_stride, dst_off);
}

#define DSV32_INSTANTIATE(S)                                                                      \
  template void launch_fused_q<S>(const Launch&, const Dims&, const Meta&, int, int, const S*,    \
                                  int, int, S*, int, int, const S*, const S*, std::uint8_t*,      \
                                  float*, float*);                                                \
  template void launch_q_rope<S>(const Launch&, const Dims&, const Meta&, const S*, int, int, S*, \
                                 int, int);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

#include "norm.cuh"
#include "rmsnorm.cuh"

namespace dsv32::gpu::k {

/// RMSNorm rows: out = S(in / sqrt(mean(in^2) + eps) * g). One block of kNormThreads per row;
/// the loops unrolled so that a thread's loads are in flight together (a decode step has one
/// row: latency, not bandwidth, is its cost).
constexpr int kNormThreads = 1024;

/// input_norm. Grid (T), kNormThreads threads.
constexpr int kNormRegs = 8;  // D = 7168 over 1024 threads
template <class S>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm(const S* in, int in_ld, const S* g, S* out, int out_ld, int n, float eps) {
  float gr[kNormRegs];
  load_strided(g, n, gr);
  stream_order();
  __shared__ float sh[32];
  rmsnorm_row(in + static_cast<long long>(blockIdx.x) * in_ld, gr, g,
              out + static_cast<long long>(blockIdx.x) * out_ld, n, eps, sh);
}

template <class S>
void launch_rmsnorm(const Launch& go, int rows, const S* in, int in_ld, const S* g, S* out,
                    int out_ld, int n, float eps) {
  go(rmsnorm<S>, rows, kNormThreads, 0, in, in_ld, g, out, out_ld, n, eps);
}

#define DSV32_INSTANTIATE(S) \
  template void launch_rmsnorm<S>(const Launch&, int, const S*, int, const S*, S*, int, int, float);
DSV32_INSTANTIATE(float)
DSV32_INSTANTIATE(bf16)

}  // namespace dsv32::gpu::k

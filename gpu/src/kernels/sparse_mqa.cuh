// sparse_mqa's kernels: the selected keys gathered from the paged cache, the softmax, and the
// finish; the two products between them run through cuBLAS (ops/attention.cu).
#pragma once

#include "launch.cuh"
#include "params.cuh"

namespace dsv32::gpu::k {

/// A planted bug of the gather's fp8_ds_mla read (mutants, docs/GPU.md): first_tile_scale
/// dequantizes every tile of 128 latent values with tile 0's scale (fp8-tile-scale; right only
/// where Lkv is one tile).
enum class LatentFault { none, first_tile_scale };

/// A DCP rank's view of the cache (MATH.md, "Context-parallel shards"): the rank's local position
/// l holds global position floor(l / I) I W + rank I + l mod I. The emulated ranks read the one
/// cache through it; world 1 reads positions as they are.
struct DcpView {
  int world = 1, interleave = 1, rank = 0;
};

/// Every launch covers `rows` rows; with Meta::live (device-driven), rows past the live rows
/// exit (params.cuh, token_of).
/// keys[t, k, :] = [c; kR] of each of rows tokens' K selected positions (zeros for -1), the
/// sets also into topk_trace. `vec`: plain cache rows move in 16-byte pieces. `view`: the sets
/// are a DCP rank's local positions (one past the token's own position reads as -1).
template <class S>
void launch_mqa_gather(const Launch& go, const Dims& d, const Meta& m, int rows, KvCache<S> cache,
                       const int* topk, S* keys, bool vec, int* topk_trace,
                       LatentFault fault = LatentFault::none, DcpView view = {});
/// P = S(exp(z - max)) per (token, head) over the selected entries, and each row's max and sum.
template <class S>
void launch_mqa_softmax(const Launch& go, const Dims& d, const Meta& m, int rows, const int* topk,
                        const float* z, S* p, float* ml);
/// A DCP mutant's partial (docs/GPU.md): lse_base2 reports lse in base 2, which the merge takes
/// as natural log (vllm#47079); divide_empty divides an empty row's zero sums (olat 0 / 0, which
/// a merge adding every rank turns into 0 x NaN).
enum class FinishFault { none, lse_base2, divide_empty };
/// olat = S(acc / l) (also into olat_trace) and lse = m + log l.
template <class S>
void launch_mqa_finish(const Launch& go, const Dims& d, const Meta& m, int rows, const float* acc,
                       const float* ml, S* olat, S* olat_trace, float* lse,
                       FinishFault fault = FinishFault::none);
/// A busy wait of `cycles` clock cycles on `stream` (mutant unjoined-stream: a slow backend).
void launch_spin(cudaStream_t stream, long long cycles);

}  // namespace dsv32::gpu::k

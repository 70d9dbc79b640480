// Given prefixes (docs/spec/GOLDEN.md, "Given prefix"): the cache entries of a request's first
// positions, drawn in the cache's own format, stored into the device caches before the step that
// first names the request runs, byte for byte as norm_rope_cache would have written them.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "impl.cuh"

namespace dsv32::gpu::stack {

using detail::to_storage;

namespace {

/// Prefix positions [p0, p1) of a request sit at the consecutive slots [slot, slot + p1 - p0).
struct Run {
  int p0, p1;
  long long slot;
};

/// The runs of positions [0, length) of `r`: one a block, neighbouring physical blocks merged.
/// Block ids placed as the stack places them (far blocks: b + offset).
std::vector<Run> prefix_runs(const RequestStep& r, int length, int B, int num_blocks,
                             long long offset) {
  if (length > r.ctx)
    throw ScenarioError("gpu stack: request " + std::to_string(r.id) + " has a given prefix of " +
                        std::to_string(length) + " positions but a context of " +
                        std::to_string(r.ctx));
  std::vector<Run> runs;
  for (int p = 0; p < length; p += B) {
    const int b = r.block_table.at(static_cast<std::size_t>(p / B));
    if (b < 0 || b >= num_blocks)
      throw ScenarioError("gpu stack: request " + std::to_string(r.id) + " position " +
                          std::to_string(p) + ": block " + std::to_string(b) +
                          " is not in the cache");
    const long long slot = (b + offset) * B;
    const int end = std::min(length, p + B);
    if (!runs.empty() && runs.back().slot + (runs.back().p1 - runs.back().p0) == slot)
      runs.back().p1 = end;
    else
      runs.push_back({p, end, slot});
  }
  return runs;
}

/// Copies rows of `width` elements of the host image `host` (row p: position p) to their slots
/// of the device cache `cache`, run by run, on `s`.
template <class T>
void put_rows(T* cache, const std::vector<T>& host, int width, const std::vector<Run>& runs,
              cudaStream_t s, const char* what) {
  const auto w = static_cast<std::size_t>(width);
  for (const Run& r : runs)
    check(cudaMemcpyAsync(cache + r.slot * width, host.data() + r.p0 * w,
                          (r.p1 - r.p0) * w * sizeof(T), cudaMemcpyHostToDevice, s),
          what);
}

/// The e4m3 bytes of a matrix of code values (each exactly on the grid: GivenPrefix::check).
std::vector<std::uint8_t> e4m3_image(const Mat& codes) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(codes.size()));
  for (Eigen::Index p = 0; p < codes.rows(); ++p)
    for (Eigen::Index i = 0; i < codes.cols(); ++i)
      out[p * codes.cols() + i] = e4m3_bits(codes(p, i));
  return out;
}

/// A matrix row-major in storage type T (the values exact in T: GivenPrefix::check).
template <class T>
std::vector<T> storage_image(const Mat& m) {
  std::vector<T> out(static_cast<std::size_t>(m.size()));
  for (Eigen::Index p = 0; p < m.rows(); ++p)
    for (Eigen::Index i = 0; i < m.cols(); ++i) out[p * m.cols() + i] = to_storage<T>(m(p, i));
  return out;
}

}  // namespace

template <class S>
void StackImpl<S>::store_given(const StepInput& in) {
  if (in.given.empty()) return;
  const cudaStream_t stream = streams_.main();
  cudaStreamCaptureStatus status;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw GraphError(
        "gpu stack: a given prefix is stored outside captures; the stream is capturing");
  const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
  const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, dI = cfg.index_head_dim;
  for (const auto& given : in.given) {
    const GivenPrefix& g = *given;
    g.check(cfg);  // shapes, and every value on its format's grid (so the bytes are exact)
    const auto r = std::find_if(in.requests.begin(), in.requests.end(),
                                [&](const RequestStep& q) { return q.id == g.request_id; });
    if (r == in.requests.end())
      throw ScenarioError("gpu stack: a given prefix of request " + std::to_string(g.request_id) +
                          ", which is not in the step");
    const std::vector<Run> runs =
        prefix_runs(*r, g.length, cfg.block_size, num_blocks_, options.block_offset);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const PrefixLayer& pl = g.layers[l];
      const LayerDev<S>& ld = buf_.layers[l];
      // Host images, one row a position, in the device caches' layouts (buffers.cu, make_layer):
      // fp8_ds_mla codes (slot, L) bytes and tile scales (slot, tiles) fp32, else the latent
      // (slot, L) in S; the rope part (slot, dr) in S; F layers' index codes (slot, dI) bytes
      // and scales (slot) fp32.
      std::vector<std::uint8_t> codes, index_codes;
      std::vector<float> scales, index_scales;
      std::vector<S> latent;
      const std::vector<S> rope = storage_image<S>(pl.k_rope);
      if (fp8) {
        codes = e4m3_image(pl.latent);
        scales = storage_image<float>(pl.latent_scale);
        put_rows(ld.kv.codes, codes, L, runs, stream, "given prefix: latent codes");
        put_rows(ld.kv.scales, scales, tiles(), runs, stream, "given prefix: latent scales");
      } else {
        latent = storage_image<S>(pl.latent);
        put_rows(ld.kv.latent, latent, L, runs, stream, "given prefix: latent");
      }
      put_rows(ld.kv.rope, rope, dr, runs, stream, "given prefix: rope part");
      if (cfg.is_full_layer(l)) {
        index_codes = e4m3_image(pl.index_k);
        index_scales.assign(pl.index_scale.begin(), pl.index_scale.end());
        put_rows(ld.index.codes, index_codes, dI, runs, stream, "given prefix: index codes");
        put_rows(ld.index.scales, index_scales, 1, runs, stream, "given prefix: index scales");
      }
      check(cudaStreamSynchronize(stream), "given prefix");  // the host images die here
    }
  }
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

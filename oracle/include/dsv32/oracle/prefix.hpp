// A given prefix (docs/spec/GOLDEN.md, "Given prefix"): a request's first positions whose cache
// entries are drawn in the cache's own format instead of computed from hidden states, so that a
// 128K-token context costs the oracle only its measured steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// One layer's cache entries of positions [0, length), in the cache's own format, as values.
struct PrefixLayer {
  /// (length, Lkv). fp8_ds_mla: the e4m3 code values (before their tile's scale); bf16 cache:
  /// the latent as stored (bf16 values in bf16 precision, fp32 values in fp32 precision).
  Mat latent;
  /// (length, Lkv / 128) fp32 tile scales; fp8_ds_mla only (else empty).
  Mat latent_scale;
  Mat k_rope;  // (length, dr), as stored (bf16 or fp32 values, by precision)
  /// F layers only (else empty): (length, dI) e4m3 code values and (length) ue8m0 scales.
  Mat index_k;
  Vec index_scale;
};

/// The given prefix of one request: `length` positions of every layer's caches.
struct GivenPrefix {
  int request_id = 0;
  int length = 0;
  std::vector<PrefixLayer> layers;  // one per layer of the config

  /// Throws ScenarioError naming the layer and field when a shape does not fit `cfg`, a value
  /// is not finite or is off its format's grid (a code that is no e4m3 value, a scale that is
  /// not a power of two for the indexer or not positive for a tile).
  void check(const Config& cfg) const;
  /// Layer `layer`'s latent at position p as the cache reads it back into out[0, Lkv)
  /// (fp8_ds_mla: each code's value times its tile's scale, in fp32, as the quantizer reads it).
  void latent_row(const Config& cfg, int layer, int p, double* out) const;
};

/// How a request's rows repeat (docs/CASES.md, top-k stress): with `repeat` N > 0, position p
/// takes position p mod N's row (a phrase of N tokens over and over), except the positions in
/// `distinct`, which take rows of their own (an outlier in the run). It shapes a request's
/// hidden rows and, the same way, the entries of its given prefix.
struct HiddenShape {
  int repeat = 0;  // 0: every position its own row
  std::vector<int> distinct;
  bool operator==(const HiddenShape&) const = default;
};

/// Draws the given prefix of request `request_id`, `length` positions, from the counter RNG
/// keyed by (seed, request id, layer, position): the latent drawn as a normalized row would be
/// and stored as the cache stores it (fp8_ds_mla: quantized tile by tile by the model's own
/// quantizer), the rope part and the index keys likewise (the keys by the indexer's ue8m0 block
/// quantizer). With a `shape`, position p draws position p mod repeat's entries (equal keys:
/// ties of every score), a distinct position its own. Bitwise the same on every machine and
/// thread count.
GivenPrefix draw_prefix(const Config& cfg, std::uint64_t seed, int request_id, int length,
                        const HiddenShape& shape = {});

}  // namespace dsv32

// Layer weights: bf16 values held as doubles, W stored as (out, in), y = x W^T.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// The lightning indexer's weights (F layers only).
struct IndexerWeights {
  Mat w_q_b;  // (HI*dI, Rq)
  Mat w_k;    // (dI, D)
  Mat w_w;    // (HI, D)
  Vec g_k;    // (dI)
  Vec b_k;    // (dI)
};

/// One layer's weights, GOLDEN.md names.
struct LayerWeights {
  Mat w_qkv_a;  // (Rq+Lkv+dr, D)
  Vec g_q;      // (Rq)
  Vec g_kv;     // (Lkv)
  Mat w_q_b;    // (H*(dn+dr), Rq)
  Mat w_kv_b;   // (H*(dn+dv), Lkv)
  Mat w_o;      // (D, H*dv)
  Vec g_in;     // (D)
  std::optional<IndexerWeights> indexer;
};

/// The stack's weights.
struct Weights {
  std::vector<LayerWeights> layers;

  /// Deterministic bf16 weights from the counter RNG (stream "layer{l}/{name}"): uniform in
  /// [-1, 1) * sqrt(3 / fan_in) so activations keep unit scale; gains 1 + 0.25 u; biases 0.1 u.
  static Weights generate(const Config& cfg, std::uint64_t seed);
  /// Throws ConfigError when a matrix's shape disagrees with cfg (names the weight and layer).
  void check_shapes(const Config& cfg) const;
  /// Heads [h0, h1) of layer weights, for tensor-parallel shards (indexer replicated).
  LayerWeights head_shard(const Config& cfg, int layer, int h0, int h1) const;
};

}  // namespace dsv32

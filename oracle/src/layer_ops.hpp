// The oracle's reference of one layer, one function per op of BOUNDARIES.md section 1 (the ops
// the GPU stack runs), so that the two can be compared op by op. Oracle::step runs a layer's ops
// (layer_ops) in order through run_op.
#pragma once

#include "dsv32/oracle/dcp.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rope.hpp"

namespace dsv32::detail {

/// A forward under DCP (MATH.md, context-parallel shards): every rank's top-k buffer (shared by
/// the layers like the unsharded one), the ranks' block tables of the step's requests, and the
/// layer trace being written.
struct DcpState {
  DcpLayout layout;
  std::vector<TopkRows> rows;                         // [rank] (T, K) global positions
  std::vector<std::vector<std::vector<int>>> tables;  // [rank][request] block ids
  DcpLayerTrace* trace = nullptr;                     // the current layer's
};

/// What every op of one layer reads: the config, the layer's weights and caches, the step.
struct LayerContext {
  const Config& cfg;
  const LayerWeights& w;
  const Mat& indexer_kw;  // [w_k; w_w] of an F layer (indexer_wk_proj's one GEMM)
  LayerCache& cache;
  const StepInput& in;
  const StepOptions& opts;
  const Rope& rope;
  int layer;
  bool round;               // bf16 at every bf16 storage point (emulated mode, bf16 precision)
  DcpState* dcp = nullptr;  // the ranks' state under DCP, else null

  /// RoPE's position of row t (shifted only by the metamorphic-test hook); slots use p(t).
  int rope_pos(int t) const { return in.positions[t] + opts.rope_position_offset; }
  /// The bf16 store of a whole tensor in place (nothing when !round).
  void store(Mat& m) const;
};

/// One layer's tensors between its ops (MATH.md's names), rows [0, T) unless noted.
struct LayerTensors {
  Mat x, qkv;           // input_norm, qkv_a_proj
  Mat kw;               // indexer_wk_proj: [kraw | w] (F layers)
  Mat q_c, lat, kR;     // norm_rope_cache (lat: the latent as inserted into the cache)
  Mat c;                // the trace's c: this run's own cache entries, rows [0, Ta)
  Mat kI;               // norm_rope_cache (F): kI8 values
  Vec kI_scale;         // norm_rope_cache (F)
  Mat q, ql, qI;        // q_b_proj, uk_absorb, indexer_wq_b (F)
  Mat qR;               // fused_q
  Mat qI_scale, omega;  // fused_q (F); qI becomes its qI8 values in place
  Mat olat, lse;        // sparse_mqa
  Mat o, y;             // uv_proj, o_proj
};

void input_norm(const LayerContext& ctx, const Mat& h, LayerTensors& t);
void qkv_a_proj(const LayerContext& ctx, LayerTensors& t);
void indexer_wk_proj(const LayerContext& ctx, LayerTensors& t);
/// Also clears the shared top-k rows [0, T) on F layers.
void norm_rope_cache(const LayerContext& ctx, LayerTensors& t, TopkRows& topk);
void q_b_proj(const LayerContext& ctx, LayerTensors& t);
void uk_absorb(const LayerContext& ctx, LayerTensors& t);
void indexer_wq_b(const LayerContext& ctx, LayerTensors& t);
void fused_q(const LayerContext& ctx, LayerTensors& t);
/// F layers: rows [0, Ta) of the shared buffer (from the indexer, or StepOptions::topk_override).
void indexer_topk(const LayerContext& ctx, const LayerTensors& t, TopkRows& topk);
void sparse_mqa(const LayerContext& ctx, const TopkRows& topk, LayerTensors& t);
void uv_proj(const LayerContext& ctx, LayerTensors& t);
void o_proj(const LayerContext& ctx, LayerTensors& t);
void residual_add(const LayerContext& ctx, const LayerTensors& t, Mat& h);

/// Runs `op` of the layer: the oracle's dispatch, one switch on Op, the shape of the GPU stack's.
/// The no-copy form only (the copy form's ops compute the same values); throws
/// std::logic_error for latent_copy and uv_proj_static.
void run_op(Op op, const LayerContext& ctx, LayerTensors& t, Mat& h, TopkRows& topk);

}  // namespace dsv32::detail

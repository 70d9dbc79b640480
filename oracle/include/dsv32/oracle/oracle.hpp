// The CPU oracle of the DeepSeek-V3.2 attention stack (MATH.md sections 2-4).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/dcp.hpp"
#include "dsv32/oracle/ops.hpp"
#include "dsv32/oracle/rope.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "dsv32/oracle/stages.hpp"
#include "dsv32/oracle/tensor.hpp"
#include "dsv32/oracle/weights.hpp"

namespace dsv32 {

/// exact: fp64 math, only the model's quantizers. emulated: also rounds at every bf16 point.
enum class Mode { exact, emulated };
std::string_view to_string(Mode m);

/// Named stage tensors of one layer, rows [0, T_a), in op order.
struct LayerTrace {
  std::vector<Tensor> tensors;
  std::optional<DcpLayerTrace> dcp;  // the ranks' rows, shares and partials under DCP
  const Tensor* find(Stage stage) const;
  const Tensor& at(Stage stage) const;  // throws std::out_of_range naming it
  const Tensor* find(std::string_view name) const;
  const Tensor& at(std::string_view name) const;  // throws std::out_of_range naming it
};

/// Everything one step produced.
struct StepTrace {
  std::vector<LayerTrace> layers;
  Tensor output;  // (T_a, D)
};

/// Seconds spent per op, accumulated over layers and steps.
struct Profile {
  OpArray<double> seconds;
  double trace = 0.0;  // copying the stages into the trace (bookkeeping, no op's arithmetic)
};

/// Index sets a caller imposes on F layers (e.g. the GPU's own), rows [0, T_a), -1 padded.
using TopkRows = Eigen::Matrix<int, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
struct StepOptions {
  std::vector<std::optional<TopkRows>> topk_override;  // indexed by layer; empty: own sets
  /// Under DCP, indexed by layer then rank: each rank's rows (`union` mode's own sets; under
  /// `exact` topk_override is enough); takes precedence over topk_override.
  std::vector<std::vector<TopkRows>> dcp_topk_override;
  /// Indexed by layer: (T_a, Lkv) latent values to store in the cache for the real rows in place
  /// of this run's own (fp8_ds_mla: follow another run's cache codes); the trace's `c` stays
  /// this run's own.
  std::vector<std::optional<Mat>> latent_override;
  Profile* profile = nullptr;  // per-op wall time when set
  /// Added to every position where RoPE uses it (not causality, not slots): RoPE is relative,
  /// so scores and outputs must not change beyond rounding (a metamorphic property).
  int rope_position_offset = 0;
  /// Tensor-parallel o_proj over this many equal head groups (MATH.md section 3): y is the sum,
  /// in group order, of each group's partial product, each stored (bf16 in `emulated` mode) before
  /// the sum is stored: the rounding points of a TP group. 1: the unsharded product.
  int o_proj_ranks = 1;
  /// Runs sparse attention as DCP ranks even at dcp_size 1 (which must give the unsharded bits);
  /// dcp_size > 1 always does.
  bool dcp_path = false;
  /// The ranks' block tables under DCP (vLLM's shared ids, or different ids per rank).
  DcpTables dcp_tables = DcpTables::shared;

  /// Options that impose the F layers' sets of `trace` (e.g. T1 follows T0's sets, so that
  /// T1 - T0 measures rounding only and not a different selection near a tie).
  /// With `cache_codes` (and an fp8_ds_mla cache), also store `trace`'s latent in the cache, so
  /// a flipped e4m3 code of the other run does not propagate as a difference (GPU judging): its
  /// values as they are, stored as this run's mode stores its own read-back latent; a row that
  /// holds no codes (ds_mla_grid: a latent never quantized) is refused with a ScenarioError
  /// naming it (judge checks them first and fails the stage instead).
  static StepOptions follow(const Config& cfg, const StepTrace& trace, bool cache_codes = false);
};
/// The "topk" stage of a layer trace as int rows.
TopkRows topk_rows(const LayerTrace& lt);

/// Index scores of one token over keys 0..n-1, and sum |terms| of each (for error bounds).
struct IndexScores {
  std::vector<double> score, abs_terms;
};
/// I(j) = kscale_j * sum_h omega_h relu(q8_h . key_j) in fp64 (products of e4m3 values are
/// exact): q8 is (HI, dI) e4m3 values, omega (HI), keys[j] a dI-vector of e4m3 values.
IndexScores index_score_row(const double* q8, const double* omega, int HI, int dI,
                            const std::vector<const double*>& keys,
                            const std::vector<double>& kscale);

/// One layer's persistent caches (values as read back from the cache).
struct LayerCache {
  Mat kv;           // (slots, Lkv + dr): [c ; kR]
  Mat index_k;      // (slots, dI): e4m3 values (F layers)
  Vec index_scale;  // (slots): ue8m0 scales (F layers)
};

/// The oracle: a stack of layers over persistent paged caches that start NaN-poisoned.
class Oracle {
 public:
  Oracle(Config cfg, std::shared_ptr<const Weights> weights, Mode mode, int num_blocks);

  /// Runs one step: every layer, updating the caches; returns every stage. The step's given
  /// prefixes are stored in the caches first.
  StepTrace step(const StepInput& in, const StepOptions& opts = {});

  const Config& config() const { return cfg_; }
  Mode mode() const { return mode_; }
  int num_blocks() const { return num_blocks_; }
  LayerCache& cache(int layer) { return caches_.at(layer); }
  const LayerCache& cache(int layer) const { return caches_.at(layer); }
  /// Index scores I(t, j), j = 0..p(t), of real token t of a finished step, from this oracle's
  /// indexer cache and the qI8/omega of `lt` (the oracle's own trace or a GPU's); abs_terms[j]
  /// is sum |terms| of the same score, for fp32 error bounds (index_score_eps).
  IndexScores index_scores(int layer, const StepInput& in, const LayerTrace& lt, int t) const;

  /// Fills the cache entries of positions [0, ctx) of every request of `in` with random
  /// values of the right formats (benchmarks: long contexts without running their prefill).
  void synthesize_context(const StepInput& in, std::uint64_t seed);

  /// True when this mode rounds to bf16 at the deployed storage points.
  bool rounds_bf16() const { return mode_ == Mode::emulated && cfg_.precision == Precision::bf16; }

 private:
  void load_given(const StepInput& in);
  struct Layer;
  Config cfg_;
  std::shared_ptr<const Weights> w_;
  Mode mode_;
  int num_blocks_;
  Rope rope_;
  std::vector<LayerCache> caches_;
  std::vector<Mat> indexer_kw_;  // per F layer: [w_k; w_w], (dI + HI, D)
};

/// The top-k rule of MATH.md step 7 on one row of scores for positions 0..p: all of them in
/// order when p + 1 <= K, else the K largest (ties: smaller position), written in ascending
/// position order; -1 up to K. Throws on a NaN score.
std::vector<int> select_topk(const std::vector<double>& scores, int K);

}  // namespace dsv32

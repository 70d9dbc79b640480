// Decode context parallelism (MATH.md, "Context-parallel shards"): where a position lives among
// the ranks, the exact and union top-k, a rank's share of a row, and the LSE merge of the ranks'
// partial attention. The oracle's step runs them when Config::dcp_size > 1 (or when asked to at
// W = 1, which must give the unsharded layer's bits).
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/scenario.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// W ranks, interleave I: position p lives on rank owner(p) = floor(p / I) mod W at local
/// position local(p) = floor(p / (I W)) I + p mod I of that rank's caches.
struct DcpLayout {
  int world = 1;
  int interleave = 1;

  static DcpLayout of(const Config& c) { return {c.dcp_size, c.dcp_interleave}; }
  int owner(std::int64_t p) const { return static_cast<int>((p / interleave) % world); }
  std::int64_t local(std::int64_t p) const {
    return p / (std::int64_t{interleave} * world) * interleave + p % interleave;
  }
  /// The global position of rank r's local position l (owner and local inverted).
  std::int64_t global(int r, std::int64_t l) const {
    return l / interleave * interleave * world + std::int64_t{r} * interleave + l % interleave;
  }
  /// How many of the positions [0, n) rank r owns (its local positions are [0, that)).
  std::int64_t owned(std::int64_t n, int r) const;
};

/// Which block ids the ranks' tables hold. `shared`: vLLM's, every rank the same ids (a request's
/// block b covers global positions [b B W, (b + 1) B W), local block b on every rank; the ids are
/// the first of the request's own table). `distinct`: rank r's id is the shared id + r modulo the
/// pool, so ranks' tables differ (a stricter test of a converter that reads the wrong table).
enum class DcpTables { shared, distinct };

/// The block table of request r of a step on rank `rank`: entries for local blocks
/// 0..ceil(owned / B) - 1 of its seq_len positions.
std::vector<int> dcp_block_table(const std::vector<int>& request_table, int seq_len,
                                 const Config& cfg, DcpTables tables, int num_blocks, int rank);

/// dcp_block_table for every rank and request of `in`, [rank][request].
std::vector<std::vector<std::vector<int>>> dcp_tables(const StepInput& in, const Config& cfg,
                                                      DcpTables tables, int num_blocks);
/// Refuses (ScenarioError naming the rank and request) tables that are not one per rank and
/// request, hold an id outside [0, num_blocks), share an id between two requests of one rank, or
/// are too short for the request's owned positions.
void check_dcp_tables(const StepInput& in, const Config& cfg,
                      const std::vector<std::vector<std::vector<int>>>& tables, int num_blocks);

/// Int rows, -1 where empty (top-k rows of global positions; shares of local slots).
using IndexRows = Eigen::Matrix<std::int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Top-k of one row of index scores (positions 0..n-1) under DCP: `exact` gives MATH.md step 7's
/// set (each rank's local top-K of its owned positions, then step 7 over their union); `union`
/// gives rank `rank`'s own top-min(K, owned) of its owned positions. Ascending positions, -1 up
/// to K. Throws on a NaN score among the candidates.
std::vector<int> dcp_select_topk(const std::vector<double>& scores, int K, const DcpLayout& lay,
                                 DcpIndexerMode mode, int rank);

/// One layer's DCP stages, rows [0, T_a), one entry per rank.
struct DcpLayerTrace {
  std::vector<IndexRows> rows;   // (T_a, K) global positions the rank attends (exact: S_t)
  std::vector<IndexRows> share;  // (T_a, K) its owned ones as local slots, compacted, -1 after
  std::vector<Mat> olat;         // (T_a, H Lkv) partial latent (zero where the rank is empty)
  std::vector<Mat> lse;          // (T_a, H) partial LSE, natural log (-inf where empty)
};

/// The merge of MATH.md: lse = log sum_r exp(lse_r), olat = sum_r exp(lse_r - lse) olat_r, in
/// rank order, an empty rank (lse_r -inf, +inf or NaN) adding exactly nothing; with `round`
/// (bf16 precision, emulated) each rescaled partial is rounded to bf16 and so is every partial
/// sum. `olat` (H L) and `lse` (H) of one row, from `parts` ranks' rows.
void dcp_merge_row(const std::vector<const double*>& part_olat,
                   const std::vector<const double*>& part_lse, int H, int L, bool round,
                   double* olat, double* lse);

}  // namespace dsv32

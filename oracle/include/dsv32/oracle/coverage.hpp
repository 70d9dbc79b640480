// What a run exercised (docs/COVERAGE.md): the rows that pruned, tied at the K-th score or
// crowded one coarse score bin, padded and multi-token rows. Counted from the oracle's own index
// scores, so it says what the case drives, whatever the implementation under test did; and a
// requirement such as `pruned>=50%` turns a claim about a run into a check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsv32/oracle/scenario.hpp"

namespace dsv32 {

/// Coverage's counts as a type, in report order; names are what a requirement names.
enum class Metric : std::uint8_t {
  rows,
  padded,
  multi_token,
  over_k,
  scored,
  pruned,
  ties,
  largest_tie,
  largest_bin,
  max_keys,
  k_edge,
  reused_blocks,
};
inline constexpr std::size_t kNumMetrics = 12;
/// The metric's name ("multi_token").
std::string_view metric_name(Metric m);
/// The metric named `name`, or nullopt (the parse point of metric names).
std::optional<Metric> find_metric(std::string_view name);

struct Coverage {
  long rows = 0;         // real rows, over the steps
  long padded = 0;       // padded rows (T - T_a), over the steps
  long multi_token = 0;  // rows of a request with q > 1 new tokens and a context (verify, chunks)
  long over_k = 0;       // rows of a request whose cached context alone exceeds K
  long scored = 0;       // (row, F layer) pairs whose index scores were looked at
  long pruned = 0;       // of those: more candidates than K (p + 1 > K)
  long ties = 0;         // of the pruned: the K-th score's tie group straddles the cut
  long largest_tie = 0;  // the largest such tie group (keys sharing the K-th score)
  long largest_bin =
      0;              // the most keys of one row in one coarse bin (kCoarseBits of the fp32 score)
  long max_keys = 0;  // the longest row (p + 1 candidates)
  long k_edge = 0;    // scored rows at the shortcut's edge: K - 1, K or K + 1 candidates
  long reused_blocks = 0;  // cache blocks that served a request after another one held them

  /// The request each cache block last served (add_step's memory for reused_blocks).
  std::map<int, int> block_owner;

  /// Bits of an fp32 score's order key that make a coarse bin: sign, exponent and 3 mantissa
  /// bits, as a radix select's first pass sees them.
  static constexpr int kCoarseBits = 12;

  /// Counts one step's rows (real, padded, multi-token, over K) and its blocks that another
  /// request held before; call in step order.
  void add_step(const StepInput& in, int K);
  /// Counts one row of index scores (positions 0..p) of an F layer.
  void add_scores(const std::vector<double>& scores, int K);
  void merge(const Coverage& o);

  /// The value of metric `m`.
  long value(Metric m) const;
  /// (name, value) of every metric, in report order (for reports).
  std::vector<std::pair<std::string, long>> metrics() const;
  /// Whether a metric is a share of a base (padded of all rows, pruned of the scored, ...).
  static bool has_share(Metric m);
  /// The denominator of a metric's percentage (0 for counts, or when the base is empty).
  long base_of(Metric m) const;
  /// "coverage: 44 rows (12 padded, 6 multi-token), pruned 30 of 88 scored (34%), ..."
  std::string line() const;
};

/// A requirement's comparison: >=, >, <=, <, ==.
enum class Comparison : std::uint8_t { ge, gt, le, lt, eq };

/// `pruned>=50%`, `ties>=1`, `largest_tie>=8`: a metric, a comparison (>=, >, <=, <, ==) and a
/// count or a percentage of the metric's base.
struct Requirement {
  std::string text;
  std::string metric;                 // its name, as given
  std::optional<Metric> of_coverage;  // nullopt: one of the counts a report adds (`more`)
  Comparison op = Comparison::ge;
  double value = 0;
  bool percent = false;
  /// Parses `text`; throws std::invalid_argument naming the part that is wrong. `more`: counts
  /// a report adds to Coverage's metrics (`dsv32 gpu`'s steps_full, ...).
  static Requirement parse(const std::string& text, const std::vector<std::string>& more = {});
  /// "" when met, else why not ("pruned>=50%: 12 of 88 scored rows (13.6%)"); `more` holds the
  /// added counts by name.
  std::string check(const Coverage& c, const std::map<std::string, long>& more = {}) const;
};

}  // namespace dsv32

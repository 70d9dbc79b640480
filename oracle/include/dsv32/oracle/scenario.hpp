// The step model of MATH.md section 2: requests, paged block tables, slots, padding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/prefix.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// Raised for inconsistent step metadata; the message names the request or token.
struct ScenarioError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// One request's part of a step.
struct RequestStep {
  int id = 0;                    // stable across steps
  int ctx = 0;                   // tokens already cached
  int q = 1;                     // new tokens this step, >= 1
  std::vector<int> block_table;  // physical block ids covering positions [0, ctx + q)
  int seq_len() const { return ctx + q; }
};

/// One forward over a batch; call derive() after filling requests, capture_size and hidden.
struct StepInput {
  std::vector<RequestStep> requests;  // decode requests first
  int capture_size = 0;               // T >= T_a
  Mat hidden;                         // (T, D); rows >= T_a are padding (any values, NaN too)
  /// Given prefixes (GOLDEN.md) of requests that first appear in this step with ctx_len equal
  /// to the prefix's length: their cache entries are stored before the step runs.
  std::vector<std::shared_ptr<const GivenPrefix>> given;
  /// Under DCP (MATH.md): each rank's block table of each request, [rank][request], local
  /// block b of the request on that rank; empty: derived from `requests`' tables
  /// (StepOptions::dcp_tables).
  std::vector<std::vector<std::vector<int>>> dcp_tables;

  // Derived by derive():
  int num_tokens = 0;                 // T_a
  std::vector<int> positions;         // (T); padded rows 0
  std::vector<std::int64_t> slots;    // (T); padded rows -1
  std::vector<int> request_of_token;  // (T_a)
  std::vector<int> token_start;       // (R + 1) first flattened token of each request

  /// Validates the step against cfg and a cache of num_blocks blocks; fills the derived fields.
  void derive(const Config& cfg, int num_blocks);
  /// Slot of request-local position p of request r (block_table[p / B] * B + p % B).
  std::int64_t slot_of(int r, int position, int block_size) const;
};

/// The largest capture size among steps (at least 1): what a stack must be sized for.
int max_capture_size(const std::vector<StepInput>& steps);

/// What fills padded rows of `hidden`.
enum class Poison { zeros, nan, huge };

/// One request of a step to build: its id and number of new tokens.
struct StepRequest {
  int id;
  int q;
  /// On a request's first step only: its first `given_prefix` positions are a given prefix
  /// (drawn into the cache, not computed), so its context starts there.
  int given_prefix = 0;
};

/// Builds scenarios over persistent caches: tracks each request's context, hands out physical
/// blocks from a seeded permutation (so block tables are out of order), frees them on finish,
/// and draws hidden rows from the counter RNG keyed by (request id, position), so a request's
/// inputs do not depend on batch composition, order, chunking or padding.
class ScenarioBuilder {
 public:
  ScenarioBuilder(const Config& cfg, std::uint64_t seed, int num_blocks);
  /// A step over `requests` (in the given order), padded to capture_size (0: no padding).
  StepInput step(const std::vector<StepRequest>& requests, int capture_size = 0,
                 Poison pad = Poison::nan);
  /// Releases a request's blocks; its id may not be used again.
  void finish(int id);
  int ctx(int id) const;
  int num_blocks() const { return num_blocks_; }
  /// Shapes request `id`'s hidden rows (before its first step).
  void shape(int id, HiddenShape h) { shapes_[id] = std::move(h); }
  /// The hidden row of request `id` at `position` (bf16 values in bf16 precision).
  std::vector<double> hidden_row(int id, int position) const;
  /// Request `id`'s shape (none: every position its own row).
  HiddenShape shape_of(int id) const;

 private:
  struct Live {
    int ctx = 0;
    std::vector<int> blocks;
  };
  Config cfg_;
  std::uint64_t seed_;
  int num_blocks_;
  std::vector<int> free_;  // stack of free physical blocks, in permuted order
  std::map<int, Live> live_;
  std::vector<int> finished_;
  std::map<int, HiddenShape> shapes_;
};

}  // namespace dsv32

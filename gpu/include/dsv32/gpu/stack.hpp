// The CUDA build of the DeepSeek-V3.2 attention stack (MATH.md), op by op as BOUNDARIES.md
// names them, over static device buffers sized for a capture size. Host-only header.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dsv32/boundary/plan.hpp"
#include "dsv32/gpu/graph.hpp"
#include "dsv32/oracle/oracle.hpp"

namespace dsv32::gpu {

/// The collective behind a tensor-parallel o_proj (gpu/tp.hpp implements it over NCCL). The
/// stack gathers every rank's partial rows and sums them in rank order itself, so every rank
/// gets the same bits whichever algorithm the collective picks.
class RankGather {
 public:
  virtual ~RankGather() = default;
  virtual int ranks() const = 0;
  /// Enqueues on `stream` (a cudaStream_t) the gathering of every rank's `bytes` at `send` into
  /// `recv`, rank r's at offset r * bytes. Capturable into a CUDA graph; every rank calls it in
  /// the same order.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) = 0;
};

/// Switches of the stack's kernels and streams, passed in by the caller (tools take them as
/// flags and record them in every benchmark's JSON; docs/GPU.md). None changes a result's
/// bits except `index_mma`, whose scores stay within the bound top-k judging allows.
struct StackOptions {
  bool pdl = true;        // programmatic dependent launch of the ops' kernels
  bool overlap = true;    // an F layer's indexer on a second stream (docs/GPU.md, "Two streams")
  bool index_mma = true;  // indexer_topk's scores on tensor cores where the shapes fit
  bool topk_bins = true;  // indexer_topk's select with value bins ahead of the radix passes
  /// Far blocks (docs/CASES.md): block id b of a step is placed at b + block_offset of a pool
  /// that many blocks larger, so that a cache offset (slot x row) passes 2^31 elements. A run's
  /// bits do not depend on it (GpuPlans.FarBlocksGiveTheNearBits).
  long long block_offset = 0;
  /// (name, value) of every switch, in a fixed order: what benchmarks and logs record.
  std::vector<std::pair<std::string, bool>> fields() const;
};

/// The smallest block offset at which the first slot's offset in its widest cache row (the
/// latent and rope part, or the 128 index codes) passes 2^31 elements: what `dsv32 gpu
/// --far-blocks` and the mutant int32-offset place blocks at.
long long far_block_offset(const Config& cfg);

/// What served one step of a stack (StackReport::served): the plan that ran it (a dispatch plan's
/// own or its piecewise plan) and how: a full graph (device-driven), a piecewise graph or
/// eagerly, at the step's capture size.
struct Served {
  enum class How { eager, piecewise_graph, full_graph };
  std::string plan;
  How how = How::eager;
  int capture_size = 0;
  /// "eager", "piecewise graph", "full graph" (reports and JSON).
  static const char* text(How h) {
    return h == How::full_graph        ? "full graph"
           : h == How::piecewise_graph ? "piecewise graph"
                                       : "eager";
  }
  const char* how_text() const { return text(how); }
};

/// What a stack has done since construction (Stack::report).
struct StackReport {
  /// Captures held: one per (plan signature, capture size), reused by every later step of that
  /// size (boundary::Plan::signature: a renamed plan shares, a changed placement does not).
  int captures = 0;
  /// Bytes of the static buffers only the copy form reads: each layer's static latent, where
  /// `latent_copy` puts the backend's output for `uv_proj_static` (max_tokens x H x Lkv in the
  /// storage type). The stack holds them for every plan; a no-copy plan does not need them.
  std::size_t copy_form_bytes = 0;
  /// What served each step, in order.
  std::vector<Served> served;
  /// The size- and data-dependent paths the host chose for the indexer's kernels, with how
  /// many layer-steps took each (docs/COVERAGE.md): the score kernel, the short-prefill
  /// shortcut, the top-k select's row class; and the paths the select's rows took on the
  /// device ("top-k rows: ...", in rows, captured steps' included).
  std::map<std::string, long> kernel_paths;
  /// How many times an F layer's indexer was forked onto its own stream, by eager steps and
  /// into captures (a capture's eager warm-up not counted); 0 without StackOptions::overlap
  /// (docs/GPU.md, "Two streams").
  int indexer_forks = 0;
  /// How many of those forks launched the layer's `indexer_wq_b` on the main stream just
  /// before forking, ahead of `q_b_proj` (where the plan keeps `norm_rope_cache` ..
  /// `indexer_topk` in one forked stretch: eagerly, or all six captured).
  int indexer_leads = 0;
};

class StackLab;

/// One stack on one device: weights, paged caches, the shared top-k buffer and every inter-op
/// tensor, allocated once for capture sizes up to `max_tokens`. The serving stack: construct it,
/// run steps under plans (capturing on first use), read what it did. Timing, ablation, host-cost
/// modelling and planted bugs are its lab (Stack::lab, gpu/stack_lab.hpp).
class Stack {
 public:
  /// On CUDA device `device`. With `gather`, the stack is one rank of a tensor-parallel group
  /// (cfg and weights hold this rank's heads, Config::tp_shard and Weights::head_shard): o_proj
  /// writes this rank's partial sum, gathers every rank's and adds them in rank order, so `y`
  /// and the residual stream are the group's. `gather` must outlive the stack.
  Stack(const Config& cfg, const Weights& weights, int num_blocks, int max_tokens, int device = 0,
        RankGather* gather = nullptr, const StackOptions& options = {});
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  /// Runs one step eagerly at its capture size (the `eager` plan) and returns every stage of
  /// rows [0, T_a) with the oracle's names, shapes and the storage dtypes.
  StepTrace step(const StepInput& in);
  /// Runs the step under `plan`: `eager` runs ops directly; other plans capture on first use.
  StepTrace run(const boundary::Plan& plan, const StepInput& in);
  /// Captures `plan` at capture size T (once per plan signature and T): G ops are recorded into
  /// graph segments, each eager op ends the segment, runs for real on empty metadata (no real rows;
  /// the residual stream holds ones) and is recorded for replay. Validates the plan unless
  /// `allow_host_capture`.
  CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture = false);
  /// Captures what run(plan, in) would capture on first use (nothing when it holds it already),
  /// without running the step: a group of ranks on one GPU captures on every rank before any
  /// rank replays (gpu/tp.hpp).
  void prepare(const boundary::Plan& plan, const StepInput& in);
  /// Replays the capture of (plan, in.capture_size) for the step: writes the inputs into the
  /// static buffers, updates the host metadata, runs the segments in order on one stream.
  StepTrace replay(const boundary::Plan& plan, const StepInput& in);
  /// What the stack has done so far (waits for its streams: the top-k rows' paths are counted
  /// on the device).
  StackReport report() const;
  const Config& config() const;
  /// Timing, ablation, host costs and planted bugs (gpu/stack_lab.hpp).
  StackLab& lab();

  struct Impl;  // gpu/src/stack/impl.cuh, per storage type

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<StackLab> lab_;
};

/// The paths of the top-k select's rows as StackReport::kernel_paths names them (counted in rows,
/// on the device): all of 0..p; the short path's bins; the general select's threshold bin ranked;
/// a crowded threshold bin (more than 128 keys) resolved by radix passes within it; radix
/// passes over the whole row (no bins, a non-finite score, one value).
inline constexpr const char* kTopkRowPathNames[] = {
    "top-k rows: within K (all of 0..p)", "top-k rows: bins in registers",
    "top-k rows: threshold bin ranked", "top-k rows: crowded threshold bin, radix passes within it",
    "top-k rows: radix passes over the row"};
inline constexpr const char* kTopkCrowdedBinPath = kTopkRowPathNames[3];

/// Runs `steps` in order under `plan` on a fresh stack sized for them, with the stack mutant
/// `mutant` switched on ("" none); `captures` receives how many captures the stack held at the
/// end. What the plan tests, the mutant tests and bisect all run.
std::vector<StepTrace> run_steps(const Config& cfg, const Weights& weights, int num_blocks,
                                 const std::vector<StepInput>& steps, const boundary::Plan& plan,
                                 const std::string& mutant = "", int* captures = nullptr,
                                 const StackOptions& options = {});

}  // namespace dsv32::gpu

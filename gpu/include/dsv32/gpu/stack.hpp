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

/// One stack on one device: weights, paged caches, the shared top-k buffer and every inter-op
/// tensor, allocated once for capture sizes up to `max_tokens`.
/// What served one step of a stack (Stack::served): the plan that ran it (a dispatch plan's
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

  /// Captures `plan` at capture size T (once per plan signature and T): G ops are recorded into
  /// graph segments, each eager op ends the segment, runs for real on empty metadata (no real rows;
  /// the residual stream holds ones) and is recorded for replay. Validates the plan unless
  /// `allow_host_capture`.
  CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture = false);
  /// Replays the capture of (plan, in.capture_size) for the step: writes the inputs into the
  /// static buffers, updates the host metadata, runs the segments in order on one stream.
  StepTrace replay(const boundary::Plan& plan, const StepInput& in);
  /// Runs the step under `plan`: `eager` runs ops directly; other plans capture on first use.
  StepTrace run(const boundary::Plan& plan, const StepInput& in);

  /// Turns on one stack mutant of BOUNDARIES.md section 4 ("" turns it off; plan mutants go
  /// through mutate_plan); drops the captures held. Throws PlanError for other names.
  void set_mutant(const std::string& name);
  /// Bytes of the static buffers only the copy form reads: each layer's static latent, where
  /// `latent_copy` puts the backend's output for `uv_proj_static` (max_tokens x H x Lkv in the
  /// storage type). The stack holds them for every plan; a no-copy plan does not need them.
  std::size_t copy_form_bytes() const;
  /// Captures held: one per (plan signature, capture size), reused by every later step of that
  /// size (boundary::Plan::signature: a renamed plan shares, a changed placement does not).
  int capture_count() const;
  /// What served each step run since construction, in order.
  const std::vector<Served>& served() const;
  /// The size- and data-dependent paths the host chose for the indexer's kernels, with how many
  /// layer-steps took each (docs/COVERAGE.md): the score kernel, the short-prefill shortcut,
  /// the top-k select's row class; and the paths the select's rows took on the device ("top-k
  /// rows: ...", in rows, captured steps' included; waits for the stack's streams).
  const std::map<std::string, long>& kernel_paths() const;
  /// How many times an F layer's indexer has been forked onto its own stream since construction,
  /// by eager steps and into captures (a capture's eager warm-up not counted); 0 without
  /// StackOptions::overlap (docs/GPU.md, "Two streams").
  int indexer_forks() const;
  /// How many of those forks launched the layer's `indexer_wq_b` on the main stream just before
  /// forking, ahead of `q_b_proj` (where the plan keeps `norm_rope_cache` .. `indexer_topk` in
  /// one forked stretch: eagerly, or all six captured), counted as indexer_forks is.
  int indexer_leads() const;
  /// Timing only (`dsv32 bench-gpu --dispatch-us`): a framework's host cost, modelled as a busy
  /// wait of `eager_op_us` on the host before each op run eagerly (an `eager` step's ops, a
  /// captured plan's eager ops at replay: a Python dispatcher's cost per op call) and of
  /// `graph_launch_us` before each graph segment's launch at replay. 0 and 0 (the default)
  /// model nothing. Results do not change; only the host's time does.
  void set_host_costs(double eager_op_us, double graph_launch_us);
  /// Timing only (`dsv32 bench-gpu --ablate`): from now on the launches labelled `label` (as
  /// launch_labels names them) are not made; "" makes every launch again. Drops the captures
  /// held when the label changes (one recorded with a launch missing must not replay a full
  /// step; the same label again keeps them). A step run so is wrong by design: nothing that
  /// judges results calls this.
  void skip_launch(const std::string& label);
  /// The labels of the launches one eager step of `in` makes, in order, from running it:
  /// "op:kernel" for a kernel of ours (its name without namespace or template arguments, e.g.
  /// "q_b_proj:gemv"), "op:cuBLAS what" for a cuBLAS call, "o_proj:all-gather" for the
  /// tensor-parallel gather. A layer's launches repeat for every layer under the same labels.
  std::vector<std::string> launch_labels(const StepInput& in);
  const Config& config() const;
  const StackOptions& options() const;
  /// Fills the cache entries of positions [0, ctx) of every request of `in` with deterministic
  /// pseudo-random values (benchmarks: long contexts without running their prefill).
  void synthesize_context(const StepInput& in);
  /// Mean milliseconds of one step under `plan` over `repeats` timed runs (CUDA events, after a
  /// warm-up run that also captures).
  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats);
  /// Milliseconds the host spent launching one step in the last time_step (the median batch's
  /// launch loop over its repeats). Well under the step's own time, the GPU's work set the
  /// step's time; near it, the host's launches did (or a full launch queue blocked the host,
  /// which takes far more launches than a benchmark's 10 repeats make).
  double last_host_ms() const;
  /// Mean milliseconds of each op of layer 0 run `repeats` times back to back in isolation after
  /// one eager run of the step (every buffer then holds the step's values): the ops of the
  /// `eager` plan, then `latent_copy` and `uv_proj_static`. `graph`: the repeats captured as one
  /// CUDA graph and replayed (the GPU's time; eagerly, an op of short kernels and cuBLAS calls
  /// can be bound by the host's launches). `device_driven`: the H ops' device-driven variants
  /// (`full`'s; the step must then be a uniform decode).
  std::vector<std::pair<std::string, double>> time_ops(const StepInput& in, int repeats,
                                                       bool graph = true,
                                                       bool device_driven = false);
  /// Rows [0, T) of the residual stream as it is on the device now (tests of the capture).
  std::vector<double> residual(int T);

  struct Impl;  // gpu/src/stack/impl.cuh, per storage type

 private:
  std::unique_ptr<Impl> impl_;
};

/// The paths of the top-k select's rows as Stack::kernel_paths names them (counted in rows, on
/// the device): all of 0..p; the short path's bins; the general select's threshold bin ranked;
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

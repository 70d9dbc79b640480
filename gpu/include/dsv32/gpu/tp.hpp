// Tensor parallelism (MATH.md section 3): one GPU stack per rank with H / tp heads and the whole
// (replicated) indexer; o_proj's partial sums are gathered and added in rank order on every rank.
// The ranks meet over NCCL, one a GPU, or on one GPU (docs/GPU.md, "Ranks on one GPU").
// Host-only header.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv32/gpu/stack.hpp"

namespace dsv32::gpu {

/// A tensor-parallel group that cannot be built or has failed (NCCL errors, a rank's failure,
/// replicated stages that differ between ranks). The message names the rank and the cause.
struct TpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// How a group's ranks meet. `nccl`: one rank a GPU (devices 0 .. tp - 1), o_proj's gather over
/// NCCL. `one_gpu`: every rank a stack of the current device, with its own caches, streams and
/// host thread, the gather through device memory (capturable, as NCCL's is): the same ranks
/// computing the same bits, on a machine of one GPU; it needs CUDA_MODULE_LOADING=EAGER (a
/// kernel loaded lazily can wait for the whole device while a peer waits for it).
/// `automatic`: NCCL when the build has it and tp GPUs are visible, else one GPU.
enum class TpTransport { automatic, nccl, one_gpu };
/// "nccl" or "one GPU" (automatic: what it resolves to for tp ranks here).
std::string transport_name(TpTransport transport, int tp);

/// Empty when `tp` ranks can run here over `transport` (tp == 1 always can with a GPU; NCCL
/// needs a build with it and tp visible devices; one GPU needs a GPU), else why not (for
/// GTEST_SKIP and the CLI).
std::string no_tp_reason(int tp, TpTransport transport = TpTransport::automatic);
/// Whether this build has NCCL.
bool built_with_nccl();

/// One trace of the unsharded config from the ranks' traces (rank r holds heads
/// [r * H / tp, (r + 1) * H / tp)): head-split stages concatenated per row in rank order,
/// replicated stages taken from rank 0 after checking every rank holds the same bits. Throws
/// TpError naming the rank, layer and stage where a replicated stage differs, or where the
/// traces do not fit together (stage names, shapes).
StepTrace merge_rank_traces(const Config& cfg, const std::vector<StepTrace>& ranks);

/// `tp` ranks of this process, one host thread each: on CUDA devices 0 .. tp - 1 over NCCL, or
/// all on the current device (TpTransport).
class TpGroup {
 public:
  /// cfg and weights are the unsharded layer's; num_heads must divide by tp. NCCL runs with
  /// NVLink multicast off (NCCL_NVLS_ENABLE=0, set here whatever the environment says) and
  /// its connections made when the group is built (NCCL_RUNTIME_CONNECT=0 unless set), so that
  /// nothing is allocated while a rank's stream is captured.
  TpGroup(const Config& cfg, const Weights& weights, int tp, int num_blocks, int max_tokens,
          const StackOptions& options = {}, TpTransport transport = TpTransport::automatic);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int size() const;
  /// nccl or one_gpu: how this group's ranks meet.
  TpTransport transport() const;
  /// Runs the step on every rank under `plan` (each rank captures on first use, like
  /// Stack::run) and returns the merged trace. A rank that fails aborts the group's NCCL
  /// communicators (the others would wait for it forever); the group then refuses every call.
  StepTrace run(const boundary::Plan& plan, const StepInput& in);
  /// Fault injection, for tests: on the next run(), `rank` throws TpError ("injected
  /// failure") 100 ms in without joining o_proj's all-gather, as a rank that fails mid-step
  /// would, while the other ranks go on into the collective and wait there for it.
  void inject_rank_failure(int rank);
  /// Each rank's own trace of the last step run.
  const std::vector<StepTrace>& rank_traces() const;
  /// Rank 0's Stack::report (every rank holds the same captures, serves and takes the same
  /// paths).
  StackReport report() const;
  /// StackLab::synthesize_context on every rank.
  void synthesize_context(const StepInput& in);
  /// Mean milliseconds of one step under `plan`, the slowest rank's (StackLab::time_step on
  /// every rank at once).
  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Runs `steps` in order under `plan` on a fresh group of `tp` ranks: the merged traces;
/// `captures` receives the captures each rank held at the end. tp == 1 runs one rank with no
/// collective (the bits of gpu::run_steps).
std::vector<StepTrace> run_steps_tp(const Config& cfg, const Weights& weights, int tp,
                                    int num_blocks, const std::vector<StepInput>& steps,
                                    const boundary::Plan& plan, int* captures = nullptr,
                                    TpTransport transport = TpTransport::automatic);

}  // namespace dsv32::gpu

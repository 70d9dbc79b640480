// The stack's implementation for one storage type S (StackImpl), its parts declared beside it
// (streams.cuh, faults.cuh, lab.cuh, launch_state.cuh) and its members defined in one file a
// concern: buffers.cu (allocation, uploads), prefix.cu (given prefixes into the caches), ops.cu
// and attention.cu (op dispatch), streams.cu (the indexer's stream), capture.cu (plans,
// captures), trace.cu (the step's trace), faults.cu (planted bugs) and timing.cu (the lab:
// time_step, time_ops, host costs, ablation).
#pragma once

#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../buffers.cuh"
#include "../kernels/index_scores.cuh"
#include "../kernels/launch.cuh"
#include "../kernels/params.cuh"
#include "../kernels/topk_select.cuh"
#include "blas_api.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/stack_lab.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rope.hpp"
#include "faults.cuh"
#include "lab.cuh"
#include "launch_state.cuh"
#include "streams.cuh"

namespace dsv32::gpu {

/// The interface Stack and StackLab forward to, one implementation per storage type.
struct Stack::Impl {
  virtual ~Impl() = default;
  // Serving.
  virtual StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) = 0;
  virtual CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) = 0;
  virtual void prepare(const boundary::Plan& plan, const StepInput& in) = 0;
  virtual StackReport report() = 0;
  // Lab (StackLab).
  virtual void set_mutant(boundary::StackMutant mutant) = 0;
  virtual void set_host_costs(double eager_op_us, double graph_launch_us) = 0;
  virtual void skip_launch(const std::string& label) = 0;
  virtual std::vector<std::string> launch_labels(const StepInput& in) = 0;
  virtual void synthesize_context(const StepInput& in) = 0;
  virtual double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) = 0;
  virtual double last_host_ms() const = 0;
  virtual std::vector<std::pair<Op, double>> time_ops(const StepInput& in, int repeats, bool graph,
                                                      bool device_driven) = 0;
  virtual std::vector<double> residual(int T) = 0;
  Config cfg;
  StackOptions options;
  int device = 0;
};

namespace stack {

/// Elements a slot takes in its widest cache row: the latent and rope part, or the 128 index
/// codes (far blocks place the first slot where this row's offset passes 2^31).
inline long long widest_cache_row(const Config& c) {
  return std::max(c.kv_lora_rank + c.qk_rope_head_dim, 128);
}

using detail::check;
using detail::DeviceBuffer;
template <class S>
using Buf = std::unique_ptr<DeviceBuffer<S>>;

/// One layer's weights, caches and inter-op tensors (per layer, so a step's trace of every
/// layer can be read after the step, also after a graph replay).
template <class S>
struct LayerDev {
  Buf<S> w_qkv_a, g_q, g_kv, w_q_b, w_kv_b, w_o, g_in;
  Buf<S> iw_q_b, iw_kw, ig_k, ib_k;  // iw_kw = [w_k; w_w]
  k::KvCache<S> kv{};
  k::IndexCache index{};
  std::vector<Buf<std::uint8_t>> owned_bytes;
  std::vector<Buf<float>> owned_floats;
  std::vector<Buf<S>> owned_s;
  // Inter-op tensors (max_tokens rows).
  // qpack: the MQA query of each (token, head) as [ql; qR] (L + dr values), so the scores are
  // one product over L + dr; the trace's ql and qR are its two column ranges.
  Buf<S> x, qkv, q_c, q, qpack, kR, c_read, kw, qI, o, y, olat_static, olat_trace;
  Buf<std::uint8_t> q8, k8;
  Buf<float> qscale, omega, kscale, lse;
  Buf<int> topk_trace;
};

/// The stack's device buffers (buffers.cu): every layer's weights, caches and inter-op tensors,
/// the residual stream, the shared top-k rows and the ops' scratch, allocated once for
/// max_tokens rows.
template <class S>
struct DeviceBuffers {
  std::vector<LayerDev<S>> layers;
  Buf<S> h, ypart, parts;  // the residual stream; tensor parallel: o_proj's partial and gathered
  Buf<float> scores, rope_cos, rope_sin, mqa_z, mqa_ml, mqa_acc;
  Buf<S> mqa_keys, mqa_p, uv_rows;
  Buf<int> topk;
  Buf<int> topk_paths;  // k::TopkRowPath counts, added to by every select (captured ones too)
  std::array<Buf<S>, 2> ring;  // the backend's own output buffers: the address rotates
  // Decode context parallelism (cfg.dcp_size > 1): a rank's share of the top-k rows, a scratch
  // for the gather's copy of the sets, and every rank's partial olat and lse.
  Buf<int> dcp_share, dcp_sets;
  Buf<S> dcp_olat;
  Buf<float> dcp_lse;
};

/// The step on the device (upload_step) and its sizes on the host: the capture size T, the
/// real tokens T_a, the longest context; the block table's width and the longest row a cache
/// holds. `live` is the device-driven H ops' metadata (k::Meta::live): [R, short-prefill flag,
/// q, seq_len of each request].
struct StepMeta {
  Buf<int> positions, request_of_token, block_table, live;
  Buf<long long> slots;
  int T = 0, Ta = 0, max_blocks = 1, max_len = 1, longest = 1;
};

/// One stack for storage type S. Its parts, one job each: the streams (Streams, streams.cu),
/// the planted bugs (Faults, faults.cu), the lab's host costs and ablation (lab.cuh,
/// timing.cu), the captures held (capture.cu); the device buffers and the step's metadata
/// (buffers.cu); the ops (ops.cu, attention.cu), each run under a LaunchState; the trace
/// (trace.cu).
template <class S>
class StackImpl final : public Stack::Impl {
 public:
  // buffers.cu
  StackImpl(const Config& c, const Weights& w, int num_blocks, int max_tokens, int dev,
            RankGather* gather, const StackOptions& opt);
  ~StackImpl() override;
  void synthesize_context(const StepInput& in) override;
  std::vector<double> residual(int T) override;
  // capture.cu
  StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) override;
  CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) override;
  void prepare(const boundary::Plan& plan, const StepInput& in) override;
  StackReport report() override;
  // timing.cu
  void set_mutant(boundary::StackMutant mutant) override;
  void set_host_costs(double eager_op_us, double graph_launch_us) override;
  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) override;
  double last_host_ms() const override { return host_step_ms_; }
  std::vector<std::pair<Op, double>> time_ops(const StepInput& in, int repeats, bool graph,
                                              bool device_driven) override;
  void skip_launch(const std::string& label) override;
  std::vector<std::string> launch_labels(const StepInput& in) override;

 private:
  // capture.cu: a plan's graph at a capture size, and the state its eager ops replay with.
  struct Capture {
    std::unique_ptr<BreakableGraph> graph;
    std::unique_ptr<LaunchState> eager;  // capturing while recorded, then not
  };
  /// run without the trace: the step, captured on first use, joined (time_step's warm-up).
  void step(const boundary::Plan& plan, const StepInput& in, bool replay_only);
  /// The serving plan's step enqueued, not joined: its layers run eagerly (graph null: a plan
  /// that captures nothing) or `graph`, its capture at this size, replayed.
  void launch(const boundary::Plan& serving, BreakableGraph* graph);
  /// One plan's graph at capture size T (capture: a dispatch plan's two).
  CaptureInfo capture_one(const boundary::Plan& plan, int T, bool allow_host_capture);
  /// Drops the captures held (a mutant or an ablation changed what they would record).
  void drop_captures();

  // buffers.cu: allocation, the step's inputs, the kernels' geometry and metadata.
  LayerDev<S> make_layer(const LayerWeights& w, int l, long long slots);
  int tiles() const { return (cfg.kv_lora_rank + kDsMlaTile - 1) / kDsMlaTile; }
  k::Dims dims() const;
  k::Meta meta(const LaunchState& st) const;
  void upload_step(const StepInput& in);
  void grow_rope(int positions);
  void place_far(std::vector<long long>& slots) const;
  std::vector<long> topk_row_paths();

  // prefix.cu: the step's given prefixes (StepInput::given) copied from the host into the
  // caches at their requests' slots, in the caches' own format, on the main stream and outside
  // any capture; joined before it returns.
  void store_given(const StepInput& in);

  // ops.cu, attention.cu: one op of layer l at the current capture size (G ops over T rows,
  // H ops over T_a), under `st`.
  void run_op(int l, Op op, LaunchState& st);
  /// How op `op` launches its kernels on stream s (the main stream unless given).
  k::Launch go(const char* op, cudaStream_t s = nullptr);
  void gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
            const char* op, cudaStream_t s = nullptr);
  void norm_rope_cache(int l, LaunchState& st);
  void uk_absorb(int l);
  void indexer_wq_b(int l, cudaStream_t s);
  void fused_q(int l, const LaunchState& st);
  void indexer_topk(int l, const LaunchState& st);
  void sparse_mqa_dcp(int l, const LaunchState& st, const k::Meta& m, int launch_rows, bool aligned,
                      S* olat);
  void attend(int l, const k::Meta& m, int launch_rows, const int* sets, S* olat, S* olat_trace,
              float* lse, k::FinishFault finish = k::FinishFault::none);
  void sparse_mqa(int l, const LaunchState& st);
  void uv_proj(int l, const LaunchState& st);
  void uv_proj_static(int l);
  void indexer_topk_device(int l, const LaunchState& st);
  std::string score_path(k::IndexScoreKernel kernel) const;
  std::string topk_path() const;
  void note_device_paths(int layers = -1);
  void note(const std::string& path, long n = 1) { paths_[path] += n; }
  void o_proj(int l);
  bool uv_gemv(const S* olat) const;
  const S* w_uv(int l) const;
  void uv_small(int l, int rows, const S* olat, S* out, cudaStream_t s, const char* op);
  void uv_gemm(int l, const S* olat, S* o, cudaStream_t s, const char* op);

  // streams.cu: which stream an indexer op runs on, a plan's layers run in order.
  bool use_side(const LaunchState& st) const { return options.overlap && !st.in_eager_segment(); }
  cudaStream_t indexer_stream(const LaunchState& st);
  void run_layers(const boundary::Plan& plan);
  bool wq_b_may_lead(const boundary::Plan& plan, int l) const;

  // trace.cu: every stage of the stage table (oracle/stages.hpp) from its device buffer.
  StepTrace trace();
  /// Where `stage` of layer l (-1: the stack's output) lives on the device: `p`, or, for
  /// the query's two parts, columns [off, off + n) of each (row, head) of rows of `stride`.
  struct Source {
    const void* p;
    int stride = 0, off = 0;
  };
  Source stage_source(Stage stage, int l);
  Tensor download_stage(const StageInfo& stage, const Source& src);

  // timing.cu
  struct Timing {
    double gpu, host;  // ms: the GPU's (CUDA events) and the host's in the launch loop
  };
  template <class F>
  Timing elapsed_ms(const char* what, F&& launch);
  template <class F>
  Timing median_ms(const char* what, F&& launch);

  int num_blocks_, max_tokens_;
  Rope rope_;
  Streams streams_;
  RankGather* gather_ = nullptr;
  DeviceBuffers<S> buf_;
  StepMeta step_;
  // What the ops hand on: the backend ring's next buffer, where the backend wrote, and per
  // layer the buffer uv_proj wrote, which o_proj reads.
  std::size_t ring_next_ = 0;
  S* backend_olat_ = nullptr;
  std::vector<S*> o_ptr_;
  int sms_ = 1;  // the device's SMs

  // Captures keyed by (Plan::record_signature(), capture size): what a plan records, not what
  // it is called; a dispatch plan's two kinds of graph under their own keys.
  std::map<std::pair<std::string, int>, Capture> captures_;
  int leads_ = 0;  // indexer_wq_b launches made at the fork (Stack::report)

  // What served each step and which kernel paths ran how often (Stack::report).
  std::vector<Served> served_;
  std::map<std::string, long> paths_;

  Faults<S> faults_;
  HostCosts costs_;
  Ablation ablation_;
  double host_step_ms_ = 0;  // the last time_step's host time a step
};

}  // namespace stack
}  // namespace dsv32::gpu

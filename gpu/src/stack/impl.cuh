// The stack's implementation for one storage type S, one class whose members live in one file a
// concern: buffers.cu (allocation, uploads), ops.cu and attention.cu (op dispatch), streams.cu
// (the indexer's stream), capture.cu (plans, captures, mutants), trace.cu (the step's trace)
// and timing.cu (time_step, time_ops, ablation).
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
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rope.hpp"

namespace dsv32::gpu {

/// The interface Stack forwards to, one implementation per storage type.
struct Stack::Impl {
  virtual ~Impl() = default;
  virtual StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) = 0;
  virtual CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) = 0;
  virtual std::vector<double> residual(int T) = 0;
  virtual void synthesize_context(const StepInput& in) = 0;
  virtual double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) = 0;
  virtual double last_host_ms() const = 0;
  virtual int capture_count() const = 0;
  virtual std::size_t copy_form_bytes() const = 0;
  virtual int indexer_forks() const = 0;
  /// Rows of each k::TopkRowPath the top-k select took so far (read from the device).
  virtual std::vector<long> topk_row_paths() = 0;
  virtual int indexer_leads() const = 0;
  virtual void set_mutant(const std::string& name) = 0;
  virtual std::vector<std::pair<std::string, double>> time_ops(const StepInput& in, int repeats,
                                                               bool graph, bool device_driven) = 0;
  virtual void skip_launch(const std::string& label) = 0;
  virtual std::vector<std::string> launch_labels(const StepInput& in) = 0;
  Config cfg;
  StackOptions options;
  int device = 0;
  // Stack::set_host_costs: us of host time before each eager op and each graph launch.
  double op_cost_us = 0, graph_cost_us = 0;
  // Stack::served and Stack::kernel_paths: what served each step, which paths ran how often.
  std::vector<Served> served;
  std::map<std::string, long> paths;
  void note(const std::string& path, long n = 1) { paths[path] += n; }
  std::map<std::string, long> reported;  // paths and the device's counts (Stack::kernel_paths)
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

void check_blas(cublasStatus_t s, const char* what);

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

template <class S>
class StackImpl final : public Stack::Impl, private k::LaunchFilter {
 public:
  // buffers.cu
  StackImpl(const Config& c, const Weights& w, int num_blocks, int max_tokens, int dev,
            RankGather* gather, const StackOptions& opt);
  ~StackImpl() override;
  void synthesize_context(const StepInput& in) override;
  std::vector<double> residual(int T) override;
  // capture.cu
  StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) override;
  /// run without the trace: the step, captured on first use, joined (time_step's warm-up).
  void step(const boundary::Plan& plan, const StepInput& in, bool replay_only);
  /// The serving plan's step enqueued, not joined: its layers run eagerly (graph null: a plan
  /// that captures nothing) or `graph`, its capture at this size, replayed.
  void launch(const boundary::Plan& serving, BreakableGraph* graph);
  CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) override;
  /// The plan that runs step `in` under `plan` (Plan::serving, and the mutant full-for-mixed).
  const boundary::Plan& serving_plan(const boundary::Plan& plan, const StepInput& in) const;
  /// One plan's graph at capture size T (capture: a dispatch plan's two).
  CaptureInfo capture_one(const boundary::Plan& plan, int T, bool allow_host_capture);
  void set_mutant(const std::string& name) override;
  int capture_count() const override { return static_cast<int>(captures_.size()); }
  std::size_t copy_form_bytes() const override {
    std::size_t n = 0;
    for (const LayerDev<S>& w : layers_) n += w.olat_static->size() * sizeof(S);
    return n;
  }
  int indexer_forks() const override { return forks_; }
  std::vector<long> topk_row_paths() override;
  int indexer_leads() const override { return leads_; }
  // timing.cu
  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) override;
  double last_host_ms() const override { return host_step_ms_; }
  std::vector<std::pair<std::string, double>> time_ops(const StepInput& in, int repeats, bool graph,
                                                       bool device_driven) override;
  void skip_launch(const std::string& label) override;
  std::vector<std::string> launch_labels(const StepInput& in) override;

 private:
  using Mutant = boundary::StackMutant;

  // buffers.cu: allocation, the step's inputs, the kernels' geometry and metadata.
  LayerDev<S> make_layer(const LayerWeights& w, int l, long long slots);
  int tiles() const { return (cfg.kv_lora_rank + kDsMlaTile - 1) / kDsMlaTile; }
  k::Dims dims() const;
  k::Meta meta() const;
  void upload_step(const StepInput& in);
  void grow_rope(int positions);

  // ops.cu, attention.cu: one op of layer l at the current capture size (G ops over T rows,
  // H ops over T_a).
  void run_op(int l, boundary::Op op);
  /// How op `op` launches its kernels on stream s (the main stream unless given).
  k::Launch go(const char* op, cudaStream_t s = nullptr);
  void gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
            const char* op, cudaStream_t s = nullptr);
  void norm_rope_cache(int l);
  void uk_absorb(int l);
  void indexer_wq_b(int l, cudaStream_t s);
  void fused_q(int l);
  void indexer_topk(int l);
  void sparse_mqa(int l);
  void uv_proj(int l);
  void uv_proj_static(int l);
  void skip_reused_blocks(const StepInput& in, std::vector<long long>& slots);
  void place_far(std::vector<long long>& slots) const;
  void indexer_topk_device(int l);
  k::TopkFault topk_fault() const;
  std::string score_path(k::IndexScoreKernel kernel) const;
  std::string topk_path() const;
  void note_device_paths(int layers = -1);
  void o_proj(int l);
  bool uv_gemv(const S* olat) const;
  const S* w_uv(int l) const;
  void uv_small(int l, int rows, const S* olat, S* out, cudaStream_t s, const char* op);
  void uv_gemm(int l, const S* olat, S* o, cudaStream_t s, const char* op);

  // streams.cu: the indexer's stream.
  bool use_side() const { return options.overlap && !eager_segment_; }
  void fork_side();
  void join_side();
  cudaStream_t indexer_stream();
  void run_layers(const boundary::Plan& plan);
  bool wq_b_may_lead(const boundary::Plan& plan, int l) const;

  // trace.cu: every stage of the stage table (oracle/stages.hpp) from its device buffer.
  StepTrace trace();
  /// Where stage `name` of layer l (-1: the stack's output) lives on the device: `p`, or, for
  /// the query's two parts, columns [off, off + n) of each (row, head) of rows of `stride`.
  struct Source {
    const void* p;
    int stride = 0, off = 0;
  };
  Source stage_source(std::string_view name, int l);
  Tensor download_stage(const StageInfo& stage, const Source& src);

  // timing.cu
  /// Replays `g` with the modelled cost per graph launch (Stack::set_host_costs).
  void replay(BreakableGraph& g);
  /// The modelled host cost of one op run eagerly (none while a graph records).
  void charge_op();
  struct Timing {
    double gpu, host;  // ms: the GPU's (CUDA events) and the host's in the launch loop
  };
  template <class F>
  Timing elapsed_ms(const char* what, F&& launch);
  template <class F>
  Timing median_ms(const char* what, F&& launch);
  bool skip_kernel(const char* op, const void* kernel) override;
  /// Timing ablation (Stack::skip_launch, Stack::launch_labels): true when the launch labelled
  /// label() is the one to skip; records the label while labels are recorded. label() is only
  /// called then, so a normal launch builds no string.
  template <class L>
  bool bypass(L&& label) {
    if (!record_ && skip_.empty()) return false;
    const std::string l = label();
    if (record_) labels_.push_back(l);
    return l == skip_;
  }
  bool bypass_blas(const std::string& op, const std::string& what);
  const std::string& kernel_label(const void* kernel);

  /// While `g` records this stack's ops (capture: a plan's capture, else time_ops's graph):
  /// graph_ set, and on leaving, also by an exception (the graph has then joined and dropped
  /// its capture), the recording's state cleared: no fork open, no indexer_wq_b led.
  struct Recording {
    StackImpl& s;
    Recording(StackImpl& stack, BreakableGraph* g, bool capture) : s(stack) {
      s.graph_ = g;
      s.in_capture_ = capture;
    }
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;
    ~Recording() { s.in_capture_ = false, s.graph_ = nullptr, s.forked_ = false, s.wq_b_led_ = -1; }
  };

  // Buffers: weights, caches, the residual stream and the shared tensors.
  int num_blocks_, max_tokens_;
  Rope rope_;
  std::vector<LayerDev<S>> layers_;
  Buf<S> h_, ypart_, parts_;
  RankGather* gather_ = nullptr;
  Buf<float> scores_, rope_cos_, rope_sin_, mqa_z_, mqa_ml_, mqa_acc_;
  Buf<S> mqa_keys_, mqa_p_, uv_rows_;
  Buf<int> topk_, positions_, request_of_token_, block_table_;
  Buf<int> topk_paths_;  // k::TopkRowPath counts, added to by every select (captured ones too)
  // The device-driven H ops' metadata (k::Meta::live): [R, short-prefill flag, seq_len of each
  // request], written by upload_step with the rest of the step; live_capture_: as a capture
  // saw it (mutants stale-full-metadata, stale-short-prefill). device_ops_: the plan running
  // (or being captured) is device-driven, so the H ops run those variants.
  Buf<int> live_, live_capture_;
  bool device_ops_ = false;
  Buf<long long> slots_;
  // The backend's own output buffers: the address rotates call to call.
  std::array<Buf<S>, 2> ring_;
  std::size_t ring_next_ = 0;
  S* backend_olat_ = nullptr;
  std::vector<S*> o_ptr_;  // per layer: the buffer uv_proj wrote, which o_proj reads
  // The step: capture size, real tokens, the longest context; the device's SMs.
  int T_ = 0, Ta_ = 0, max_blocks_ = 1, max_len_ = 1, longest_ = 1, sms_ = 1;

  // Streams: the main stream and cuBLAS on it; the indexer's stream (use_side), its fork and
  // join, its own cuBLAS handle and workspace. graph_: the recording in progress, whose fork
  // and join the streams' are while a graph op records.
  cudaStream_t stream_ = nullptr, aux_ = nullptr;
  cublasHandle_t blas_ = nullptr, blas_aux_ = nullptr;
  Buf<std::uint8_t> workspace_, workspace_aux_;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool forked_ = false;
  int forks_ = 0;
  BreakableGraph* graph_ = nullptr;
  // This layer's indexer_wq_b may lead (wq_b_may_lead); the layer whose indexer_wq_b was
  // launched at the fork (-1: none), so that the op itself launches nothing.
  bool lead_ = false;
  int wq_b_led_ = -1;
  int leads_ = 0;

  // Captures keyed by (Plan::record_signature(), capture size): what a plan records, not what
  // it is called; a dispatch plan's two kinds of graph under their own keys.
  std::map<std::pair<std::string, int>, std::unique_ptr<BreakableGraph>> captures_;
  bool in_capture_ = false, in_graph_ = false, eager_segment_ = false;

  // Mutants (BOUNDARIES.md section 4) and the state they need.
  Mutant mutant_ = Mutant::none;
  std::map<int, bool> baked_short_;
  std::map<int, int> block_owner_;  // reused-block-skip: the request each block last served
  std::vector<Buf<S>> fresh_;
  Buf<int> positions_snapshot_;
  cudaStream_t side_ = nullptr;

  // Timing: the last time_step's host time a step; the ablation's launch to skip ("" none),
  // and the labels of the launches made while record_ is on.
  double host_step_ms_ = 0;
  std::string skip_;
  bool record_ = false;
  std::vector<std::string> labels_;
  std::map<const void*, std::string> kernel_labels_;  // kernel_label's
};

}  // namespace stack
}  // namespace dsv32::gpu

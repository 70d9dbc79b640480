#include "dsv32/gpu/stack.hpp"

#include <cublas_v2.h>
#include <cxxabi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <tuple>

#include "check.cuh"
#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rng.hpp"
#include "dsv32/oracle/rope.hpp"
#include "ops.cuh"

namespace dsv32::gpu {
namespace {

using detail::check;
using detail::DeviceBuffer;

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

/// A switch of the stack's kernels that is on unless the environment variable `var` is "0".
bool switched_on(const char* var) {
  const char* v = std::getenv(var);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

template <class S>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<S, float> ? CUDA_R_32F : CUDA_R_16BF;
}
template <class S>
constexpr cublasComputeType_t compute_type() {
  return std::is_same_v<S, float> ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
}

template <class S>
S to_storage(double v) {
  if constexpr (std::is_same_v<S, float>)
    return static_cast<float>(v);
  else
    return __float2bfloat16_rn(static_cast<float>(v));
}
template <class S>
double from_storage(S v) {
  if constexpr (std::is_same_v<S, float>)
    return v;
  else
    return static_cast<double>(__bfloat162float(v));
}

/// A device array of S initialised from a host matrix/vector of doubles (exact bf16 values).
template <class S>
std::unique_ptr<DeviceBuffer<S>> upload(const double* data, std::size_t n) {
  std::vector<S> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = to_storage<S>(data[i]);
  auto buf = std::make_unique<DeviceBuffer<S>>(n);
  check(cudaMemcpy(buf->get(), host.data(), n * sizeof(S), cudaMemcpyHostToDevice),
        "upload weights");
  return buf;
}

template <class T>
std::unique_ptr<DeviceBuffer<T>> zeros(std::size_t n, int byte = 0) {
  auto buf = std::make_unique<DeviceBuffer<T>>(std::max<std::size_t>(n, 1));
  check(cudaMemset(buf->get(), byte, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMemset");
  return buf;
}

/// Opts both index-score kernels in to the shared memory they need for d (on the current
/// device); returns that size.
std::size_t allow_index_scores_smem(const k::Dims& d) {
  const std::size_t smem = k::index_scores_smem(d);
  for (const void* f : {reinterpret_cast<const void*>(k::index_scores_grouped),
                        reinterpret_cast<const void*>(k::index_scores_keys)})
    check(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "index_scores shared memory");
  return smem;
}

/// A device copy of `host` (`what` names it in an error).
template <class T>
std::unique_ptr<DeviceBuffer<T>> upload(const std::vector<T>& host, const char* what) {
  auto buf = zeros<T>(host.size());
  check(cudaMemcpy(buf->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return buf;
}

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> out(n);
  if (n) check(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download trace");
  return out;
}

}  // namespace

struct Stack::Impl {
  virtual ~Impl() = default;
  virtual StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) = 0;
  virtual CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) = 0;
  virtual std::vector<double> residual(int T) = 0;
  virtual void synthesize_context(const StepInput& in) = 0;
  virtual double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) = 0;
  virtual double last_host_ms() const = 0;
  virtual int capture_count() const = 0;
  virtual int indexer_forks() const = 0;
  virtual int indexer_leads() const = 0;
  virtual void set_mutant(const std::string& name) = 0;
  virtual std::vector<std::pair<std::string, double>> time_ops(const StepInput& in, int repeats,
                                                               bool graph) = 0;
  virtual void skip_launch(const std::string& label) = 0;
  virtual std::vector<std::string> launch_labels(const StepInput& in) = 0;
  Config cfg;
  int device = 0;
};

namespace {

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

template <class S>
class StackImpl final : public Stack::Impl {
 public:
  StackImpl(const Config& c, const Weights& w, int num_blocks, int max_tokens, int dev,
            RankGather* gather)
      : num_blocks_(num_blocks), max_tokens_(max_tokens), rope_(c), gather_(gather) {
    cfg = c;
    device = dev;
    cfg.validate();
    w.check_shapes(cfg);
    if (max_tokens < 1) throw std::invalid_argument("gpu stack: max_tokens must be >= 1");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // The indexer's stream (run_op, "Two streams"): the highest priority, so that its
    // latency-bound kernels get SMs as the projections on the main stream free them.
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&aux_, cudaStreamNonBlocking, greatest), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming), "cudaEventCreate");
    // A handle and a fixed workspace per stream: cuBLAS allocates nothing while a stream is
    // captured, and two products running at once must not share a workspace.
    for (auto [handle, s, ws] : {std::tuple{&blas_, stream_, &workspace_},
                                 std::tuple{&blas_aux_, aux_, &workspace_aux_}}) {
      check_blas(cublasCreate(handle), "cublasCreate");
      check_blas(cublasSetStream(*handle, s), "cublasSetStream");
      check_blas(cublasSetMathMode(*handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
      *ws = zeros<std::uint8_t>(32u << 20);
      check_blas(cublasSetWorkspace(*handle, (*ws)->get(), 32u << 20), "cublasSetWorkspace");
    }
    const long long slots = static_cast<long long>(num_blocks) * cfg.block_size;
    for (int l = 0; l < cfg.num_layers; ++l) layers_.push_back(make_layer(w.layers[l], l, slots));
    const std::size_t T = static_cast<std::size_t>(max_tokens);
    h_ = zeros<S>(T * cfg.hidden_size);
    topk_ = zeros<int>(T * cfg.index_topk, 0xFF);
    for (auto& r : ring_) r = zeros<S>(T * cfg.num_heads * cfg.kv_lora_rank);
    positions_ = zeros<int>(T);
    positions_snapshot_ = zeros<int>(T);
    for (auto& ld : layers_) o_ptr_.push_back(ld.o->get());
    slots_ = zeros<long long>(T);
    request_of_token_ = zeros<int>(T);
    max_blocks_ = num_blocks;  // a request can own at most every block
    block_table_ = zeros<int>(T * static_cast<std::size_t>(max_blocks_), 0xFF);
    max_len_ = num_blocks * cfg.block_size;  // no context can exceed the cache
    scores_ = zeros<float>(T * static_cast<std::size_t>(max_len_));
    grow_rope(max_len_);
    // sparse_mqa: the gathered keys, scores, P (S), P.V in fp32, each row's max and sum.
    const std::size_t HK = static_cast<std::size_t>(cfg.num_heads) * cfg.index_topk;
    mqa_keys_ = zeros<S>(T * cfg.index_topk *
                         static_cast<std::size_t>(cfg.kv_lora_rank + cfg.qk_rope_head_dim));
    mqa_z_ = zeros<float>(T * HK);
    mqa_p_ = zeros<S>(T * HK);
    mqa_acc_ = zeros<float>(T * cfg.num_heads * static_cast<std::size_t>(cfg.kv_lora_rank));
    mqa_ml_ = zeros<float>(T * cfg.num_heads * 2);
    uv_rows_ = zeros<S>(T * cfg.num_heads * static_cast<std::size_t>(cfg.v_head_dim));
    if (gather_) {  // o_proj's partial rows and every rank's, gathered
      ypart_ = zeros<S>(T * cfg.hidden_size);
      parts_ = zeros<S>(T * cfg.hidden_size * static_cast<std::size_t>(gather_->ranks()));
    }
    T_ = 1;
    check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device),
          "cudaDeviceGetAttribute");
    allow_index_scores_smem(dims());
    for (int rows = 1; rows <= k::kGemvMaxRows; ++rows)  // every uk_small instantiation
      with_rows(rows, [](auto R) {
        check(cudaFuncSetAttribute(k::uk_small<S, decltype(R)::value>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(k::kUkSmemMax)),
              "uk_small shared memory");
      });
    check(cudaDeviceSynchronize(), "stack setup");
  }

  ~StackImpl() override {
    captures_.clear();
    if (side_) cudaStreamDestroy(side_);
    cublasDestroy(blas_aux_);
    cublasDestroy(blas_);
    cudaEventDestroy(join_ev_);
    cudaEventDestroy(fork_ev_);
    cudaStreamDestroy(aux_);
    cudaStreamDestroy(stream_);
  }

  StepTrace run(const boundary::Plan& plan, const StepInput& in, bool replay_only) override {
    const int T = in.capture_size;
    if (T > max_tokens_)
      throw std::invalid_argument("gpu stack: capture size " + std::to_string(T) +
                                  " exceeds max_tokens " + std::to_string(max_tokens_));
    if (in.hidden.rows() != T || static_cast<int>(in.positions.size()) != T)
      throw ScenarioError("gpu stack: step input is not derived");
    if (static_cast<int>(in.requests.size()) > max_tokens_)
      throw ScenarioError("gpu stack: more requests than max_tokens");
    upload_step(in);
#ifdef DSV32_TIMELINE
    reset_timeline();
#endif
    if (!plan.capture) {
      run_layers(plan);
    } else {
      auto it = captures_.find({plan.name, T});
      if (it == captures_.end()) {
        if (replay_only)
          throw boundary::PlanError("plan '" + plan.name + "' was not captured at capture size " +
                                    std::to_string(T));
        capture(plan, T, false);
        upload_step(in);  // capture ran its eager ops on empty metadata
        it = captures_.find({plan.name, T});
      }
      it->second->replay();
    }
    check(cudaStreamSynchronize(stream_), ("step under plan " + plan.name).c_str());
#ifdef DSV32_TIMELINE
    dump_timeline(plan.name, T);
#endif
    if (side_) check(cudaStreamSynchronize(side_), "side stream");
    return trace();
  }

#ifdef DSV32_TIMELINE
  /// Forgets the blocks recorded so far (development builds).
  static void reset_timeline() {
    const unsigned int zero = 0;
    check(cudaMemcpyToSymbol(k::g_timeline_n, &zero, sizeof zero), "timeline");
  }
  /// The step's block records into $DSV32_TIMELINE_DIR/NNN-plan-T.csv (development builds).
  void dump_timeline(const std::string& plan, int T) {
    const char* dir = std::getenv("DSV32_TIMELINE_DIR");
    if (!dir) return;
    unsigned int n = 0;
    check(cudaMemcpyFromSymbol(&n, k::g_timeline_n, sizeof n), "timeline");
    n = std::min(n, k::kTimelineMax);
    std::vector<k::TimelineRecord> r(n);
    if (n) check(cudaMemcpyFromSymbol(r.data(), k::g_timeline, n * sizeof(r[0])), "timeline");
    static int calls = 0;
    char name[512];
    std::snprintf(name, sizeof name, "%s/%03d-%s-T%d.csv", dir, calls++, plan.c_str(), T);
    if (FILE* f = std::fopen(name, "w")) {
      std::fprintf(f, "grid,resident,start,sm,block,blocks,threads\n");
      for (const auto& x : r)
        std::fprintf(f, "%llu,%llu,%llu,%u,%u,%u,%u\n", x.grid, x.resident, x.start, x.sm, x.block,
                     x.blocks, x.threads);
      std::fclose(f);
    }
  }
#endif

  void synthesize_context(const StepInput& in) override {
    const k::Dims d = dims();
    for (const RequestStep& r : in.requests) {
      if (r.ctx == 0) continue;
      auto table = zeros<int>(r.block_table.size());
      check(cudaMemcpy(table->get(), r.block_table.data(), r.block_table.size() * sizeof(int),
                       cudaMemcpyHostToDevice),
            "synthesize");
      for (int l = 0; l < cfg.num_layers; ++l)
        k::synthesize<S><<<r.ctx, 128, 0, stream_>>>(d, table->get(), r.ctx, layers_[l].kv,
                                                     layers_[l].index, cfg.is_full_layer(l));
      check(cudaStreamSynchronize(stream_), "synthesize");
    }
  }

  double time_step(const boundary::Plan& plan, const StepInput& in, int repeats) override {
    run(plan, in, false);  // warm-up; captures on first use
    const auto it = captures_.find({plan.name, in.capture_size});
    const auto step = [&] {
      if (!plan.capture)
        run_layers(plan);
      else
        it->second->replay();
    };
    const Timing t = median_ms("time step", [&] {
      for (int i = 0; i < repeats; ++i) step();
    });
    const double ms = t.gpu / repeats;
    host_step_ms_ = t.host / repeats;
#ifdef DSV32_TIMELINE
    reset_timeline();  // one more step, recorded
    step();
    check(cudaDeviceSynchronize(), "timeline");
    dump_timeline("timed-" + plan.name, in.capture_size);
#endif
    return ms;
  }

  std::vector<std::pair<std::string, double>> time_ops(const StepInput& in, int repeats,
                                                       bool graph) override {
    const boundary::Plan eager = boundary::plan_preset("eager", cfg);
    run(eager, in, false);
    upload_step(in);
    std::vector<std::string> ops = eager.ops(cfg, 0);
    ops.insert(ops.end() - 2, {"latent_copy", "uv_proj_static"});
    std::vector<std::pair<std::string, double>> out;
    lead_ = false;  // each op alone: indexer_wq_b is timed as its own op
    for (const std::string& op : ops) {
      const auto run_repeats = [&](int n) {  // each run joined: the op alone, end to end
        for (int i = 0; i < n; ++i) {
          run_op(0, op);
          join_side();
        }
      };
      run_repeats(1);  // warm-up
      if (!graph) {
        const double ms = median_ms(("time op " + op).c_str(), [&] { run_repeats(repeats); }).gpu;
        out.emplace_back(op, ms / repeats);
        continue;
      }
      // The repeats captured as one graph and replayed: the GPU's time, not the host's
      // launches (host values, such as the backend ring's address, are those of the capture).
      const std::string what = "time op " + op + " (graph)";
      BreakableGraph g(stream_, std::vector<Stream>{aux_});
      const Recording recording(*this, &g, false);
      g.begin();
      g.graph(op, [&] { run_repeats(repeats); });
      g.end();
      g.replay();  // warm-up
      const double ms = median_ms(what.c_str(), [&] { g.replay(); }).gpu;
      out.emplace_back(op, ms / repeats);
    }
    return out;
  }

  std::vector<double> residual(int T) override {
    const std::vector<S> host = download(h_->get(), static_cast<std::size_t>(T) * cfg.hidden_size);
    std::vector<double> out(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) out[i] = from_storage(host[i]);
    return out;
  }

  CaptureInfo capture(const boundary::Plan& plan, int T, bool allow_host_capture) override {
    boundary::validate(plan, cfg, allow_host_capture);
    if (!plan.capture) throw boundary::PlanError("plan '" + plan.name + "' captures nothing");
    if (T > max_tokens_)
      throw boundary::PlanError("capture size " + std::to_string(T) + " exceeds max_tokens");
    cudaStreamCaptureStatus status;
    check(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
    if (status != cudaStreamCaptureStatusNone)
      throw GraphError("nested capture: the stack's stream is already being captured");
    // Empty metadata: every row padded, no real token; eager ops then have no work.
    StepInput empty;
    empty.capture_size = T;
    empty.num_tokens = 0;
    empty.positions.assign(T, 0);
    empty.slots.assign(T, -1);
    empty.hidden = Mat::Ones(T, cfg.hidden_size);
    upload_step(empty);
    const int forks = forks_, leads = leads_;  // the warm-up's are not the plan's
    run_layers(plan);                          // warm-up on the capture stream
    forks_ = forks, leads_ = leads;
    check(cudaStreamSynchronize(stream_), "capture warm-up");
    upload_step(empty);  // ones again: a graph op that ran during capture would change them
    // What a graph would bake if it read host values (mutant stale-positions).
    check(cudaMemcpyAsync(positions_snapshot_->get(), positions_->get(), T * sizeof(int),
                          cudaMemcpyDeviceToDevice, stream_),
          "positions snapshot");
    auto graph = std::make_unique<BreakableGraph>(stream_, std::vector<Stream>{aux_});
    const Recording recording(*this, graph.get(), true);
    struct Reset {
      bool& a;
      ~Reset() { a = false; }
    };
    graph->begin();
    for (int l = 0; l < cfg.num_layers; ++l) {
      lead_ = wq_b_may_lead(plan, l);
      for (const std::string& op : plan.ops(cfg, l)) {
        const std::string where = "layer" + std::to_string(l) + "/" + op;
        if (plan.at(l, op) == boundary::Placement::graph) {
          graph->graph(where, [&] {
            in_graph_ = true;
            Reset g{in_graph_};
            run_op(l, op);
          });
        } else {        // runs now on empty metadata (no real rows), and again at every replay
          join_side();  // into the segment the eager op ends
          graph->eager(where, [this, l, op] {
            eager_segment_ = true;
            Reset g{eager_segment_};
            run_op(l, op);
          });
        }
      }
    }
    join_side();
    const CaptureInfo info = graph->end();
    captures_[{plan.name, T}] = std::move(graph);
    return info;
  }

  int capture_count() const override {
    return static_cast<int>(captures_.size());
  }
  int indexer_forks() const override {
    return forks_;
  }
  int indexer_leads() const override {
    return leads_;
  }

  void set_mutant(const std::string& name) override {
    if (!name.empty()) {
      const auto& names = boundary::mutant_names();
      if (std::find(names.begin(), names.end(), name) == names.end() ||
          boundary::is_plan_mutant(name))
        throw boundary::PlanError("'" + name +
                                  "' is not a stack mutant (plan mutants go through "
                                  "boundary::mutate_plan)");
    }
    if (name == "unjoined-stream" && !side_)
      check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "side stream");
    mutant_ = name;
    captures_.clear();  // captures recorded without the mutant would hide it
    baked_short_.clear();
  }

  void skip_launch(const std::string& label) override {
    if (label == skip_) return;  // the captures held were recorded with the same launches
    skip_ = label;
    captures_.clear();  // a capture recorded with a launch missing must not replay for a step
  }

  std::vector<std::string> launch_labels(const StepInput& in) override {
    labels_.clear();
    record_ = true;
    try {
      run(boundary::plan_preset("eager", cfg), in, false);
    } catch (...) {
      record_ = false;
      throw;
    }
    record_ = false;
    return labels_;
  }

 private:
  /// Milliseconds the work `launch` enqueues on the stack's stream takes on the GPU (CUDA
  /// events), and the host's milliseconds in `launch` itself (enqueuing, or blocked where the
  /// launch queue was full).
  struct Timing {
    double gpu, host;
  };
  template <class F>
  Timing elapsed_ms(const char* what, F&& launch) {
    struct Events {
      cudaEvent_t a = nullptr, b = nullptr;
      ~Events() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
      }
    } e;
    check(cudaEventCreate(&e.a), what);
    check(cudaEventCreate(&e.b), what);
    check(cudaEventRecord(e.a, stream_), what);
    const auto t0 = std::chrono::steady_clock::now();
    launch();
    const double host =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    check(cudaEventRecord(e.b, stream_), what);
    check(cudaEventSynchronize(e.b), what);
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, e.a, e.b), what);
    return {ms, host};
  }

  /// The medians of kTimingBatches timings of `launch`, the GPU's and the host's (a host stall
  /// or a clock change in one batch does not move them).
  static constexpr int kTimingBatches = 3;
  template <class F>
  Timing median_ms(const char* what, F&& launch) {
    std::array<double, kTimingBatches> gpu{}, host{};
    for (int b = 0; b < kTimingBatches; ++b) {
      const Timing t = elapsed_ms(what, launch);
      gpu[b] = t.gpu;
      host[b] = t.host;
    }
    std::sort(gpu.begin(), gpu.end());
    std::sort(host.begin(), host.end());
    return {gpu[kTimingBatches / 2], host[kTimingBatches / 2]};
  }
  double last_host_ms() const override {
    return host_step_ms_;
  }

  LayerDev<S> make_layer(const LayerWeights& w, int l, long long slots) {
    LayerDev<S> ld;
    const auto up = [](const auto& m) {
      return upload<S>(m.data(), static_cast<std::size_t>(m.size()));
    };
    ld.w_qkv_a = up(w.w_qkv_a);
    ld.g_q = up(w.g_q);
    ld.g_kv = up(w.g_kv);
    ld.w_q_b = up(w.w_q_b);
    ld.w_kv_b = up(w.w_kv_b);
    ld.w_o = up(w.w_o);
    ld.g_in = up(w.g_in);
    const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, H = cfg.num_heads;
    const int HI = cfg.index_n_heads, dI = cfg.index_head_dim;
    if (cfg.kv_cache == KvCache::fp8_ds_mla) {
      ld.owned_bytes.push_back(zeros<std::uint8_t>(slots * L));
      ld.kv.codes = ld.owned_bytes.back()->get();
      ld.owned_floats.push_back(zeros<float>(slots * tiles()));
      ld.kv.scales = ld.owned_floats.back()->get();
    } else {
      ld.owned_s.push_back(zeros<S>(slots * L, 0xFF));  // NaN-poisoned: a wrong read shows up
      ld.kv.latent = ld.owned_s.back()->get();
    }
    ld.owned_s.push_back(zeros<S>(slots * dr, 0xFF));
    ld.kv.rope = ld.owned_s.back()->get();
    if (cfg.is_full_layer(l)) {
      const IndexerWeights& iw = *w.indexer;
      ld.iw_q_b = up(iw.w_q_b);
      Mat kw(iw.w_k.rows() + iw.w_w.rows(), iw.w_k.cols());
      kw << iw.w_k, iw.w_w;
      ld.iw_kw = up(kw);
      ld.ig_k = up(iw.g_k);
      ld.ib_k = up(iw.b_k);
      ld.owned_bytes.push_back(zeros<std::uint8_t>(slots * dI, 0x7F));
      ld.index.codes = ld.owned_bytes.back()->get();
      ld.owned_floats.push_back(zeros<float>(slots, 0xFF));
      ld.index.scales = ld.owned_floats.back()->get();
    }
    const std::size_t T = static_cast<std::size_t>(max_tokens_);
    ld.x = zeros<S>(T * cfg.hidden_size);
    ld.qkv = zeros<S>(T * cfg.qkv_a_rows());
    ld.q_c = zeros<S>(T * cfg.q_lora_rank);
    ld.q = zeros<S>(T * H * cfg.qk_head_dim());
    ld.qpack = zeros<S>(T * H * (L + dr));
    ld.kR = zeros<S>(T * dr);
    ld.c_read = zeros<S>(T * L);
    ld.kw = zeros<S>(T * (dI + HI));
    ld.qI = zeros<S>(T * HI * dI);
    ld.o = zeros<S>(T * H * cfg.v_head_dim);
    ld.y = zeros<S>(T * cfg.hidden_size);
    ld.olat_static = zeros<S>(T * H * L);
    ld.olat_trace = zeros<S>(T * H * L);
    ld.q8 = zeros<std::uint8_t>(T * HI * dI);
    ld.k8 = zeros<std::uint8_t>(T * dI);
    ld.qscale = zeros<float>(T * HI);
    ld.omega = zeros<float>(T * HI);
    ld.kscale = zeros<float>(T);
    ld.lse = zeros<float>(T * H);
    ld.topk_trace = zeros<int>(T * cfg.index_topk);
    return ld;
  }

  int tiles() const {
    return (cfg.kv_lora_rank + kDsMlaTile - 1) / kDsMlaTile;
  }

  k::Dims dims() const {
    k::Dims d{};
    d.T = T_;
    d.D = cfg.hidden_size;
    d.H = cfg.num_heads;
    d.Rq = cfg.q_lora_rank;
    d.L = cfg.kv_lora_rank;
    d.dn = cfg.qk_nope_head_dim;
    d.dr = cfg.qk_rope_head_dim;
    d.dv = cfg.v_head_dim;
    d.HI = cfg.index_n_heads;
    d.dI = cfg.index_head_dim;
    d.K = cfg.index_topk;
    d.B = cfg.block_size;
    d.max_blocks = max_blocks_;
    d.eps = static_cast<float>(cfg.rms_norm_eps);
    d.ieps = static_cast<float>(cfg.indexer_norm_eps);
    d.sigma = static_cast<float>(cfg.softmax_scale());
    d.head_norm = static_cast<float>(
        1.0 / std::sqrt(static_cast<double>(cfg.index_head_dim) * cfg.index_n_heads));
    d.neox = cfg.indexer_rope == IndexerRope::neox;
    d.hadamard = cfg.hadamard == Hadamard::on;
    d.fp8_kv = cfg.kv_cache == KvCache::fp8_ds_mla;
    d.tiles = tiles();
    d.padded_write = mutant_ == "padded-cache-write";
    return d;
  }

  k::Meta meta() const {
    const int* pos =
        mutant_ == "stale-positions" && in_graph_ ? positions_snapshot_->get() : positions_->get();
    return {pos,
            slots_->get(),
            request_of_token_->get(),
            block_table_->get(),
            rope_cos_->get(),
            rope_sin_->get()};
  }

  /// The step's inputs into the static buffers (device) and its host metadata (this object).
  void upload_step(const StepInput& in) {
    const int T = in.capture_size;
    T_ = T;
    Ta_ = in.num_tokens;
    std::vector<S> hid(static_cast<std::size_t>(T) * cfg.hidden_size);
    for (std::size_t i = 0; i < hid.size(); ++i) hid[i] = to_storage<S>(in.hidden.data()[i]);
    check(cudaMemcpyAsync(h_->get(), hid.data(), hid.size() * sizeof(S), cudaMemcpyHostToDevice,
                          stream_),
          "upload hidden");
    const std::vector<long long> slots(in.slots.begin(), in.slots.end());
    check(cudaMemcpyAsync(positions_->get(), in.positions.data(), T * sizeof(int),
                          cudaMemcpyHostToDevice, stream_),
          "upload positions");
    check(cudaMemcpyAsync(slots_->get(), slots.data(), T * sizeof(long long),
                          cudaMemcpyHostToDevice, stream_),
          "upload slots");
    if (Ta_ > 0)
      check(cudaMemcpyAsync(request_of_token_->get(), in.request_of_token.data(), Ta_ * sizeof(int),
                            cudaMemcpyHostToDevice, stream_),
            "upload request_of_token");
    std::vector<int> table(in.requests.size() * max_blocks_, -1);
    int longest = 1;
    for (std::size_t r = 0; r < in.requests.size(); ++r) {
      if (in.requests[r].block_table.size() > static_cast<std::size_t>(max_blocks_))
        throw ScenarioError("gpu stack: a block table is longer than the cache");
      std::copy(in.requests[r].block_table.begin(), in.requests[r].block_table.end(),
                table.begin() + r * max_blocks_);
      longest = std::max(longest, in.requests[r].seq_len());
    }
    if (!table.empty())
      check(cudaMemcpyAsync(block_table_->get(), table.data(), table.size() * sizeof(int),
                            cudaMemcpyHostToDevice, stream_),
            "upload block table");
    longest_ = longest;
    check(cudaStreamSynchronize(stream_), "upload step");  // host vectors die here
  }

  void grow_rope(int positions) {
    const int half = cfg.qk_rope_head_dim / 2;
    std::vector<float> c(static_cast<std::size_t>(positions) * half), s(c.size());
    for (int p = 0; p < positions; ++p)
      for (int i = 0; i < half; ++i) {
        c[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.cos(p, i));
        s[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.sin(p, i));
      }
    rope_cos_ = zeros<float>(c.size());
    rope_sin_ = zeros<float>(s.size());
    check(cudaMemcpy(rope_cos_->get(), c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice),
          "rope table");
    check(cudaMemcpy(rope_sin_->get(), s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice),
          "rope table");
  }

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
  /// A cuBLAS call of op `op` ("op:cuBLAS what", without a leading "op " in `what`).
  bool bypass_blas(const std::string& op, const std::string& what) {
    return bypass([&] {
      return op + ":cuBLAS " + (what.rfind(op + " ", 0) == 0 ? what.substr(op.size() + 1) : what);
    });
  }
  /// A kernel's name without namespaces, template arguments or parameters ("gemv"), worked out
  /// once a kernel: the driver's lookup and the demangling per launch made an ablation's eager
  /// steps host-bound (docs/PERFORMANCE.md).
  const std::string& kernel_label(const void* kernel) {
    auto [it, fresh] = kernel_labels_.try_emplace(kernel);
    if (fresh) it->second = demangled_label(kernel);
    return it->second;
  }
  static std::string demangled_label(const void* kernel) {
    const char* mangled = nullptr;
    if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) {
      cudaGetLastError();
      return "kernel";
    }
    int status = 0;
    char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string name = status == 0 && plain ? plain : mangled;
    std::free(plain);
    name = name.substr(0, name.find('('));
    name = name.substr(0, name.find('<'));
    if (const auto at = name.rfind("::"); at != std::string::npos) name = name.substr(at + 2);
    if (const auto at = name.rfind(' '); at != std::string::npos) name = name.substr(at + 1);
    return name;
  }

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

  /// Two streams. An F layer's indexer (fused_q's indexer part, indexer_topk) runs on aux_,
  /// forked from the main stream after norm_rope_cache (which writes everything it reads) and
  /// joined before sparse_mqa (which reads its top-k rows), so that it overlaps q_b_proj,
  /// uk_absorb and fused_q's rotation on the main stream. indexer_wq_b, the indexer's first
  /// op, runs on the main stream just before the fork, ahead of q_b_proj, where the whole
  /// indexer runs forked (wq_b_may_lead; else on aux_): alone it streams its weight at full
  /// bandwidth and its successors start sooner than beside q_b_proj. Bits do not change: the
  /// same kernels on the same data, and the two branches write disjoint buffers. Inside a graph
  /// segment the fork and the join are captured (graph_); an eager segment of a captured plan
  /// runs on the main stream alone; a sequence of ops that ends with the fork open is joined
  /// by its caller (run_layers, time_ops, the capture before each eager op and at the end).
  /// DSV32_OVERLAP=0: one stream (A/B timing).
  bool use_side() const {
    return overlap_ && !eager_segment_;
  }
  /// `waiter` waits for the work enqueued on `on` so far (through event ev).
  static void wait_for(cudaStream_t waiter, cudaStream_t on, cudaEvent_t ev, const char* what) {
    check(cudaEventRecord(ev, on), what);
    check(cudaStreamWaitEvent(waiter, ev, 0), what);
  }
  void fork_side() {
    if (graph_)
      graph_->fork(0);
    else
      wait_for(aux_, stream_, fork_ev_, "fork the indexer's stream");
    forked_ = true;
    ++forks_;
  }
  void join_side() {
    if (!forked_) return;
    if (graph_)
      graph_->join(0);
    else
      wait_for(stream_, aux_, join_ev_, "join the indexer's stream");
    forked_ = false;
  }
  /// The stream of an indexer op: aux_ (forked now if it is not), or the main stream.
  cudaStream_t indexer_stream() {
    if (!use_side()) return stream_;
    if (!forked_) fork_side();
    return aux_;
  }
  /// Every layer's ops of `plan`, launched in order (no capture), the indexer stream joined.
  void run_layers(const boundary::Plan& plan) {
    for (int l = 0; l < cfg.num_layers; ++l) {
      lead_ = wq_b_may_lead(plan, l);
      for (const std::string& op : plan.ops(cfg, l)) run_op(l, op);
    }
    join_side();
  }
  /// Whether layer l's indexer_wq_b may be launched at the fork, on the main stream ahead of
  /// q_b_proj and uk_absorb (run_op's norm_rope_cache): an F layer whose ops from
  /// norm_rope_cache to indexer_topk run in one forked stretch, so that the move changes no
  /// segment and the indexer's chain it starts sooner runs on to the join: the eager plan, or
  /// a plan that captures all six (indexer_topk is an H op: mutant plans only). Where
  /// indexer_topk is an eager op (`narrow`) the chain stops at the segment's end anyway, and
  /// leading only puts indexer_wq_b in series with q_b_proj (2-4 us slower at T >= 2,
  /// measured). DSV32_WQB_LEAD=0: never (A/B timing).
  bool wq_b_may_lead(const boundary::Plan& plan, int l) const {
    if (!wq_b_lead_ || !cfg.is_full_layer(l)) return false;
    if (!plan.capture) return true;
    for (const char* op :
         {"norm_rope_cache", "q_b_proj", "uk_absorb", "indexer_wq_b", "fused_q", "indexer_topk"})
      if (plan.at(l, op) != boundary::Placement::graph) return false;
    return true;
  }

  /// Launches one of the ops' kernels on stream s, with programmatic stream serialization
  /// unless DSV32_PDL=0 (k::stream_order; docs/DECISIONS.md, "PDL"). `what` names the op in
  /// the error.
  template <class... P, class... A>
  void launch(const char* what, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem,
              cudaStream_t s, A&&... args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = &attr;
    c.numAttrs = pdl_ ? 1 : 0;
    if (bypass([&] {
          return std::string(what) + ":" + kernel_label(reinterpret_cast<const void*>(kernel));
        }))
      return;
    check(cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...), what);
  }

  /// k::gemv over `batch` products (product b: x + b xs, w + b ws, y + b ys).
  void gemv(const S* x, int ldx, long long xs, const S* w, long long ws, S* y, int ldy,
            long long ys, int batch, int rows, int n, int kdim, const char* op,
            cudaStream_t s = nullptr) {
    const int ksplit = k::gemv_ksplit(n, kdim, sms_, batch);
    const int per_block = k::kGemvOuts * (k::kGemvWarps / ksplit);
    const dim3 grid(static_cast<unsigned>((n + per_block - 1) / per_block),
                    static_cast<unsigned>(batch));
    with_rows(rows, [&](auto R) {
      launch(op, k::gemv<S, decltype(R)::value>, grid, k::kGemvThreads, 0, s ? s : stream_, x, ldx,
             xs, w, ws, y, ldy, ys, n, kdim, ksplit, evict_first_);
    });
  }

  /// f(std::integral_constant<int, rows>) for rows 1 .. k::kGemvMaxRows: the kernels of decode
  /// batches are instantiated per row count.
  template <class F>
  static void with_rows(int rows, F&& f) {
    static_assert(k::kGemvMaxRows == 4, "one instantiation per row count");
    switch (rows) {
      case 1:
        f(std::integral_constant<int, 1>{});
        break;
      case 2:
        f(std::integral_constant<int, 2>{});
        break;
      case 3:
        f(std::integral_constant<int, 3>{});
        break;
      default:
        f(std::integral_constant<int, 4>{});
        break;
    }
  }

  /// Y (rows x n) = X (rows x k, row stride ldx) * W^T, W (n x k) row-major: decode batches of
  /// up to k::kGemvMaxRows rows through k::gemv (the choice depends on the capture size only),
  /// larger ones and the shapes where cuBLAS is faster through cuBLAS (at 8 rows gemv was 2-6x
  /// slower than cuBLAS on the H200).
  void gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
            const char* op, cudaStream_t s = nullptr) {
    if (s == nullptr) s = stream_;
    if (k::gemv_fits<S>(rows, n, x, ldx, w, kdim)) {
      gemv(x, ldx, 0, w, 0, y, ldy, 0, 1, rows, n, kdim, op, s);
      return;
    }
    if (bypass_blas(op, "GEMM")) return;
    const float one = 1.f, zero = 0.f;
    check_blas(cublasGemmEx(s == aux_ ? blas_aux_ : blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, kdim,
                            &one, w, cuda_type<S>(), kdim, x, cuda_type<S>(), ldx, &zero, y,
                            cuda_type<S>(), ldy, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
               op);
  }

  /// uv_proj's product o[t, h, :] = olat[t, h, :] W_UV[h]^T. Up to capture size
  /// k::kGemvMaxRows (16-byte aligned rows) a batched k::gemv over the heads, over the rows the
  /// form needs (a gemv row does not depend on the row count); else one cuBLAS batched GEMM over
  /// the heads for all T rows (uv_gemm; the no-copy form then copies rows [0, T_a) on). Chosen
  /// by the capture size, so the copy form (T rows) and the no-copy form (T_a rows) run the same
  /// kernel on the same shape and their shared rows agree bitwise.
  bool uv_gemv(const S* olat) const {
    const k::Dims d = dims();
    return T_ <= k::kGemvMaxRows && k::gemv_fits<S>(T_, d.dv, olat, d.H * d.L, w_uv(0), d.L);
  }
  const S* w_uv(int l) const {  // W_UV[0]: rows dn .. dn + dv of head 0's block of w_kv_b
    return layers_[l].w_kv_b->get() +
           static_cast<std::size_t>(cfg.qk_nope_head_dim) * cfg.kv_lora_rank;
  }
  /// `op`: uv_proj or uv_proj_static (errors and launch labels name it).
  void uv_small(int l, int rows, const S* olat, S* out, cudaStream_t s, const char* op) {
    const k::Dims d = dims();
    gemv(olat, d.H * d.L, d.L, w_uv(l), static_cast<long long>(d.dn + d.dv) * d.L, out, d.H * d.dv,
         d.dv, d.H, rows, d.dv, d.L, op, s);
  }
  void uv_gemm(int l, const S* olat, S* o, cudaStream_t s, const char* op) {
    const int H = cfg.num_heads, L = cfg.kv_lora_rank, dn = cfg.qk_nope_head_dim,
              dv = cfg.v_head_dim;
    if (bypass_blas(op, "batched GEMM")) return;
    const float one = 1.f, zero = 0.f;
    if (s != stream_) check_blas(cublasSetStream(blas_, s), "uv_proj stream");
    // Column-major per head h: o_h (dv x T, ld H dv) = W_h^T-view (L x dv, ld L)^T olat_h (L x T,
    // ld H L); W_UV[h] is rows dn .. dn + dv of head h's (dn + dv) x L block of w_kv_b.
    const cublasStatus_t st = cublasGemmStridedBatchedEx(
        blas_, CUBLAS_OP_T, CUBLAS_OP_N, dv, T_, L, &one, w_uv(l), cuda_type<S>(), L,
        static_cast<long long>(dn + dv) * L, olat, cuda_type<S>(), H * L, L, &zero, o,
        cuda_type<S>(), H * dv, dv, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT);
    if (s != stream_) check_blas(cublasSetStream(blas_, stream_), "uv_proj stream");
    check_blas(st, op);
  }

  /// indexer_wq_b's product qI = q_c W_q^I on stream s.
  void indexer_wq_b(int l, cudaStream_t s) {
    const k::Dims d = dims();
    LayerDev<S>& w = layers_[l];
    gemm(w.q_c->get(), d.Rq, w.iw_q_b->get(), w.qI->get(), d.HI * d.dI, T_, d.HI * d.dI, d.Rq,
         "indexer_wq_b", s);
  }

  /// Runs one op of layer l at the current capture size (G ops over T rows, H ops over T_a).
  void run_op(int l, const std::string& op) {
    LayerDev<S>& w = layers_[l];
    const k::Dims d = dims();
    const k::Meta m = meta();
    const int T = T_, Ta = Ta_, H = d.H, L = d.L, dq = d.dn + d.dr, dkv = d.dn + d.dv;
    const float one = 1.f, zero = 0.f;
    if (op == "input_norm") {
      launch(op.c_str(), k::rmsnorm<S>, T, k::kNormThreads, 0, stream_, h_->get(), d.D,
             w.g_in->get(), w.x->get(), d.D, d.D, d.eps);
    } else if (op == "qkv_a_proj") {
      gemm(w.x->get(), d.D, w.w_qkv_a->get(), w.qkv->get(), d.Rq + L + d.dr, T, d.Rq + L + d.dr,
           d.D, "qkv_a_proj");
    } else if (op == "indexer_wk_proj") {
      gemm(w.x->get(), d.D, w.iw_kw->get(), w.kw->get(), d.dI + d.HI, T, d.dI + d.HI, d.D,
           "indexer_wk_proj");
    } else if (op == "norm_rope_cache") {
      // F layers clear the shared top-k rows; the mutants skip it or clear in S layers too.
      const bool full = cfg.is_full_layer(l);
      const bool clear = full ? mutant_ != "no-topk-clear" : mutant_ == "shared-layer-clears";
      launch(op.c_str(), k::norm_rope_cache<S>, dim3(T, 4), k::kNormRopeThreads,
             (std::max(L, 128) + 32) * sizeof(float), stream_, d, m, w.qkv->get(), w.g_q->get(),
             w.q_c->get(), w.g_kv->get(), w.kv, w.kR->get(), full, full ? w.kw->get() : nullptr,
             full ? w.ig_k->get() : nullptr, full ? w.ib_k->get() : nullptr, w.index, w.k8->get(),
             w.kscale->get(), clear, topk_->get());
      if (full && use_side()) {  // the indexer's inputs are written
        if (lead_) {  // indexer_wq_b first, at full bandwidth (docs/GPU.md, "Two streams")
          indexer_wq_b(l, stream_);
          wq_b_led_ = l;
          ++leads_;
        }
        fork_side();
      }
    } else if (op == "q_b_proj") {
      gemm(w.q_c->get(), d.Rq, w.w_q_b->get(), w.q->get(), H * dq, T, H * dq, d.Rq, "q_b_proj");
    } else if (op == "uk_absorb") {
      // ql_h (T x L) = qN_h (T x dn) W_UK[h] (dn x L), batched over heads, into qpack's ql part:
      // decode batches of up to k::kGemvMaxRows rows through k::uk_small (W_UK read once in
      // 16-byte pieces, its first rows before the wait; cuBLAS took 2.2x the weight-read
      // floor at T = 1), larger ones through cuBLAS.
      if (k::uk_small_fits<S>(d, T)) {
        with_rows(T, [&](auto R) {
          launch(op.c_str(), k::uk_small<S, decltype(R)::value>, d.H, k::kUkThreads,
                 k::uk_small_smem<S>(d, T), stream_, d, w.q->get(), w.w_kv_b->get(), w.qpack->get(),
                 evict_first_);
        });
      } else if (!bypass_blas(op, "batched GEMM")) {
        check_blas(cublasGemmStridedBatchedEx(
                       blas_, CUBLAS_OP_N, CUBLAS_OP_N, L, T, d.dn, &one, w.w_kv_b->get(),
                       cuda_type<S>(), L, static_cast<long long>(dkv) * L, w.q->get(),
                       cuda_type<S>(), H * dq, dq, &zero, w.qpack->get(), cuda_type<S>(),
                       H * (L + d.dr), L + d.dr, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
                   "uk_absorb");
      }
    } else if (op == "indexer_wq_b") {
      if (wq_b_led_ == l)  // launched at the fork
        wq_b_led_ = -1;
      else
        indexer_wq_b(l, indexer_stream());
    } else if (op == "fused_q") {
      const int Wq = L + d.dr;  // qpack's per-head stride; qR at offset L
      const bool full = cfg.is_full_layer(l);
      const int nrope = k::q_rope_blocks(d);
      const auto part = [&](int y0, int blocks, cudaStream_t s) {
        launch(op.c_str(), k::fused_q<S>, dim3(T, blocks), k::kFusedQThreads, 0, s, d, m,
               w.q->get(), dq, d.dn, w.qpack->get(), Wq, L, w.qI->get(), w.kw->get(), w.q8->get(),
               w.qscale->get(), w.omega->get(), y0);
      };
      if (full && use_side()) {  // the indexer's part on its stream
        part(nrope, d.HI, indexer_stream());
        part(0, nrope, stream_);
      } else {
        part(0, nrope + (full ? d.HI : 0), stream_);
      }
      if (mutant_ == "double-rope")  // the rotation again, in place on qR
        launch(op.c_str(), k::q_rope<S>, dim3(T, nrope), k::kFusedQThreads, 0, stream_, d, m,
               w.qpack->get(), Wq, L, w.qpack->get(), Wq, L);
    } else if (op == "indexer_topk") {
      // Short-prefill shortcut: when every context fits in K the sets are 0..p and the scores
      // are not needed (topk_select then takes its short path on every row, bit for bit). The
      // mutant decides it once, at capture, and replays that decision.
      bool shortcut = longest_ <= d.K;
      if (mutant_ == "baked-short-prefill") {
        if (in_capture_)
          baked_short_[l] = shortcut;
        else if (const auto it = baked_short_.find(l); it != baked_short_.end())
          shortcut = it->second;
      }
      const cudaStream_t s = indexer_stream();
      if (Ta > 0) {
        if (!shortcut) {
          // Tensor cores where the shapes allow; else a thread per key once the keys alone
          // fill the SMs, or per (key, head group): those two sum in the same order, so a
          // score's bits do not depend on which of them ran.
          if (index_mma_ && k::index_mma_fits(d)) {
            const int per = k::index_mma_tokens(Ta);
            launch(op.c_str(), k::index_scores_mma,
                   dim3((Ta + per - 1) / per, (longest_ + k::kIdxMmaKeys - 1) / k::kIdxMmaKeys),
                   k::kIdxMmaThreads, 0, s, d, m, w.q8->get(), w.omega->get(), w.index,
                   scores_->get(), max_len_, Ta, per, scores_early_);
          } else if (static_cast<long long>(Ta) * ((longest_ + 127) / 128) >= 2LL * sms_)
            launch(op.c_str(), k::index_scores_keys, dim3(Ta, (longest_ + 127) / 128),
                   k::kIdxKeyThreads, k::index_scores_smem(d), s, d, m, w.q8->get(), w.omega->get(),
                   w.index, scores_->get(), max_len_);
          else
            launch(op.c_str(), k::index_scores_grouped,
                   dim3(Ta, (longest_ + k::kIdxBlockKeys - 1) / k::kIdxBlockKeys), k::kIdxThreads,
                   k::index_scores_smem(d), s, d, m, w.q8->get(), w.omega->get(), w.index,
                   scores_->get(), max_len_);
        }
        launch(op.c_str(), topk_bins_ ? k::topk_select<true> : k::topk_select<false>, Ta,
               k::kTopkThreads, 0, s, d, m, scores_->get(), max_len_, topk_->get());
      }
    } else if (op == "sparse_mqa") {
      // The gather reads only the top-k rows and the cache (written before the fork): with the
      // indexer's stream still open it runs there, after the select, and the join follows it.
      if (!gather_side_) join_side();  // the top-k rows
      // The backend returns its output in a buffer it owns; the address rotates call to call.
      S* olat = ring_[ring_next_]->get();
      ring_next_ = (ring_next_ + 1) % ring_.size();
      backend_olat_ = olat;
      if (mutant_ == "unjoined-stream" && eager_segment_)  // a slow backend: the race is certain
        k::spin<<<1, 1, 0, stream_>>>(2'000'000);
      const int W = L + d.dr;
      const long long HK = static_cast<long long>(H) * d.K;
      if (Ta > 0) {
        launch(op.c_str(), k::mqa_gather<S>,
               dim3(Ta, (d.K + k::kMqaGatherRows - 1) / k::kMqaGatherRows), k::kMqaThreads, 0,
               forked_ ? aux_ : stream_, d, m, w.kv, topk_->get(), mqa_keys_->get(),
               (L * sizeof(S)) % 16 == 0 && (d.dr * sizeof(S)) % 16 == 0, w.topk_trace->get());
      }
      join_side();  // the gathered keys (a no-op when joined above or never forked)
      if (Ta > 0) {
        // Per token t: z_t (H x K) = sigma [ql; qR]_t [c; kR]_t^T, one product over L + dr
        // (cuBLAS is column-major: z_t^T = keys_t qpack_t^T with keys_t a W x K column-major
        // view and qpack_t a W x H one).
        const float sigma = d.sigma;
        const S* keys = mqa_keys_->get();
        const auto batched = [&](cublasOperation_t ta, int rows, int cols, int depth,
                                 const float* alpha, const S* a, int lda, long long sa, const S* b,
                                 int ldb, long long sb, const float* beta, float* c, int ldc,
                                 long long sc, const char* what) {
          if (bypass_blas(op, what)) return;
          check_blas(cublasGemmStridedBatchedEx(blas_, ta, CUBLAS_OP_N, rows, cols, depth, alpha, a,
                                                cuda_type<S>(), lda, sa, b, cuda_type<S>(), ldb, sb,
                                                beta, c, CUDA_R_32F, ldc, sc, Ta, compute_type<S>(),
                                                CUBLAS_GEMM_DEFAULT),
                     what);
        };
        const long long key_stride = static_cast<long long>(d.K) * W;
        batched(CUBLAS_OP_T, d.K, H, W, &sigma, keys, W, key_stride, w.qpack->get(), W,
                static_cast<long long>(H) * W, &zero, mqa_z_->get(), d.K, HK, "sparse_mqa scores");
        launch(op.c_str(), k::mqa_softmax<S>, dim3(Ta, H), k::kMqaThreads, 0, stream_, d,
               topk_->get(), mqa_z_->get(), mqa_p_->get(), mqa_ml_->get());
        // acc_t (H x L) = P_t c_t: acc_t^T = c_t^T P_t^T, column-major L x K times K x H.
        batched(CUBLAS_OP_N, L, H, d.K, &one, keys, W, key_stride, mqa_p_->get(), d.K, HK, &zero,
                mqa_acc_->get(), L, static_cast<long long>(H) * L, "sparse_mqa P.V");
        // The gather and the finish also write the trace copies (not part of the op's contract):
        // this layer's sets and latent.
        launch(op.c_str(), k::mqa_finish<S>, dim3(Ta, H), 128, 0, stream_, d, mqa_acc_->get(),
               mqa_ml_->get(), olat, w.olat_trace->get(), w.lse->get());
      }
    } else if (op == "uv_proj") {  // no-copy form: backend rows [0, T_a) into o
      S* out = w.o->get();
      if (mutant_ == "fresh-output") {  // a new buffer every call, handed on by pointer
        fresh_.push_back(zeros<S>(static_cast<std::size_t>(max_tokens_) * H * d.dv));
        out = fresh_.back()->get();
      }
      o_ptr_[l] = out;
      // Mutant: an eager segment's op on a side stream, joined with nothing.
      const cudaStream_t s = mutant_ == "unjoined-stream" && eager_segment_ ? side_ : stream_;
      if (Ta > 0) {
        if (uv_gemv(backend_olat_)) {
          uv_small(l, Ta, backend_olat_, out, s, "uv_proj");
        } else {  // all T rows into the scratch, rows [0, T_a) on into `out`
          uv_gemm(l, backend_olat_, uv_rows_->get(), s, "uv_proj");
          check(cudaMemcpyAsync(out, uv_rows_->get(),
                                static_cast<std::size_t>(Ta) * H * d.dv * sizeof(S),
                                cudaMemcpyDeviceToDevice, s),
                "uv_proj");
        }
      }
    } else if (op == "latent_copy") {  // copy form: backend rows [0, T_a) into the static latent
      if (Ta > 0)
        check(cudaMemcpyAsync(w.olat_static->get(), backend_olat_,
                              static_cast<std::size_t>(Ta) * H * L * sizeof(S),
                              cudaMemcpyDeviceToDevice, stream_),
              "latent_copy");
    } else if (op == "uv_proj_static") {  // copy form: all T rows of the static latent
      if (uv_gemv(w.olat_static->get()))
        uv_small(l, T, w.olat_static->get(), w.o->get(), stream_, "uv_proj_static");
      else
        uv_gemm(l, w.olat_static->get(), w.o->get(), stream_, "uv_proj_static");
    } else if (op == "o_proj") {
      // Reads the buffer uv_proj handed on (the static `o` unless a mutant changed it); a graph
      // bakes the pointer it had at capture.
      // Tensor-parallel: this rank's partial sum, every rank's gathered, added in rank order.
      S* y = gather_ ? ypart_->get() : w.y->get();
      gemm(o_ptr_[l], H * d.dv, w.w_o->get(), y, d.D, T, d.D, H * d.dv, "o_proj");
      if (gather_) {
        const long long n = static_cast<long long>(T) * d.D;
        if (!bypass([&] { return op + ":all-gather"; }))
          gather_->all_gather(y, parts_->get(), static_cast<std::size_t>(n) * sizeof(S), stream_);
        launch(op.c_str(), k::sum_ranks<S>, static_cast<unsigned>((n + 255) / 256), 256, 0, stream_,
               parts_->get(), gather_->ranks(), n, w.y->get());
      }
    } else if (op == "residual_add") {
      const long long n = static_cast<long long>(T) * d.D;
      launch(op.c_str(), k::residual_add<S>, static_cast<unsigned>((n + 255) / 256), 256, 0,
             stream_, h_->get(), w.y->get(), n);
    } else {
      throw boundary::PlanError("unknown op '" + op + "'");
    }
    check(cudaGetLastError(), ("layer" + std::to_string(l) + "/" + op).c_str());
  }

  /// Rows [0, rows) of a device tensor as a trace Tensor; `value` maps a stored element to its
  /// value (storage types, fp32 scales, e4m3 codes).
  template <class T, class Value>
  Tensor tensor_of(const char* name, const T* p, int rows, std::vector<std::int64_t> tail,
                   DType dtype, Value value) {
    std::int64_t per = 1;
    for (auto v : tail) per *= v;
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), tail.begin(), tail.end());
    return host_tensor(name, std::move(shape), download(p, static_cast<std::size_t>(rows * per)),
                       dtype, value);
  }
  Tensor tensor_of(const char* name, const S* p, int rows, std::vector<std::int64_t> tail) {
    return tensor_of(name, p, rows, std::move(tail), storage_dtype(cfg, name), from_storage<S>);
  }
  /// Columns [off, off + n) of each (row, head) of a (rows, H, stride) device tensor, as a
  /// (rows, H, n) trace Tensor.
  Tensor packed_of(const char* name, const S* p, int rows, int H, int stride, int off, int n) {
    std::vector<S> host(static_cast<std::size_t>(rows) * H * n);
    if (!host.empty())
      check(cudaMemcpy2D(host.data(), n * sizeof(S), p + off, stride * sizeof(S), n * sizeof(S),
                         static_cast<std::size_t>(rows) * H, cudaMemcpyDeviceToHost),
            "download trace");
    return host_tensor(name, {rows, H, n}, host, storage_dtype(cfg, name), from_storage<S>);
  }
  /// A trace Tensor of `shape` from downloaded elements; `value` maps a stored element to its
  /// value.
  template <class T, class Value>
  static Tensor host_tensor(const char* name, std::vector<std::int64_t> shape,
                            const std::vector<T>& host, DType dtype, Value value) {
    std::vector<double> data(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) data[i] = value(host[i]);
    return Tensor::from(name, std::move(shape), std::move(data), dtype);
  }
  Tensor floats_of(const char* name, const float* p, int rows, std::vector<std::int64_t> tail) {
    return tensor_of(name, p, rows, std::move(tail), storage_dtype(cfg, name),
                     [](float v) { return static_cast<double>(v); });
  }
  Tensor codes_of(const char* name, const std::uint8_t* p, int rows,
                  std::vector<std::int64_t> tail) {
    return tensor_of(name, p, rows, std::move(tail), DType::float8_e4m3fn,
                     [](std::uint8_t v) { return e4m3_value(v); });
  }

  /// Every stage of rows [0, T_a) of every layer, read after the step.
  StepTrace trace() {
    const int Ta = Ta_;
    const k::Dims d = dims();
    const k::Meta m = meta();
    StepTrace tr;
    const int H = cfg.num_heads, L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim,
              HI = cfg.index_n_heads;
    for (int l = 0; l < cfg.num_layers; ++l) {
      LayerDev<S>& w = layers_[l];
      if (Ta > 0) k::read_latent<S><<<Ta, 128, 0, stream_>>>(d, m, w.kv, w.c_read->get());
      check(cudaStreamSynchronize(stream_), "trace");
      LayerTrace lt;
      lt.tensors.push_back(tensor_of("q_c", w.q_c->get(), Ta, {cfg.q_lora_rank}));
      lt.tensors.push_back(tensor_of("c", w.c_read->get(), Ta, {L}));
      lt.tensors.push_back(tensor_of("kR", w.kR->get(), Ta, {dr}));
      lt.tensors.push_back(packed_of("ql", w.qpack->get(), Ta, H, L + dr, 0, L));
      lt.tensors.push_back(packed_of("qR", w.qpack->get(), Ta, H, L + dr, L, dr));
      if (cfg.is_full_layer(l)) {
        lt.tensors.push_back(codes_of("qI8", w.q8->get(), Ta, {HI, cfg.index_head_dim}));
        lt.tensors.push_back(floats_of("qI_scale", w.qscale->get(), Ta, {HI}));
        lt.tensors.push_back(codes_of("kI8", w.k8->get(), Ta, {cfg.index_head_dim}));
        lt.tensors.push_back(floats_of("kI_scale", w.kscale->get(), Ta, {}));
        lt.tensors.push_back(floats_of("omega", w.omega->get(), Ta, {HI}));
      }
      lt.tensors.push_back(tensor_of("topk", w.topk_trace->get(), Ta, {cfg.index_topk},
                                     DType::int32, [](int v) { return static_cast<double>(v); }));
      lt.tensors.push_back(tensor_of("olat", w.olat_trace->get(), Ta, {H, L}));
      lt.tensors.push_back(floats_of("lse", w.lse->get(), Ta, {H}));
      lt.tensors.push_back(  // what uv_proj wrote (a mutant may write elsewhere than `o`)
          tensor_of("o", o_ptr_[l], Ta, {static_cast<std::int64_t>(H) * cfg.v_head_dim}));
      lt.tensors.push_back(tensor_of("y", w.y->get(), Ta, {cfg.hidden_size}));
      tr.layers.push_back(std::move(lt));
    }
    tr.output = tensor_of("output", h_->get(), Ta, {cfg.hidden_size});
    return tr;
  }

  int num_blocks_, max_tokens_;
  Rope rope_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  Buf<std::uint8_t> workspace_;
  std::vector<LayerDev<S>> layers_;
  Buf<S> h_, ypart_, parts_;
  RankGather* gather_ = nullptr;
  Buf<float> scores_, rope_cos_, rope_sin_, mqa_z_, mqa_ml_, mqa_acc_;
  Buf<S> mqa_keys_, mqa_p_, uv_rows_;
  Buf<int> topk_, positions_, request_of_token_, block_table_;
  Buf<long long> slots_;
  std::array<Buf<S>, 2> ring_;
  std::size_t ring_next_ = 0;
  S* backend_olat_ = nullptr;
  // Programmatic dependent launch of the ops' kernels (DSV32_PDL=0 turns it off: A/B timing, or
  // ruling it out when a result looks wrong; docs/DECISIONS.md, "PDL").
  const bool pdl_ = switched_on("DSV32_PDL");
  // Timing ablation (Stack::skip_launch): the label of the launch to skip ("" none), and the
  // labels of the launches made while record_ is on (Stack::launch_labels).
  std::string skip_;
  bool record_ = false;
  std::vector<std::string> labels_;
  std::map<const void*, std::string> kernel_labels_;  // kernel_label's
  // indexer_topk's scores on tensor cores where k::index_mma_fits (DSV32_INDEX_MMA=0: the
  // CUDA-core kernels of sessions 3-5, for A/B timing).
  const bool index_mma_ = switched_on("DSV32_INDEX_MMA");
  // indexer_topk's select with value bins ahead of the radix passes (DSV32_TOPK_BINS=0: the
  // radix passes alone, the select of sessions 3-9, for A/B timing).
  const bool topk_bins_ = switched_on("DSV32_TOPK_BINS");
  // sparse_mqa's gather on the indexer's stream, the join after it (DSV32_GATHER_SIDE=0: the
  // join before it, as in sessions 11-13), and index_scores_mma staging its keys before its
  // wait (DSV32_SCORES_EARLY=0: after it); for A/B timing, the bits do not change.
  const bool gather_side_ = switched_on("DSV32_GATHER_SIDE");
  const bool scores_early_ = switched_on("DSV32_SCORES_EARLY");
  int T_ = 0, Ta_ = 0, max_blocks_ = 1, max_len_ = 1, longest_ = 1, sms_ = 1;
  // Mutants (BOUNDARIES.md section 4) and the state they need.
  std::string mutant_;
  bool in_capture_ = false, in_graph_ = false, eager_segment_ = false;
  std::map<int, bool> baked_short_;
  std::vector<S*> o_ptr_;  // per layer: the buffer uv_proj wrote, which o_proj reads
  std::vector<Buf<S>> fresh_;
  Buf<int> positions_snapshot_;
  cudaStream_t side_ = nullptr;
  std::map<std::pair<std::string, int>, std::unique_ptr<BreakableGraph>> captures_;
  // The indexer's stream and its fork and join (use_side; DSV32_OVERLAP=0: one stream). graph_:
  // the capture in progress, whose fork and join the stream's are while a graph op records.
  const bool overlap_ = switched_on("DSV32_OVERLAP");
  const bool wq_b_lead_ = switched_on("DSV32_WQB_LEAD");  // 0: indexer_wq_b forks with the rest
  // Weights loaded evict-first in L2 (k::ld_weight); DSV32_WEIGHTS_EVICT_FIRST=0: __ldg.
  const bool evict_first_ = switched_on("DSV32_WEIGHTS_EVICT_FIRST");
  cudaStream_t aux_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  cublasHandle_t blas_aux_ = nullptr;
  Buf<std::uint8_t> workspace_aux_;
  bool forked_ = false;
  int forks_ = 0;
  BreakableGraph* graph_ = nullptr;
  double host_step_ms_ = 0;  // the last time_step's host time per step (last_host_ms)
  // This layer's indexer_wq_b may lead (wq_b_may_lead); the layer whose indexer_wq_b was
  // launched at the fork (-1: none), so that the op itself launches nothing.
  bool lead_ = false;
  int wq_b_led_ = -1;
  int leads_ = 0;
};

}  // namespace

Stack::Stack(const Config& cfg, const Weights& weights, int num_blocks, int max_tokens, int device,
             RankGather* gather) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  const int count = device_count();
  if (device < 0 || device >= count)
    throw CudaError("gpu stack: device " + std::to_string(device) + " is not visible (" +
                    std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") + ")");
  const detail::DeviceGuard on(device);
  if (cfg.precision == Precision::bf16)
    impl_ = std::make_unique<StackImpl<__nv_bfloat16>>(cfg, weights, num_blocks, max_tokens, device,
                                                       gather);
  else
    impl_ =
        std::make_unique<StackImpl<float>>(cfg, weights, num_blocks, max_tokens, device, gather);
}

namespace {

/// Element i of a counter-RNG stream of e4m3 codes: any finite code (0x7F / 0xFF are NaN).
std::uint8_t random_e4m3(const rng::Stream& s, std::uint64_t i) {
  return static_cast<std::uint8_t>(s.below(i, 0x7F) | (s.below(i + (1ull << 40), 2) << 7));
}

/// One random token's index scores from every score kernel (see index_score_kernels_disagree).
struct IndexScoreRun {
  std::vector<std::uint8_t> q8, codes;  // (heads, 128); (keys, 128) in position order
  std::vector<float> omega, kscale;     // (heads); (keys) in position order
  std::vector<float> grouped, per_key, mma;
};

IndexScoreRun run_index_score_kernels(int heads, int keys, std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (heads < 1 || keys < 1) throw std::invalid_argument("index_score_kernels: heads, keys >= 1");
  const rng::Stream s(seed, "index-score-kernels");
  const auto code = [&](std::uint64_t i) { return random_e4m3(s, i); };
  k::Dims d{};
  d.HI = heads;
  d.dI = 128;
  d.B = 64;
  d.max_blocks = (keys + d.B - 1) / d.B;
  IndexScoreRun run;
  std::vector<std::uint8_t> kc(static_cast<std::size_t>(d.max_blocks) * d.B * 128);
  std::vector<float> ks(static_cast<std::size_t>(d.max_blocks) * d.B);
  std::vector<int> table(d.max_blocks);
  run.q8.resize(static_cast<std::size_t>(heads) * 128);
  run.omega.resize(heads);
  for (std::size_t i = 0; i < run.q8.size(); ++i) run.q8[i] = code(i);
  for (std::size_t i = 0; i < kc.size(); ++i) kc[i] = code(i + run.q8.size());
  for (int h = 0; h < heads; ++h) run.omega[h] = static_cast<float>(s.symmetric(1000000 + h));
  for (std::size_t j = 0; j < ks.size(); ++j)
    ks[j] = static_cast<float>(std::ldexp(1.0 + s.uniform(2000000 + j), -8));
  for (int b = 0; b < d.max_blocks; ++b) table[b] = d.max_blocks - 1 - b;  // reversed pages
  for (int j = 0; j < keys; ++j) {  // position j lives in slot table[j / B] B + j % B
    const std::size_t slot = static_cast<std::size_t>(table[j / d.B]) * d.B + j % d.B;
    run.codes.insert(run.codes.end(), kc.begin() + slot * 128, kc.begin() + (slot + 1) * 128);
    run.kscale.push_back(ks[slot]);
  }
  const auto dev = [](const auto& host) { return upload(host, "index_score_kernels upload"); };
  const auto dq = dev(run.q8), dk = dev(kc);
  const auto dom = dev(run.omega), dks = dev(ks);
  const auto dt = dev(table), pos = dev(std::vector<int>{keys - 1}), req = dev(std::vector<int>{0});
  auto a = zeros<float>(keys), b = zeros<float>(keys), c = zeros<float>(keys);
  const k::Meta m{pos->get(), nullptr, req->get(), dt->get(), nullptr, nullptr};
  const k::IndexCache cache{dk->get(), dks->get()};
  const std::size_t smem = allow_index_scores_smem(d);
  k::index_scores_grouped<<<dim3(1, (keys + k::kIdxBlockKeys - 1) / k::kIdxBlockKeys),
                            k::kIdxThreads, smem>>>(d, m, dq->get(), dom->get(), cache, a->get(),
                                                    keys);
  k::index_scores_keys<<<dim3(1, (keys + 127) / 128), k::kIdxKeyThreads, smem>>>(
      d, m, dq->get(), dom->get(), cache, b->get(), keys);
  const bool mma = k::index_mma_fits(d);
  if (mma)
    k::index_scores_mma<<<dim3(1, (keys + k::kIdxMmaKeys - 1) / k::kIdxMmaKeys),
                          k::kIdxMmaThreads>>>(d, m, dq->get(), dom->get(), cache, c->get(), keys,
                                               1, 1, true);
  check(cudaGetLastError(), "index_score_kernels launch");
  run.grouped = download(a->get(), keys);
  run.per_key = download(b->get(), keys);
  if (mma) run.mma = download(c->get(), keys);
  return run;
}

}  // namespace

std::string topk_select_off(int K, const std::vector<int>& lengths, int levels,
                            std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (K < 1 || lengths.empty()) throw std::invalid_argument("topk_select_off: K >= 1, rows >= 1");
  if (levels < -3) throw std::invalid_argument("topk_select_off: levels >= -3");
  const int rows = static_cast<int>(lengths.size());
  const int width = *std::max_element(lengths.begin(), lengths.end());
  if (*std::min_element(lengths.begin(), lengths.end()) < 1)
    throw std::invalid_argument("topk_select_off: lengths >= 1");
  const rng::Stream s(seed, "topk-select");
  std::vector<float> sc(static_cast<std::size_t>(rows) * width);
  for (std::size_t i = 0; i < sc.size(); ++i) {
    const double u = s.symmetric(i);
    if (levels > 0) {
      sc[i] = 1.0f + static_cast<float>(s.below(i, levels));
    } else if (levels == 0) {
      sc[i] = static_cast<float>(1.0 + u * 0.5);
    } else {  // both signs, +0 and -0 (-2: and outliers; -3: and infinities)
      const std::uint64_t kind = s.below(i ^ 0x9E3779B97F4A7C15ull, 64);
      const float inf = std::numeric_limits<float>::infinity();
      sc[i] = kind == 0                   ? 0.0f
              : kind == 1                 ? -0.0f
              : kind == 2 && levels <= -2 ? static_cast<float>(1e30 * u)
              : kind == 3 && levels == -3 ? (u < 0 ? -inf : inf)
                                          : static_cast<float>(u * 3.0);
    }
  }
  std::vector<int> positions(rows);
  for (int t = 0; t < rows; ++t) positions[t] = lengths[t] - 1;
  // The expected rows: the K best by (score, then the smaller position), in position order;
  // scores compare as the kernel's keys do (their bits as a total order: +0 above -0).
  const auto key = [](float v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  };
  std::vector<int> want(static_cast<std::size_t>(rows) * K, -1);
  for (int t = 0; t < rows; ++t) {
    std::vector<int> order(lengths[t]);
    for (int j = 0; j < lengths[t]; ++j) order[j] = j;
    const float* row = &sc[static_cast<std::size_t>(t) * width];
    const int take = std::min(K, lengths[t]);
    std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](int a, int b) {
      return key(row[a]) > key(row[b]) || (key(row[a]) == key(row[b]) && a < b);
    });
    std::sort(order.begin(), order.begin() + take);
    std::copy(order.begin(), order.begin() + take,
              want.begin() + static_cast<std::ptrdiff_t>(t) * K);
  }
  const auto dev = [](const auto& host) { return upload(host, "topk_select_off upload"); };
  const auto dsc = dev(sc);
  const auto dpos = dev(positions);
  k::Dims d{};
  d.K = K;
  const k::Meta m{dpos->get(), nullptr, nullptr, nullptr, nullptr, nullptr};
  // Both selects: with value bins (the default) and the radix passes alone.
  for (const bool bins : {true, false}) {
    const auto out = dev(std::vector<int>(want.size(), -1));  // as norm_rope_cache clears them
    (bins ? k::topk_select<true> : k::topk_select<false>)<<<rows, k::kTopkThreads>>>(
        d, m, dsc->get(), width, out->get());
    check(cudaGetLastError(), "topk_select_off launch");
    const std::vector<int> got = download(out->get(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i])
        return std::string(bins ? "with bins" : "radix only") + ": row " + std::to_string(i / K) +
               " entry " + std::to_string(i % K) + ": " + std::to_string(got[i]) + ", expected " +
               std::to_string(want[i]);
  }
  return "";
}

std::string index_scores_blocking_disagrees(int tokens, int keys, std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (tokens < 1 || keys < 2)
    throw std::invalid_argument("index_scores_blocking: tokens >= 1, keys >= 2");
  const rng::Stream s(seed, "index-scores-blocking");
  const auto code = [&](std::uint64_t i) { return random_e4m3(s, i); };
  k::Dims d{};
  d.HI = 64;
  d.dI = 128;
  d.B = 64;
  d.max_blocks = (keys + d.B - 1) / d.B;
  // Two requests with their own pages; tokens alternate between them in runs (a decode batch
  // next to a prefill chunk), positions rising within each.
  const int pages = 2 * d.max_blocks;
  std::vector<std::uint8_t> kc(static_cast<std::size_t>(pages) * d.B * 128),
      q8(static_cast<std::size_t>(tokens) * d.HI * 128);
  std::vector<float> ks(static_cast<std::size_t>(pages) * d.B),
      om(static_cast<std::size_t>(tokens) * d.HI);
  std::vector<int> table(pages), pos(tokens), req(tokens);
  for (std::size_t i = 0; i < kc.size(); ++i) kc[i] = code(i);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = code(i + kc.size());
  for (std::size_t i = 0; i < om.size(); ++i) om[i] = static_cast<float>(s.symmetric(5000000 + i));
  for (std::size_t j = 0; j < ks.size(); ++j)
    ks[j] = static_cast<float>(std::ldexp(1.0 + s.uniform(6000000 + j), -8));
  for (int b = 0; b < pages; ++b) table[b] = pages - 1 - b;
  int next[2] = {keys / 3, keys / 2};
  for (int t = 0; t < tokens; ++t) {
    req[t] = (t / 3) % 2;
    pos[t] = std::min(keys - 1, next[req[t]]++);
  }
  const auto dev = [](const auto& host) { return upload(host, "index_scores_blocking upload"); };
  const auto dk = dev(kc);
  const auto dq = dev(q8);
  const auto dks = dev(ks);
  const auto dom = dev(om);
  const auto dt = dev(table);
  const auto dpos = dev(pos);
  const auto dreq = dev(req);
  const k::Meta m{dpos->get(), nullptr, dreq->get(), dt->get(), nullptr, nullptr};
  const k::IndexCache cache{dk->get(), dks->get()};
  std::vector<float> first;
  for (int per : {1, 2, 3, 8, 16}) {
    auto out = zeros<float>(static_cast<std::size_t>(tokens) * keys);
    k::index_scores_mma<<<dim3((tokens + per - 1) / per,
                               (keys + k::kIdxMmaKeys - 1) / k::kIdxMmaKeys),
                          k::kIdxMmaThreads>>>(d, m, dq->get(), dom->get(), cache, out->get(), keys,
                                               tokens, per, true);
    check(cudaGetLastError(), "index_scores_blocking launch");
    const std::vector<float> got = download(out->get(), static_cast<std::size_t>(tokens) * keys);
    if (first.empty()) {
      first = got;
      continue;
    }
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j <= pos[t]; ++j) {
        const std::size_t i = static_cast<std::size_t>(t) * keys + j;
        if (std::memcmp(&got[i], &first[i], sizeof(float)) != 0)
          return std::to_string(per) + " tokens a block, token " + std::to_string(t) + " key " +
                 std::to_string(j) + ": " + std::to_string(got[i]) + " against " +
                 std::to_string(first[i]) + " at one token a block";
      }
  }
  return "";
}

std::string index_score_kernels_disagree(int heads, int keys, std::uint64_t seed) {
  const IndexScoreRun run = run_index_score_kernels(heads, keys, seed);
  for (int j = 0; j < keys; ++j)
    if (std::memcmp(&run.grouped[j], &run.per_key[j], sizeof(float)) != 0)
      return "key " + std::to_string(j) + ": grouped " + std::to_string(run.grouped[j]) +
             ", per key " + std::to_string(run.per_key[j]);
  return "";
}

std::string index_scores_off_bound(int heads, int keys, std::uint64_t seed) {
  const IndexScoreRun run = run_index_score_kernels(heads, keys, seed);
  std::vector<double> q(run.q8.size()), kv(run.codes.size()),
      om(run.omega.begin(), run.omega.end());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = e4m3_value(run.q8[i]);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = e4m3_value(run.codes[i]);
  std::vector<const double*> kp;
  for (int j = 0; j < keys; ++j) kp.push_back(&kv[static_cast<std::size_t>(j) * 128]);
  const std::vector<double> kscale(run.kscale.begin(), run.kscale.end());
  const IndexScores exact = index_score_row(q.data(), om.data(), heads, 128, kp, kscale);
  const double gamma = gamma_fp32(static_cast<std::int64_t>(heads) * 128);
  const std::pair<const char*, const std::vector<float>*> kernels[] = {
      {"grouped", &run.grouped}, {"per key", &run.per_key}, {"mma", &run.mma}};
  for (const auto& [name, got] : kernels) {
    if (got->empty()) continue;  // the tensor-core kernel does not serve these shapes
    for (int j = 0; j < keys; ++j) {
      const double err = std::fabs(static_cast<double>((*got)[j]) - exact.score[j]);
      if (!(err <= gamma * exact.abs_terms[j]))  // NaN fails
        return std::string(name) + " kernel, key " + std::to_string(j) + ": " +
               std::to_string((*got)[j]) + " against " + std::to_string(exact.score[j]) +
               " (error " + std::to_string(err) + ", bound " +
               std::to_string(gamma * exact.abs_terms[j]) + ")";
    }
  }
  return "";
}

Stack::~Stack() {
  if (!impl_) return;
  const detail::DeviceGuard on(impl_->device, std::nothrow);  // frees on the stack's device
  impl_.reset();
}

std::vector<StepTrace> run_steps(const Config& cfg, const Weights& weights, int num_blocks,
                                 const std::vector<StepInput>& steps, const boundary::Plan& plan,
                                 const std::string& mutant, int* captures) {
  Stack stack(cfg, weights, num_blocks, max_capture_size(steps));
  if (!mutant.empty()) stack.set_mutant(mutant);
  std::vector<StepTrace> out;
  for (const StepInput& in : steps) out.push_back(stack.run(plan, in));
  if (captures) *captures = stack.capture_count();
  return out;
}

StepTrace Stack::step(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(boundary::plan_preset("eager", impl_->cfg), in, false);
}

CaptureInfo Stack::capture(const boundary::Plan& plan, int T, bool allow_host_capture) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->capture(plan, T, allow_host_capture);
}

StepTrace Stack::replay(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, true);
}

StepTrace Stack::run(const boundary::Plan& plan, const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->run(plan, in, false);
}

std::vector<double> Stack::residual(int T) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->residual(T);
}

void Stack::synthesize_context(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  impl_->synthesize_context(in);
}

double Stack::time_step(const boundary::Plan& plan, const StepInput& in, int repeats) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->time_step(plan, in, repeats);
}

double Stack::last_host_ms() const {
  return impl_->last_host_ms();
}

std::vector<std::pair<std::string, double>> Stack::time_ops(const StepInput& in, int repeats,
                                                            bool graph) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->time_ops(in, repeats, graph);
}

void Stack::set_mutant(const std::string& name) {
  const detail::DeviceGuard on(impl_->device);
  impl_->set_mutant(name);
}

int Stack::capture_count() const {
  return impl_->capture_count();
}

int Stack::indexer_forks() const {
  return impl_->indexer_forks();
}

int Stack::indexer_leads() const {
  return impl_->indexer_leads();
}

void Stack::skip_launch(const std::string& label) {
  const detail::DeviceGuard on(impl_->device);
  impl_->skip_launch(label);
}

std::vector<std::string> Stack::launch_labels(const StepInput& in) {
  const detail::DeviceGuard on(impl_->device);
  return impl_->launch_labels(in);
}

const Config& Stack::config() const {
  return impl_->cfg;
}

}  // namespace dsv32::gpu

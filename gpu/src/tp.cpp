#include "dsv32/gpu/tp.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack_lab.hpp"
#include "local_exchange.hpp"

#if DSV32_HAVE_NCCL
#include <nccl.h>
#endif

namespace dsv32::gpu {

bool built_with_nccl() {
  return DSV32_HAVE_NCCL != 0;
}

namespace {

/// Why NCCL cannot carry tp ranks here ("" when it can).
std::string no_nccl_reason(int tp) {
  if (!built_with_nccl())
    return "tp " + std::to_string(tp) + " over NCCL needs NCCL; this build has none";
  if (const int count = device_count(); count < tp)
    return "tp " + std::to_string(tp) + " over NCCL needs " + std::to_string(tp) + " GPUs; " +
           std::to_string(count) + " visible";
  return "";
}

/// nccl or one_gpu for tp ranks here (tp 1: one_gpu, a single stack with no collective).
TpTransport resolve(TpTransport t, int tp) {
  if (t != TpTransport::automatic) return t;
  return tp > 1 && no_nccl_reason(tp).empty() ? TpTransport::nccl : TpTransport::one_gpu;
}

}  // namespace

std::string transport_name(TpTransport transport, int tp) {
  return resolve(transport, tp) == TpTransport::nccl ? "nccl" : "one GPU";
}

std::string no_tp_reason(int tp, TpTransport transport) {
  if (tp < 1) return "tp must be >= 1 (got " + std::to_string(tp) + ")";
  if (std::string why = no_device_reason(); !why.empty()) return why;
  if (tp == 1) return "";
  if (resolve(transport, tp) == TpTransport::nccl) return no_nccl_reason(tp);
  // Ranks on one GPU wait for each other on the device; a kernel loaded lazily on its first
  // launch may wait for the whole device, so one rank's first launch would wait for a peer
  // that waits for it (measured: every first group of a process timed out).
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  if (!loading || std::string(loading) != "EAGER")
    return "tp " + std::to_string(tp) +
           " on one GPU needs CUDA_MODULE_LOADING=EAGER in the environment (CUDA loads kernels "
           "lazily by default, and a lazy load can wait for the ranks' exchange: a deadlock)";
  return "";
}

namespace {

std::string at(int rank, int layer, const std::string& stage) {
  return "rank " + std::to_string(rank) + " " +
         (layer < 0 ? std::string("output") : "layer" + std::to_string(layer) + "/" + stage);
}

/// Rank 0's tensor after checking every rank holds the same bits (shape, dtype and values).
Tensor replicated(const std::vector<const Tensor*>& parts, int layer) {
  const Tensor& a = *parts[0];
  for (std::size_t r = 1; r < parts.size(); ++r) {
    const Tensor& b = *parts[r];
    if (b.shape != a.shape || b.dtype != a.dtype)
      throw TpError(at(static_cast<int>(r), layer, a.name) + ": shape " + b.shape_string() +
                    " where rank 0 has " + a.shape_string());
    for (std::size_t i = 0; i < a.data.size(); ++i) {
      const double x = a.data[i], y = b.data[i];
      if (x == y || (std::isnan(x) && std::isnan(y))) continue;
      throw TpError(at(static_cast<int>(r), layer, a.name) +
                    ": a replicated stage differs from rank 0 at " +
                    a.index_string(static_cast<std::int64_t>(i)) + ": " + std::to_string(y) +
                    " vs " + std::to_string(x));
    }
  }
  return a;
}

/// Per row, rank 0's heads, then rank 1's, ...: dimension 1 grows tp-fold.
Tensor heads_joined(const std::vector<const Tensor*>& parts, int layer) {
  const Tensor& a = *parts[0];
  if (a.shape.size() < 2)
    throw TpError(at(0, layer, a.name) + ": a head-split stage needs a head dimension, shape " +
                  a.shape_string());
  const std::int64_t rows = a.shape[0], per = rows ? a.numel() / rows : 0;
  for (std::size_t r = 1; r < parts.size(); ++r)
    if (parts[r]->shape != a.shape || parts[r]->dtype != a.dtype)
      throw TpError(at(static_cast<int>(r), layer, a.name) + ": shape " + parts[r]->shape_string() +
                    " where rank 0 has " + a.shape_string());
  Tensor out = a;
  out.shape[1] *= static_cast<std::int64_t>(parts.size());
  out.data.resize(a.data.size() * parts.size());
  auto dst = out.data.begin();
  for (std::int64_t t = 0; t < rows; ++t)
    for (const Tensor* p : parts) dst = std::copy_n(p->data.begin() + t * per, per, dst);
  return out;
}

}  // namespace

StepTrace merge_rank_traces(const Config& cfg, const std::vector<StepTrace>& ranks) {
  if (ranks.empty()) throw TpError("merge_rank_traces: no rank traces");
  const int tp = static_cast<int>(ranks.size());
  if (cfg.num_heads % tp != 0)
    throw TpError("merge_rank_traces: " + std::to_string(tp) + " ranks do not divide " +
                  std::to_string(cfg.num_heads) + " heads");
  StepTrace out;
  for (int r = 1; r < tp; ++r)
    if (ranks[r].layers.size() != ranks[0].layers.size())
      throw TpError("rank " + std::to_string(r) + " traced " +
                    std::to_string(ranks[r].layers.size()) + " layers; rank 0 traced " +
                    std::to_string(ranks[0].layers.size()));
  for (std::size_t l = 0; l < ranks[0].layers.size(); ++l) {
    LayerTrace lt;
    for (const Tensor& t0 : ranks[0].layers[l].tensors) {
      std::vector<const Tensor*> parts{&t0};
      for (int r = 1; r < tp; ++r) {
        const Tensor* t = ranks[r].layers[l].find(t0.name);
        if (!t)
          throw TpError(at(r, static_cast<int>(l), t0.name) + ": stage missing (rank 0 has it)");
        parts.push_back(t);
      }
      lt.tensors.push_back(is_head_split_stage(t0.name) ? heads_joined(parts, static_cast<int>(l))
                                                        : replicated(parts, static_cast<int>(l)));
    }
    out.layers.push_back(std::move(lt));
  }
  std::vector<const Tensor*> outputs;
  for (const StepTrace& r : ranks) outputs.push_back(&r.output);
  out.output = replicated(outputs, -1);
  return out;
}

// ---------------------------------------------------------------------------------------------

struct TpGroup::Impl {
#if DSV32_HAVE_NCCL
  /// o_proj's gather over one rank's NCCL communicator.
  struct NcclGather final : RankGather {
    ncclComm_t comm = nullptr;
    int n = 1;
    int ranks() const override { return n; }
    void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override {
      const ncclResult_t e =
          ncclAllGather(send, recv, bytes, ncclUint8, comm, static_cast<cudaStream_t>(stream));
      if (e != ncclSuccess)
        throw TpError(std::string("o_proj all-gather: NCCL: ") + ncclGetErrorString(e) + ": " +
                      ncclGetLastError(comm));
    }
  };
  std::vector<NcclGather> gathers;
#endif
  Config cfg;
  int tp = 1;
  TpTransport transport = TpTransport::one_gpu;
  std::unique_ptr<LocalExchange> local;  // one_gpu: the ranks' gather through device memory
  std::vector<std::unique_ptr<Stack>> stacks;
  std::vector<StepTrace> last;
  std::string broken;    // why the group refuses calls ("" while usable)
  int inject_rank = -1;  // inject_rank_failure: the rank whose next run throws

  /// Runs f(rank) on every rank, one thread each (inline for one rank). When a rank throws, the
  /// others may wait for it inside a collective forever: the communicators are aborted, every
  /// thread is joined, and the first rank's error is rethrown as TpError.
  void each_rank(const std::function<void(int)>& f) {
    if (!broken.empty()) throw TpError("tensor-parallel group unusable: " + broken);
    if (tp == 1) return f(0);
    std::vector<std::future<void>> done;
    for (int r = 0; r < tp; ++r) done.push_back(std::async(std::launch::async, f, r));
    std::vector<bool> finished(tp, false);
    std::string first;
    for (int left = tp; left > 0;) {
      for (int r = 0; r < tp; ++r) {
        if (finished[r] ||
            done[r].wait_for(std::chrono::milliseconds(1)) != std::future_status::ready)
          continue;
        finished[r] = true;
        --left;
        try {
          done[r].get();
        } catch (const std::exception& e) {
          if (first.empty()) {
            first = "rank " + std::to_string(r) + ": " + e.what();
            abort_comms();  // releases the ranks waiting for this one in a collective
          }
        }
      }
    }
    if (first.empty() && local) first = local->failure();
    if (!first.empty()) {
      broken = first;
      throw TpError(first);
    }
  }

  void abort_comms() {
    if (local) local->abort();
#if DSV32_HAVE_NCCL
    for (NcclGather& g : gathers)
      if (g.comm) ncclCommAbort(g.comm), g.comm = nullptr;
#endif
  }

  ~Impl() {
    // Each stack frees on its own device; then the communicators or the exchange go.
    stacks.clear();
    local.reset();
#if DSV32_HAVE_NCCL
    for (NcclGather& g : gathers)
      if (g.comm) ncclCommDestroy(g.comm);
#endif
  }
};

TpGroup::TpGroup(const Config& cfg, const Weights& weights, int tp, int num_blocks, int max_tokens,
                 const StackOptions& options, TpTransport transport)
    : impl_(std::make_unique<Impl>()) {
  const Config shard = cfg.tp_shard(tp);  // ConfigError unless tp divides the heads
  weights.check_shapes(cfg);
  if (const std::string why = no_tp_reason(tp, transport); !why.empty()) throw TpError(why);
  Impl& m = *impl_;
  m.cfg = cfg;
  m.tp = tp;
  m.transport = resolve(transport, tp);
  m.stacks.resize(tp);
  int here = 0;  // one_gpu: every rank on the caller's device
  if (m.transport == TpTransport::one_gpu) {
    if (cudaGetDevice(&here) != cudaSuccess) throw TpError("tp: no current CUDA device");
    if (tp > 1)  // o_proj's rows: at most max_tokens x D values of fp32 a rank
      m.local = std::make_unique<LocalExchange>(
          tp, static_cast<std::size_t>(std::max(max_tokens, 1)) * cfg.hidden_size * sizeof(float));
  }
#if DSV32_HAVE_NCCL
  if (tp > 1 && m.transport == TpTransport::nccl) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);      // NVLink multicast stays off (docs/GPU.md)
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);  // connect now, not inside a capture
    std::vector<ncclComm_t> comms(tp);
    std::vector<int> devices(tp);
    for (int r = 0; r < tp; ++r) devices[r] = r;
    if (const ncclResult_t e = ncclCommInitAll(comms.data(), tp, devices.data()); e != ncclSuccess)
      throw TpError(std::string("tp ") + std::to_string(tp) +
                    ": ncclCommInitAll: " + ncclGetErrorString(e));
    m.gathers.resize(tp);
    for (int r = 0; r < tp; ++r) m.gathers[r].comm = comms[r], m.gathers[r].n = tp;
  }
#endif
  const int per = cfg.num_heads / tp;
  m.each_rank([&](int r) {
    Weights w;
    for (int l = 0; l < cfg.num_layers; ++l)
      w.layers.push_back(weights.head_shard(cfg, l, r * per, (r + 1) * per));
    RankGather* gather = m.local ? m.local->gather(r) : nullptr;
#if DSV32_HAVE_NCCL
    if (tp > 1 && m.transport == TpTransport::nccl) gather = &m.gathers[r];
#endif
    const int device = m.transport == TpTransport::nccl ? r : here;
    m.stacks[r] =
        std::make_unique<Stack>(shard, w, num_blocks, max_tokens, device, gather, options);
  });
}

TpGroup::~TpGroup() = default;

int TpGroup::size() const {
  return impl_->tp;
}

TpTransport TpGroup::transport() const {
  return impl_->transport;
}

StackReport TpGroup::report() const {
  return impl_->stacks.front()->report();
}

StepTrace TpGroup::run(const boundary::Plan& plan, const StepInput& in) {
  Impl& m = *impl_;
  m.last.assign(m.tp, StepTrace{});
  const int inject = std::exchange(m.inject_rank, -1);
  if (m.local)  // every rank captures what the step needs before any rank replays
    m.each_rank([&](int r) {
      if (r == inject) return;
      const LocalExchange::Rehearsal rehearsing(*m.local, r);
      m.stacks[r]->prepare(plan, in);
    });
  m.each_rank([&](int r) {
    if (r == inject) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the others reach o_proj
      throw TpError("injected failure");
    }
    m.last[r] = m.stacks[r]->run(plan, in);
  });
  return merge_rank_traces(m.cfg, m.last);
}

void TpGroup::inject_rank_failure(int rank) {
  if (rank < 0 || rank >= impl_->tp)
    throw TpError("inject_rank_failure: rank " + std::to_string(rank) + " of a group of " +
                  std::to_string(impl_->tp));
  impl_->inject_rank = rank;
}

const std::vector<StepTrace>& TpGroup::rank_traces() const {
  return impl_->last;
}

void TpGroup::synthesize_context(const StepInput& in) {
  impl_->each_rank([&](int r) { impl_->stacks[r]->lab().synthesize_context(in); });
}

double TpGroup::time_step(const boundary::Plan& plan, const StepInput& in, int repeats) {
  Impl& m = *impl_;
  std::vector<double> ms(m.tp, 0.0);
  m.each_rank([&](int r) { ms[r] = m.stacks[r]->lab().time_step(plan, in, repeats); });
  return *std::max_element(ms.begin(), ms.end());
}

std::vector<StepTrace> run_steps_tp(const Config& cfg, const Weights& weights, int tp,
                                    int num_blocks, const std::vector<StepInput>& steps,
                                    const boundary::Plan& plan, int* captures,
                                    TpTransport transport) {
  TpGroup group(cfg, weights, tp, num_blocks, max_capture_size(steps), {}, transport);
  std::vector<StepTrace> out;
  for (const StepInput& in : steps) out.push_back(group.run(plan, in));
  if (captures) *captures = group.report().captures;
  return out;
}

}  // namespace dsv32::gpu

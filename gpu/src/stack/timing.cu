// Timing: a step's time under a plan, each op's in isolation, and the ablation that leaves one
// launch out (Stack::skip_launch) with the labels it names launches by.
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "impl.cuh"

namespace dsv32::gpu::stack {
namespace {

/// A kernel's name without namespaces, template arguments or parameters ("gemv").
std::string demangled_label(const void* kernel) {
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

constexpr int kTimingBatches = 3;

/// Busy-waits `us` microseconds on the host (a framework's dispatch cost).
void host_spin(double us) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

template <class S>
void StackImpl<S>::replay(BreakableGraph& g) {
  if (graph_cost_us > 0)
    g.replay([us = graph_cost_us] { host_spin(us); });
  else
    g.replay();
}

template <class S>
void StackImpl<S>::charge_op() {
  if (op_cost_us > 0 && !graph_) host_spin(op_cost_us);
}

/// Milliseconds the work `launch` enqueues on the stack's stream takes on the GPU (CUDA events),
/// and the host's milliseconds in `launch` itself (enqueuing, or blocked where the launch queue
/// was full).
template <class S>
template <class F>
typename StackImpl<S>::Timing StackImpl<S>::elapsed_ms(const char* what, F&& launch) {
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

/// The medians of kTimingBatches timings of `launch`, the GPU's and the host's (a host stall or
/// a clock change in one batch does not move them).
template <class S>
template <class F>
typename StackImpl<S>::Timing StackImpl<S>::median_ms(const char* what, F&& launch) {
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

template <class S>
double StackImpl<S>::time_step(const boundary::Plan& plan, const StepInput& in, int repeats) {
  step(plan, in, false);  // warm-up; captures on first use
  const boundary::Plan& serving = serving_plan(plan, in);
  BreakableGraph* graph =
      serving.capture ? captures_.at({serving.record_signature(), in.capture_size}).get() : nullptr;
  const Timing t = median_ms("time step", [&] {
    for (int i = 0; i < repeats; ++i) launch(serving, graph);
  });
  host_step_ms_ = t.host / repeats;
  return t.gpu / repeats;
}

template <class S>
std::vector<std::pair<std::string, double>> StackImpl<S>::time_ops(const StepInput& in, int repeats,
                                                                   bool graph, bool device_driven) {
  if (device_driven && !boundary::uniform_decode(in))
    throw boundary::PlanError("time_ops: the device-driven variants serve uniform decode steps");
  const boundary::Plan eager = boundary::plan_preset("eager", cfg);
  step(eager, in, false);
  upload_step(in);
  device_ops_ = device_driven;
  std::vector<std::string> ops = eager.ops(cfg, 0);
  ops.insert(ops.end() - 2, {"latent_copy", "uv_proj_static"});
  std::vector<std::pair<std::string, double>> out;
  lead_ = false;  // each op alone: indexer_wq_b is timed as its own op
  for (const std::string& name : ops) {
    const boundary::Op op = boundary::op_of(name);
    const auto run_repeats = [&](int n) {  // each run joined: the op alone, end to end
      for (int i = 0; i < n; ++i) {
        run_op(0, op);
        join_side();
      }
    };
    run_repeats(1);  // warm-up
    if (!graph) {
      const double ms = median_ms(("time op " + name).c_str(), [&] { run_repeats(repeats); }).gpu;
      out.emplace_back(name, ms / repeats);
      continue;
    }
    // The repeats captured as one graph and replayed: the GPU's time, not the host's launches
    // (host values, such as the backend ring's address, are those of the capture).
    const std::string what = "time op " + name + " (graph)";
    BreakableGraph g(stream_, std::vector<Stream>{aux_});
    const Recording recording(*this, &g, false);
    g.begin();
    g.graph(name, [&] { run_repeats(repeats); });
    g.end();
    g.replay();  // warm-up
    const double ms = median_ms(what.c_str(), [&] { g.replay(); }).gpu;
    out.emplace_back(name, ms / repeats);
  }
  return out;
}

template <class S>
void StackImpl<S>::skip_launch(const std::string& label) {
  if (label == skip_) return;  // the captures held were recorded with the same launches
  skip_ = label;
  captures_.clear();  // a capture recorded with a launch missing must not replay for a step
}

template <class S>
std::vector<std::string> StackImpl<S>::launch_labels(const StepInput& in) {
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

template <class S>
bool StackImpl<S>::skip_kernel(const char* op, const void* kernel) {
  return bypass([&] { return std::string(op) + ":" + kernel_label(kernel); });
}

/// A cuBLAS call of op `op` ("op:cuBLAS what", without a leading "op " in `what`).
template <class S>
bool StackImpl<S>::bypass_blas(const std::string& op, const std::string& what) {
  return bypass([&] {
    return op + ":cuBLAS " + (what.rfind(op + " ", 0) == 0 ? what.substr(op.size() + 1) : what);
  });
}

/// Worked out once a kernel: the driver's lookup and the demangling per launch would make an
/// ablation's eager steps host-bound.
template <class S>
const std::string& StackImpl<S>::kernel_label(const void* kernel) {
  auto [it, fresh] = kernel_labels_.try_emplace(kernel);
  if (fresh) it->second = demangled_label(kernel);
  return it->second;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

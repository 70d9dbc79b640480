// The stack's lab: a step's time under a plan, each op's in isolation, a framework's modelled
// host costs, and the ablation that leaves one launch out (StackLab::skip_launch) with the
// labels it names launches by.
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

void HostCosts::set(double eager_op_us, double graph_launch_us) {
  op_us_ = eager_op_us;
  graph_us_ = graph_launch_us;
}

void HostCosts::charge_op(const LaunchState& st) const {
  if (op_us_ > 0 && st.charged()) host_spin(op_us_);
}

void HostCosts::replay(BreakableGraph& g) const {
  if (graph_us_ > 0)
    g.replay([us = graph_us_] { host_spin(us); });
  else
    g.replay();
}

k::LaunchFilter* Ablation::filter() {
  return recording_ || !skip_.empty() ? this : nullptr;
}

bool Ablation::set_skip(const std::string& label) {
  if (label == skip_) return false;
  skip_ = label;
  return true;
}

void Ablation::start_recording() {
  labels_.clear();
  recording_ = true;
}

std::vector<std::string> Ablation::stop_recording() {
  recording_ = false;
  return std::move(labels_);
}

/// True when the launch labelled label() is the one to skip; records the label while labels
/// are recorded. label() is only called then, so a normal launch builds no string.
template <class L>
bool Ablation::bypass(L&& label) {
  if (!recording_ && skip_.empty()) return false;
  const std::string l = label();
  if (recording_) labels_.push_back(l);
  return l == skip_;
}

bool Ablation::skip_kernel(const char* op, const void* kernel) {
  return bypass([&] { return std::string(op) + ":" + kernel_label(kernel); });
}

bool Ablation::skip_blas(const std::string& op, const std::string& what) {
  return bypass([&] {
    return op + ":cuBLAS " + (what.rfind(op + " ", 0) == 0 ? what.substr(op.size() + 1) : what);
  });
}

bool Ablation::skip_label(const char* label) {
  return bypass([&] { return std::string(label); });
}

/// Worked out once a kernel: the driver's lookup and the demangling per launch would make an
/// ablation's eager steps host-bound.
const std::string& Ablation::kernel_label(const void* kernel) {
  auto [it, fresh] = kernel_labels_.try_emplace(kernel);
  if (fresh) it->second = demangled_label(kernel);
  return it->second;
}

template <class S>
void StackImpl<S>::set_host_costs(double eager_op_us, double graph_launch_us) {
  costs_.set(eager_op_us, graph_launch_us);
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
  check(cudaEventRecord(e.a, streams_.main()), what);
  const auto t0 = std::chrono::steady_clock::now();
  launch();
  const double host =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  check(cudaEventRecord(e.b, streams_.main()), what);
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
  const boundary::Plan& serving = faults_.serving(plan, in);
  BreakableGraph* graph =
      serving.capture ? captures_.at({serving.record_signature(), in.capture_size}).graph.get()
                      : nullptr;
  const Timing t = median_ms("time step", [&] {
    for (int i = 0; i < repeats; ++i) launch(serving, graph);
  });
  host_step_ms_ = t.host / repeats;
  return t.gpu / repeats;
}

template <class S>
std::vector<std::pair<Op, double>> StackImpl<S>::time_ops(const StepInput& in, int repeats,
                                                          bool graph, bool device_driven) {
  if (device_driven && !boundary::uniform_decode(in))
    throw boundary::PlanError("time_ops: the device-driven variants serve uniform decode steps");
  const boundary::Plan eager = boundary::plan_preset(boundary::PlanPreset::eager, cfg);
  step(eager, in, false);
  upload_step(in);
  const OpList layer = eager.layer_ops(cfg, 0);
  std::vector<Op> ops(layer.begin(), layer.end());
  ops.insert(ops.end() - 2, {Op::latent_copy, Op::uv_proj_static});
  std::vector<std::pair<Op, double>> out;
  for (const Op op : ops) {
    const std::string& name = op_name(op);
    // Each op alone (no lead: indexer_wq_b is timed as its own op), eagerly or recorded.
    LaunchState st;
    st.device_driven = device_driven;
    const auto run_repeats = [&](int n) {  // each run joined: the op alone, end to end
      for (int i = 0; i < n; ++i) {
        run_op(0, op, st);
        streams_.join(st);
      }
    };
    run_repeats(1);  // warm-up
    if (!graph) {
      const double ms = median_ms(("time op " + name).c_str(), [&] { run_repeats(repeats); }).gpu;
      out.emplace_back(op, ms / repeats);
      continue;
    }
    // The repeats captured as one graph and replayed: the GPU's time, not the host's launches
    // (host values, such as the backend ring's address, are those of the capture).
    const std::string what = "time op " + name + " (graph)";
    BreakableGraph g(streams_.main(), std::vector<Stream>{streams_.aux()});
    st.where = LaunchState::Where::graph;
    st.graph = &g;
    try {
      g.begin();
      g.graph(name, [&] { run_repeats(repeats); });
      g.end();
    } catch (...) {
      streams_.drop_fork();  // the graph has joined its side stream
      throw;
    }
    g.replay();  // warm-up
    const double ms = median_ms(what.c_str(), [&] { g.replay(); }).gpu;
    out.emplace_back(op, ms / repeats);
  }
  return out;
}

template <class S>
void StackImpl<S>::set_mutant(boundary::StackMutant mutant) {
  faults_.set(mutant);
  drop_captures();  // captures recorded without the mutant would hide it
}

template <class S>
void StackImpl<S>::skip_launch(const std::string& label) {
  // A capture recorded with a launch missing must not replay for a step; the captures held
  // were recorded with the same launches when the label does not change.
  if (ablation_.set_skip(label)) drop_captures();
}

template <class S>
std::vector<std::string> StackImpl<S>::launch_labels(const StepInput& in) {
  ablation_.start_recording();
  try {
    run(boundary::plan_preset(boundary::PlanPreset::eager, cfg), in, false);
  } catch (...) {
    ablation_.stop_recording();
    throw;
  }
  return ablation_.stop_recording();
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

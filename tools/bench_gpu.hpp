// `dsv32 bench-gpu`'s options and the helpers its benchmarks share (tools/bench_gpu*.cpp): the
// plan table (bench_gpu.cpp), per-op times and the ablation (bench_gpu_ops.cpp), device memory
// (bench_gpu_memory.cpp) and the what-if of a framework's dispatch cost (bench_gpu_whatif.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/weights.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/stack.hpp"
#endif

namespace dsv32::tools {

struct BenchGpuOptions {
  std::string preset = "dsv32-tp4";
  int layers = 4;
  int context = 4096;
  std::vector<int> decode = {1, 8, 64};
  int repeats = 20;
  std::string json;
  bool per_op = false;
  bool per_op_eager = false;  // time each op's repeats eagerly instead of as a captured graph
  std::vector<std::string> per_op_presets = {"dsv32", "dsv32-tp4"};
  std::vector<int> per_op_tokens = {1, 8, 64, 512};
  std::vector<int> tp = {1};
  bool ablate = false;
  bool memory = false;
  int memory_max_size = 512;
  std::vector<int> memory_layers = {4, 8};
  int memory_model_layers = 61;  // DeepSeek-V3.2's
  std::vector<double> memory_gpu_gib = {80, 141};
  double memory_utilization = 0.9;
  // The what-if benchmark (--dispatch-us): a framework's host cost per eager op (a sweep) and
  // per graph launch, at a model's depth.
  std::vector<double> dispatch_us;
  double graph_launch_us = 0;
  // 16, not DeepSeek-V3.2's 61: the oracle's weights are doubles (a dsv32-tp4 layer's are 0.6
  // GB on the host), and a step's time and its host costs both grow by the layer, so the ratios
  // hold at any depth past a few layers; --whatif-layers 61 runs the model's.
  int whatif_layers = 16;
  int whatif_rounds = 3;
  // Prefill chunks: 512 tokens (GPU-bound here) and a short one whose layer takes about as long
  // on the GPU as a framework's host costs do (a short prompt's TTFT).
  std::vector<int> whatif_prefill = {64, 512};
  // The stack's switches (gpu::StackOptions), for A/B runs; recorded in every JSON.
  bool pdl = true, overlap = true, index_mma = true, topk_bins = true;
};

/// The largest --decode batch.
int largest_batch(const BenchGpuOptions& o);

#if DSV32_HAVE_CUDA
gpu::StackOptions stack_options(const BenchGpuOptions& o);
/// The stack's options as JSON (every benchmark's "options") and as one line of text.
nlohmann::json options_json(const BenchGpuOptions& o);
std::string options_text(const BenchGpuOptions& o);
/// `n` decode requests, each with `ctx` cached tokens, in disjoint runs of blocks.
StepInput decode_step(const Config& cfg, int n, int ctx, int num_blocks);
/// One prefill chunk of `q` tokens extending a request with `ctx` cached tokens.
StepInput chunk_step(const Config& cfg, int q, int ctx, int num_blocks);
/// The stack the plan-timing and memory benchmarks build: --preset with --layers F layers.
Config stack_config(const BenchGpuOptions& o);
/// Cache blocks for the largest batch's requests at --context tokens (and one new token) each.
int cache_blocks(const Config& cfg, const BenchGpuOptions& o);
/// --preset with `layers` F layers and weights: one generated layer repeated (timing only).
std::pair<Config, Weights> deep_stack(const BenchGpuOptions& o, int layers);

int run_per_op(const BenchGpuOptions& o);
int run_ablate(const BenchGpuOptions& o);
int run_memory(const BenchGpuOptions& o);
int run_whatif(const BenchGpuOptions& o);
#endif

}  // namespace dsv32::tools

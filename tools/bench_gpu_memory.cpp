// `dsv32 bench-gpu --memory`: device memory of every capturing plan, its static buffers and its
// graphs over vLLM's capture sizes, and what the copy form costs at the model's depth.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "bench_gpu.hpp"
#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#include "report.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#endif

namespace dsv32::tools {
#if DSV32_HAVE_CUDA
/// One plan's (or dispatch mode's) device memory at one layer count.
struct MemoryRow {
  std::string plan;
  double needed = 0, graphs = 0;  // bytes: the static buffers it needs, its graphs
  std::vector<double> per_size;   // graph bytes per capture size
};

/// The measured rows of one layer count, and its static buffers.
struct MemoryRun {
  int layers = 0;
  double statics = 0, copy = 0;
  std::vector<MemoryRow> rows;
  const MemoryRow& row(const std::string& plan) const {
    for (const MemoryRow& r : rows)
      if (r.plan == plan) return r;
    throw std::logic_error("no memory row for " + plan);
  }
};

/// Device memory per plan at `layers` layers: one stack sized for --memory-max-size tokens holds
/// the graphs of every capturing plan at every size of vLLM's list up to it, each plan's from
/// cudaMemGetInfo deltas around its captures; nothing is freed between plans, so no plan's count
/// reuses pages another freed. The static buffers are measured once; the copy form's static
/// latent is counted as needed only by the plans that read it. A dispatch mode holds two kinds
/// of graph for every size: its rows are the sums of its full graph's row and its piecewise
/// plan's (full-and-piecewise: full + narrow; its copy variant: full + narrow-copy), measured
/// once each (the stack keys graphs by what they record, so the dispatch mode's captures would
/// replace those of `full` and `narrow` rather than add to them).
MemoryRun measure_memory(const BenchGpuOptions& o, int layers, nlohmann::json& out) {
  BenchGpuOptions at = o;
  at.layers = layers;
  const Config cfg = stack_config(at);
  const Weights w = Weights::generate(cfg, 1);
  const int max_batch = largest_batch(o), blocks = cache_blocks(cfg, o);
  const std::vector<int> sizes = boundary::capture_sizes(o.memory_max_size);
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  fmt::print(
      "\nbench-gpu --memory: {} ({} layers), {} cache blocks ({} tokens each of {} "
      "requests), capture sizes 1..{} ({} sizes), {}\n",
      o.preset, layers, blocks, o.context + 1, max_batch, o.memory_max_size, sizes.size(),
      gpu::device_summary());
  fmt::print("stack options: {}\n", options_text(o));
  MemoryRun run;
  run.layers = layers;
  const std::size_t before = gpu::device_used_bytes();
  gpu::Stack stack(cfg, w, blocks, o.memory_max_size, 0, nullptr, stack_options(o));
  run.statics = static_cast<double>(gpu::device_used_bytes() - before);
  run.copy = static_cast<double>(stack.report().copy_form_bytes);
  fmt::print(
      "static buffers (weights, caches, inter-op tensors): {:.3f} GiB, of which the copy "
      "form's static latent {:.3f} GiB\n",
      run.statics / gib, run.copy / gib);
  fmt::print("{:<32} {:>12} {:>12} {:>14} {:>12}\n", "plan", "needed", "graphs", "max a capture",
             "total");
  nlohmann::json j{{"layers", layers},
                   {"num_blocks", blocks},
                   {"capture_sizes", sizes},
                   {"static_bytes", run.statics},
                   {"copy_form_latent_bytes", run.copy}};
  const auto show = [&](const MemoryRow& r) {
    fmt::print("{:<32} {:>8.3f} GiB {:>8.3f} GiB {:>10.1f} MiB {:>8.3f} GiB\n", r.plan,
               r.needed / gib, r.graphs / gib,
               *std::max_element(r.per_size.begin(), r.per_size.end()) / mib,
               (r.needed + r.graphs) / gib);
    j["rows"].push_back({{"plan", r.plan},
                         {"needed_static_bytes", r.needed},
                         {"graph_bytes", r.graphs},
                         {"graph_bytes_per_size", r.per_size},
                         {"total_needed_bytes", r.needed + r.graphs}});
  };
  for (const std::string& name : boundary::plan_names()) {
    const boundary::Plan plan = boundary::plan_preset(name, cfg);
    if (!plan.capture || (plan.mixed && plan.mixed->capture)) continue;  // eager; dispatch below
    MemoryRow r{name, plan.copy_form ? run.statics : run.statics - run.copy, 0, {}};
    const std::size_t start = gpu::device_used_bytes();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t b = gpu::device_used_bytes();
      stack.capture(plan, sizes[i]);
      r.per_size.push_back(static_cast<double>(gpu::device_used_bytes() - b));
      progress(fmt::format("  {}: captured {}/{} sizes", name, i + 1, sizes.size()),
               i + 1 == sizes.size());
    }
    r.graphs = static_cast<double>(gpu::device_used_bytes() - start);
    run.rows.push_back(r);
    show(r);
  }
  for (const char* piecewise : {"narrow", "narrow-copy"}) {
    const MemoryRow &full = run.row("full"), &piece = run.row(piecewise);
    MemoryRow r{boundary::full_and_piecewise(cfg, piecewise).name,
                std::max(full.needed, piece.needed),
                full.graphs + piece.graphs,
                {}};
    for (std::size_t i = 0; i < sizes.size(); ++i)
      r.per_size.push_back(full.per_size[i] + piece.per_size[i]);
    run.rows.push_back(r);
    show(r);
  }
  j["captures_held"] = stack.report().captures;
  out["runs"].push_back(j);
  return run;
}

/// The seed's question: what the copy form costs over no-copy under full-and-piecewise, per
/// layer (the slope between the two largest layer counts measured) and at --memory-model-layers
/// layers, in bytes and in tokens of KV cache (every layer's latent, rope part and indexer key
/// a token: the cache it displaces), and against each --memory-gpu-gib GPU.
void memory_summary(const BenchGpuOptions& o, const std::vector<MemoryRun>& runs,
                    nlohmann::json& out) {
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  const MemoryRun &a = runs.front(), &b = runs.back();
  const auto total = [](const MemoryRun& r, const std::string& plan) {
    const MemoryRow& row = r.row(plan);
    return row.needed + row.graphs;
  };
  const std::string nocopy = "full-and-piecewise", copy = "full-and-piecewise:narrow-copy";
  const int N = o.memory_model_layers;
  const Config cfg = preset(o.preset);
  // Bytes of KV cache a token takes in every layer: latent and rope part (bf16), the indexer's
  // fp8 key and its scale.
  const double kv_token =
      static_cast<double>(N) *
      ((cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2.0 + cfg.index_head_dim + 4.0);
  nlohmann::json sj{{"model_layers", N}, {"kv_bytes_per_token", kv_token}};
  fmt::print("\ncopy form vs no-copy under full-and-piecewise ({} layers measured)\n", b.layers);
  const double extra_b = total(b, copy) - total(b, nocopy);
  double per_layer = extra_b / b.layers, fixed = 0;
  if (runs.size() > 1 && b.layers != a.layers) {
    const double extra_a = total(a, copy) - total(a, nocopy);
    per_layer = (extra_b - extra_a) / (b.layers - a.layers);
    fixed = extra_b - per_layer * b.layers;
  }
  const double at_n = fixed + per_layer * N;
  fmt::print(
      "  extra at {} layers: {:.1f} MiB (static latent {:.1f} MiB, graphs {:+.1f} MiB)\n"
      "  extra a layer: {:.1f} MiB; at {} layers: {:.2f} GiB = {:.0f} tokens of KV cache "
      "({:.0f} bytes a token over {} layers)\n",
      b.layers, extra_b / mib, b.copy / mib,
      (b.row("narrow-copy").graphs - b.row("narrow").graphs) / mib, per_layer / mib, N, at_n / gib,
      at_n / kv_token, kv_token, N);
  sj["extra_bytes_measured"] = extra_b;
  sj["extra_bytes_per_layer"] = per_layer;
  sj["extra_bytes_at_model_layers"] = at_n;
  sj["extra_kv_tokens_at_model_layers"] = at_n / kv_token;
  for (double g : o.memory_gpu_gib) {
    const double slack = (1.0 - o.memory_utilization) * g * gib;
    fmt::print(
        "  on a {:.0f} GiB GPU: {:.2f}% of it; vLLM at gpu_memory_utilization {:.2f} leaves "
        "{:.1f} GiB outside its budget, the copy form's extra is {:.0f}% of that\n",
        g, 100 * at_n / (g * gib), o.memory_utilization, slack / gib, 100 * at_n / slack);
    sj["gpus"].push_back(
        {{"gib", g}, {"fraction_of_gpu", at_n / (g * gib)}, {"fraction_of_slack", at_n / slack}});
  }
  out["copy_vs_nocopy_full_and_piecewise"] = sj;
}

int run_memory(const BenchGpuOptions& o) {
  nlohmann::json out;
  out["options"] = options_json(o);
  out["preset"] = o.preset;
  out["context"] = o.context;
  out["memory_max_size"] = o.memory_max_size;
  std::vector<int> layer_counts = o.memory_layers;
  std::sort(layer_counts.begin(), layer_counts.end());
  std::vector<MemoryRun> runs;
  for (int layers : layer_counts) {
    // Each count from a fresh context: the driver would hand the last count's freed graph
    // pages to this count's graphs, and their deltas would read 0.
    gpu::release_device_memory();
    runs.push_back(measure_memory(o, layers, out));
  }
  fmt::print(
      "needed: the static buffers, less the copy form's latent for a no-copy plan; graphs: the "
      "plan's instantiated graphs over the sizes (cudaMemGetInfo deltas, 2 MiB pages); total = "
      "needed + graphs; a dispatch mode: its full graph's row plus its piecewise plan's\n");
  memory_summary(o, runs, out);
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

#endif
}  // namespace dsv32::tools

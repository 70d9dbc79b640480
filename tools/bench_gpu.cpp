// `dsv32 bench-gpu`: step time of every plan side by side (CUDA events over replays) on decode
// batches at a long synthesized context, with each plan's ratio to `eager` in the same run.
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
namespace {

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
int largest_batch(const BenchGpuOptions& o) {
  int m = 1;
  for (int n : o.decode) m = std::max(m, n);
  return m;
}

#if DSV32_HAVE_CUDA
gpu::StackOptions stack_options(const BenchGpuOptions& o) {
  gpu::StackOptions so;
  so.pdl = o.pdl;
  so.overlap = o.overlap;
  so.index_mma = o.index_mma;
  so.topk_bins = o.topk_bins;
  return so;
}

/// The stack's options as JSON (every benchmark's "options") and as one line of text.
nlohmann::json options_json(const BenchGpuOptions& o) {
  nlohmann::json j;
  for (const auto& [name, on] : stack_options(o).fields()) j[name] = on;
  return j;
}
std::string options_text(const BenchGpuOptions& o) {
  std::string t;
  for (const auto& [name, on] : stack_options(o).fields())
    t += fmt::format("{}{}={}", t.empty() ? "" : " ", name, on ? "on" : "off");
  return t;
}

/// Fills the step's hidden rows (one per token, bf16 values of RNG stream `seed`) and derives it.
StepInput derived(const Config& cfg, StepInput in, std::uint64_t seed, int num_blocks) {
  int rows = 0;
  for (const RequestStep& r : in.requests) rows += r.q;
  const rng::Stream s(seed, "bench-gpu/hidden");
  in.hidden.resize(rows, cfg.hidden_size);
  for (Eigen::Index i = 0; i < in.hidden.size(); ++i)
    in.hidden.data()[i] = round_bf16(s.symmetric(i));
  in.derive(cfg, num_blocks);
  return in;
}

/// `n` decode requests, each with `ctx` cached tokens, in disjoint runs of blocks.
StepInput decode_step(const Config& cfg, int n, int ctx, int num_blocks) {
  StepInput in;
  const int per = (ctx + 1 + cfg.block_size - 1) / cfg.block_size;
  for (int r = 0; r < n; ++r) {
    RequestStep rs{r, ctx, 1, {}};
    for (int b = 0; b < per; ++b) rs.block_table.push_back(r * per + b);
    in.requests.push_back(rs);
  }
  return derived(cfg, std::move(in), 3, num_blocks);
}

/// One prefill chunk of `q` tokens extending a request with `ctx` cached tokens.
StepInput chunk_step(const Config& cfg, int q, int ctx, int num_blocks) {
  StepInput in;
  RequestStep rs{0, ctx, q, {}};
  for (int b = 0; b < (ctx + q + cfg.block_size - 1) / cfg.block_size; ++b)
    rs.block_table.push_back(b);
  in.requests.push_back(rs);
  return derived(cfg, std::move(in), 4, num_blocks);
}

/// Bytes an op must move at least (weights once, activations in and out, the cache entries it
/// reads), in bf16 storage: the numerator of its bandwidth floor.
double op_bytes(const Config& c, const std::string& op, const StepInput& in) {
  const double T = in.capture_size, D = c.hidden_size, H = c.num_heads, Rq = c.q_lora_rank,
               L = c.kv_lora_rank, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
               dv = c.v_head_dim, HI = c.index_n_heads, dI = c.index_head_dim, K = c.index_topk,
               dq = dn + dr, A = Rq + L + dr;
  double keys = 0, selected = 0;  // distinct cache rows the indexer and attention read
  for (const RequestStep& r : in.requests) {
    keys += r.seq_len();
    selected += std::min<double>(r.seq_len(), r.q * K);
  }
  double elems = 0, bytes = 0;
  if (op == "input_norm")
    elems = 2 * T * D + D;
  else if (op == "qkv_a_proj")
    elems = A * D + T * (D + A);
  else if (op == "indexer_wk_proj")
    elems = (dI + HI) * D + T * (D + dI + HI);
  else if (op == "norm_rope_cache")
    elems = T * (A + Rq + L + dr + 2 * dI + HI), bytes = T * dI;
  else if (op == "q_b_proj")
    elems = H * dq * Rq + T * (Rq + H * dq);
  else if (op == "uk_absorb")
    elems = H * dn * L + T * H * (dq + L);
  else if (op == "indexer_wq_b")
    elems = HI * dI * Rq + T * (Rq + HI * dI);
  else if (op == "fused_q")
    elems = T * H * (dq + dr) + T * HI * dI, bytes = T * HI * (dI + 8);
  else if (op == "indexer_topk")
    bytes = keys * (dI + 4) + T * HI * (dI + 4) + T * K * 4;
  else if (op == "sparse_mqa")
    elems = selected * (L + dr) + T * H * (2 * L + dr);
  else if (op == "uv_proj" || op == "uv_proj_static")
    elems = H * dv * L + T * H * (L + dv);
  else if (op == "latent_copy")
    elems = 2 * T * H * L;
  else if (op == "o_proj")
    elems = D * H * dv + T * (H * dv + D);
  else if (op == "residual_add")
    elems = 3 * T * D;
  return 2 * elems + bytes;
}

/// Preset `name` cut to one F layer (the per-op and ablation benchmarks' layer).
Config one_f_layer(const std::string& name) {
  Config cfg = preset(name);
  cfg.num_layers = 1;
  cfg.index_topk_pattern = "F";
  cfg.validate();
  return cfg;
}

/// Per-op times of one F layer at full sizes against each op's bandwidth floor.
int run_per_op(const BenchGpuOptions& o) {
  const double gbs = gpu::copy_bandwidth_gbs();
  fmt::print("bench-gpu --per-op: one F layer, context {}, {} runs per op ({}), {}\n", o.context,
             o.repeats, o.per_op_eager ? "launched eagerly" : "captured as one graph",
             gpu::device_summary());
  fmt::print("copy bandwidth {:.0f} GB/s (read + write, measured now): the floor's rate\n", gbs);
  fmt::print("stack options: {}\n", options_text(o));
  nlohmann::json out{{"context", o.context},
                     {"copy_gbs", gbs},
                     {"per_op_timing", o.per_op_eager ? "eager" : "graph"},
                     {"options", options_json(o)}};
  for (const std::string& name : o.per_op_presets) {
    const Config cfg = one_f_layer(name);
    const Weights w = Weights::generate(cfg, 1);
    std::vector<std::string> ops;
    std::map<int, std::vector<std::pair<std::string, double>>> times;
    std::map<int, std::map<std::string, double>> floors;
    std::map<int, double> layer_ms, narrow_ms, full_ms;
    // The device-driven variants of the H ops (`full`'s), decode batches only.
    std::map<int, std::map<std::string, double>> device_ms;
    for (int T : o.per_op_tokens) {
      // Decode batches up to 64 requests; larger T: one prefill chunk at the same context.
      const bool decode = T <= 64;
      const int per = (o.context + T + cfg.block_size) / cfg.block_size;
      const int blocks = decode ? T * per : per;
      const StepInput in =
          decode ? decode_step(cfg, T, o.context, blocks) : chunk_step(cfg, T, o.context, blocks);
      gpu::Stack stack(cfg, w, blocks, T, 0, nullptr, stack_options(o));
      stack.synthesize_context(in);
      times[T] = stack.time_ops(in, o.repeats, !o.per_op_eager);
      layer_ms[T] = stack.time_step(boundary::plan_preset("eager", cfg), in, o.repeats);
      // The layer as vLLM runs it: captured, the narrow boundary's ops eager between segments.
      narrow_ms[T] = stack.time_step(boundary::plan_preset("narrow", cfg), in, o.repeats);
      if (decode) {  // full: one graph, the H ops device-driven
        full_ms[T] = stack.time_step(boundary::plan_preset("full", cfg), in, o.repeats);
        for (const auto& [op, ms] : stack.time_ops(in, o.repeats, !o.per_op_eager, true))
          if (boundary::is_host_op(op) && op != "latent_copy") device_ms[T][op] = ms;
      }
      for (const auto& [op, ms] : times[T]) {
        floors[T][op] = op_bytes(cfg, op, in) / (gbs * 1e9) * 1e3;
        if (ops.size() < times[T].size()) ops.push_back(op);
      }
      fmt::print(stderr, "  {} T={} done\n", name, T);
    }
    fmt::print(
        "\n{} (H = {}): us per op (x its floor); T <= 64 decode, larger T one prefill "
        "chunk\n{:<16}",
        name, cfg.num_heads, "op");
    for (int T : o.per_op_tokens) fmt::print(" {:>20}", fmt::format("T={}", T));
    fmt::print("\n");
    nlohmann::json pj;
    const auto cell = [](double ms, double floor) {
      return fmt::format("{:9.1f} ({:7.1f}x)", ms * 1e3, ms / floor);
    };
    for (const std::string& op : ops) {
      fmt::print("{:<16}", op);
      for (int T : o.per_op_tokens) {
        double ms = 0;
        for (const auto& [n, v] : times[T])
          if (n == op) ms = v;
        fmt::print(" {:>20}", cell(ms, floors[T][op]));
        pj["ops"][op][std::to_string(T)] = {{"ms", ms}, {"floor_ms", floors[T][op]}};
      }
      fmt::print("\n");
    }
    // The device-driven H ops (decode batches): the same kernels over the capture size's rows.
    for (const std::string op : {"indexer_topk", "sparse_mqa", "uv_proj"}) {
      fmt::print("{:<16}", op + "*");
      for (int T : o.per_op_tokens) {
        const auto it = device_ms[T].find(op);
        if (it == device_ms[T].end()) {
          fmt::print(" {:>20}", "-");
          continue;
        }
        fmt::print(" {:>20}", cell(it->second, floors[T][op]));
        pj["device_ops"][op][std::to_string(T)] = {{"ms", it->second}, {"floor_ms", floors[T][op]}};
      }
      fmt::print("\n");
    }
    for (const auto& [label, key, ms_of] :
         {std::tuple{"layer (eager)", "layer", &layer_ms},
          std::tuple{"layer (narrow)", "layer_narrow", &narrow_ms},
          std::tuple{"layer (full)", "layer_full", &full_ms}}) {
      fmt::print("{:<16}", label);
      for (int T : o.per_op_tokens) {
        double floor = 0;  // the eager plan's ops: no copy form
        for (const auto& [op, f] : floors[T])
          if (op != "latent_copy" && op != "uv_proj_static") floor += f;
        const auto it = ms_of->find(T);
        if (it == ms_of->end()) {
          fmt::print(" {:>20}", "-");
          continue;
        }
        fmt::print(" {:>20}", cell(it->second, floor));
        pj[key][std::to_string(T)] = {{"ms", it->second}, {"floor_ms", floor}};
      }
      fmt::print("\n");
    }
    fmt::print("*: the device-driven variant (`full`'s), decode batches only\n");
    out["presets"][name] = pj;
  }
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

/// What each launch of one F layer costs the step: the layer timed (eager and narrow) with each
/// distinct launch left out in turn, against the layer with all of them (timed first and last).
/// The step's results are wrong by design while a launch is left out; only its time is used.
int run_ablate(const BenchGpuOptions& o) {
  const Config cfg = one_f_layer(o.preset);
  const Weights w = Weights::generate(cfg, 1);
  fmt::print(
      "bench-gpu --ablate: one F layer of {} (H = {}), context {}, {} timed replays per "
      "cell, {}\n",
      o.preset, cfg.num_heads, o.context, o.repeats, gpu::device_summary());
  fmt::print("stack options: {}\n", options_text(o));
  nlohmann::json out{{"preset", o.preset},
                     {"context", o.context},
                     {"repeats", o.repeats},
                     {"options", options_json(o)}};
  const boundary::Plan eager = boundary::plan_preset("eager", cfg),
                       narrow = boundary::plan_preset("narrow", cfg);
  for (int T : o.decode) {
    const int blocks = T * ((o.context + 1 + cfg.block_size - 1) / cfg.block_size);
    const StepInput in = decode_step(cfg, T, o.context, blocks);
    gpu::Stack stack(cfg, w, blocks, T, 0, nullptr, stack_options(o));
    stack.synthesize_context(in);
    std::vector<std::string> labels;
    for (const std::string& l : stack.launch_labels(in))
      if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
    // Eager and narrow us a step, and the host's us launching an eager step (a left-out
    // launch must not make the step host-bound, or its row measures the host).
    struct Cell {
      double eager, host, narrow;
    };
    const auto time_without = [&](const std::string& label) {
      stack.skip_launch(label);
      const double e = stack.time_step(eager, in, o.repeats) * 1e3;
      const double h = stack.last_host_ms() * 1e3;
      const double n = stack.time_step(narrow, in, o.repeats) * 1e3;
      stack.skip_launch("");
      return Cell{e, h, n};
    };
    const auto first = time_without("");
    std::vector<std::pair<std::string, Cell>> rows;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      rows.emplace_back(labels[i], time_without(labels[i]));
      fmt::print(stderr, "  T={} {}/{} {}\n", T, i + 1, labels.size(), labels[i]);
    }
    const auto last = time_without("");
    const double base_e = (first.eager + last.eager) / 2, base_n = (first.narrow + last.narrow) / 2;
    // A row whose eager host time reaches 90% of its step: the host's launches, not the GPU,
    // may have set that step's time (marked `*`; its change is not the launch's cost).
    const auto host_bound = [](const Cell& c) { return c.host >= 0.9 * c.eager; };
    int bound = 0;
    fmt::print(
        "\nT = {}: us a step with the launch left out, and the change from the mean of the "
        "two baselines; host: us the host took to launch an eager step\n"
        "{:<36} {:>10} {:>7} {:>8} {:>10} {:>8}\n",
        T, "launch left out", "eager", "host", "change", "narrow", "change");
    const auto baseline = [&](const char* name, const Cell& c) {
      bound += host_bound(c);
      fmt::print("{:<36} {:>10.1f} {:>7.1f}{:1} {:>7} {:>10.1f} {:>8}\n", name, c.eager, c.host,
                 host_bound(c) ? "*" : "", "", c.narrow, "");
    };
    baseline("(none, first)", first);
    nlohmann::json tj{{"T", T},
                      {"baseline_us",
                       {{"eager", {first.eager, last.eager}},
                        {"eager_host", {first.host, last.host}},
                        {"narrow", {first.narrow, last.narrow}}}}};
    for (const auto& [label, t] : rows) {
      bound += host_bound(t);
      fmt::print("{:<36} {:>10.1f} {:>7.1f}{:1} {:>+7.1f} {:>10.1f} {:>+8.1f}\n", label, t.eager,
                 t.host, host_bound(t) ? "*" : "", t.eager - base_e, t.narrow, t.narrow - base_n);
      tj["without"].push_back({{"launch", label},
                               {"eager_us", t.eager},
                               {"eager_host_us", t.host},
                               {"host_bound", host_bound(t)},
                               {"narrow_us", t.narrow}});
    }
    baseline("(none, last)", last);
    if (bound > 0)
      fmt::print(
          "* {} eager row(s) host-bound (host >= 90% of the step): their changes measure the "
          "host's launches, not the launch left out\n",
          bound);
    tj["eager_host_bound_rows"] = bound;
    out["tokens"].push_back(tj);
  }
  fmt::print(
      "A launch left out leaves its outputs as the step before wrote them: the step's "
      "results are wrong by design, only its time counts.\n");
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

/// The stack the plan-timing and memory benchmarks build: --preset with --layers F layers.
Config stack_config(const BenchGpuOptions& o) {
  Config cfg = preset(o.preset);
  cfg.num_layers = o.layers;
  cfg.index_topk_pattern = std::string(static_cast<std::size_t>(o.layers), 'F');
  cfg.validate();
  return cfg;
}

/// Cache blocks for the largest batch's requests at --context tokens (and one new token) each.
int cache_blocks(const Config& cfg, const BenchGpuOptions& o) {
  return largest_batch(o) * ((o.context + 1 + cfg.block_size - 1) / cfg.block_size);
}

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
  run.copy = static_cast<double>(stack.copy_form_bytes());
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
  j["captures_held"] = stack.capture_count();
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

/// --preset with `layers` F layers and weights: one generated layer repeated (timing only; the
/// values do not matter, and a model-deep stack's weights then take one layer's generation).
std::pair<Config, Weights> deep_stack(const BenchGpuOptions& o, int layers) {
  BenchGpuOptions one = o;
  one.layers = 1;
  const Weights w1 = Weights::generate(stack_config(one), 1);
  one.layers = layers;
  Weights w;
  w.layers.assign(static_cast<std::size_t>(layers), w1.layers.front());
  return {stack_config(one), std::move(w)};
}

/// The value x at which the piecewise-linear curve (xs, ys) first reaches y (ys rising through
/// it), or NaN when it does not within the sweep.
double crossing(const std::vector<double>& xs, const std::vector<double>& ys, double y) {
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (ys[i] < y) continue;
    if (i == 0) return xs[0];
    return xs[i - 1] + (y - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]);
  }
  return std::nan("");
}

/// What a boundary plan costs or saves for a framework whose eager ops cost host time: every
/// plan (and full-and-piecewise with the copy form) timed at --whatif-layers layers for decode
/// batches of --decode requests at --context and a prefill chunk of each --whatif-prefill size,
/// in --whatif-rounds interleaved rounds (a cell their median), with the host spending each
/// --dispatch-us value before every eager op and --graph-launch-us before every graph launch
/// (Stack::set_host_costs); ratios to `wide` and `eager` from the same run, and where `narrow` over
/// `wide` crosses 1.5x and 2x.
int run_whatif(const BenchGpuOptions& o) {
  const auto [cfg, w] = deep_stack(o, o.whatif_layers);
  const int max_batch = largest_batch(o);
  const int longest = *std::max_element(o.whatif_prefill.begin(), o.whatif_prefill.end());
  const int blocks =
      std::max(cache_blocks(cfg, o), (longest + cfg.block_size - 1) / cfg.block_size);
  const int max_tokens = std::max(max_batch, longest);
  fmt::print(
      "bench-gpu --dispatch-us: {} ({} layers, one layer's weights repeated), context {}, "
      "prefill chunks of {} tokens, {} timed replays per cell and round, a cell the median of "
      "{} interleaved rounds, {}\n",
      o.preset, o.whatif_layers, o.context, fmt::join(o.whatif_prefill, ", "), o.repeats,
      o.whatif_rounds, gpu::device_summary());
  fmt::print(
      "host cost: each --dispatch-us value before every eager op; {} us before every graph "
      "launch\nstack options: {}\n",
      o.graph_launch_us, options_text(o));
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  gpu::Stack stack(cfg, w, blocks, max_tokens, 0, nullptr, stack_options(o));
  fmt::print(stderr, "  stack of {} layers built: {:.1f} s\n", o.whatif_layers, elapsed());
  std::vector<std::string> plans = boundary::plan_names();
  plans.push_back("full-and-piecewise:narrow-copy");
  std::map<std::string, boundary::Plan> plan_of;
  for (const std::string& p : plans) plan_of.emplace(p, boundary::plan_preset(p, cfg));
  struct Case {
    std::string name;
    StepInput in;
  };
  std::vector<Case> cases;
  for (int n : o.decode)
    cases.push_back({fmt::format("decode T={}", n), decode_step(cfg, n, o.context, blocks)});
  for (int n : o.whatif_prefill)
    cases.push_back({fmt::format("prefill {}", n), chunk_step(cfg, n, 0, blocks)});
  for (const Case& c : cases) stack.synthesize_context(c.in);
  // Untimed, every cell once: the graphs captured and the GPU's clocks up before the first
  // timed cell (the first cell of a cold GPU read ~30% slow).
  for (const Case& c : cases)
    for (const std::string& p : plans) stack.time_step(plan_of.at(p), c.in, 1);
  fmt::print(stderr, "  contexts synthesized, every cell warmed up once: {:.1f} s\n", elapsed());
  nlohmann::json out{{"options", options_json(o)},
                     {"preset", o.preset},
                     {"layers", o.whatif_layers},
                     {"context", o.context},
                     {"prefill", o.whatif_prefill},
                     {"repeats", o.repeats},
                     {"rounds", o.whatif_rounds},
                     {"graph_launch_us", o.graph_launch_us},
                     {"dispatch_us", o.dispatch_us},
                     {"plans", plans},
                     {"copy_form_latent_bytes", stack.copy_form_bytes()}};
  // The copy form against no-copy, each pair (copy plan, no-copy plan) per case and cost.
  const std::vector<std::pair<std::string, std::string>> copy_pairs = {
      {"narrow-copy", "narrow"}, {"full-and-piecewise:narrow-copy", "full-and-piecewise"}};
  std::vector<std::pair<std::string, std::vector<std::vector<double>>>> copy_rows;
  int done = 0;
  const std::size_t costs = o.dispatch_us.size();
  const int cells = static_cast<int>(costs * cases.size() * plans.size()) * o.whatif_rounds;
  for (const Case& c : cases) {
    // Each round times every cell of the case once; a cell's time is its rounds' median (where
    // the host's cost is near the GPU's time, one timing can land on either side of the race).
    // rounds[plan][i]: the case's step at dispatch_us[i] in each round, in round order; ms:
    // their medians. A case's table is printed (and flushed) when its cells are done, so a run
    // cut short keeps what it measured.
    std::map<std::string, std::vector<std::vector<double>>> rounds;
    for (const std::string& p : plans) rounds[p].assign(costs, {});
    for (int r = 0; r < o.whatif_rounds; ++r)
      for (std::size_t i = 0; i < costs; ++i) {
        stack.set_host_costs(o.dispatch_us[i], o.graph_launch_us);
        for (const std::string& p : plans) {
          rounds[p][i].push_back(stack.time_step(plan_of.at(p), c.in, o.repeats));
          fmt::print(
              stderr, "  {}/{} cells: {}, round {}, {} us an eager op, {}: {:.3f} ms ({:.0f} s)\n",
              ++done, cells, c.name, r + 1, o.dispatch_us[i], p, rounds[p][i].back(), elapsed());
        }
      }
    stack.set_host_costs(0, 0);
    std::map<std::string, std::vector<double>> ms;
    for (const auto& [p, per_cost] : rounds)
      for (std::vector<double> v : per_cost) {
        std::sort(v.begin(), v.end());
        ms[p].push_back(v[v.size() / 2]);
      }
    fmt::print("\n{} (ms a step; x: wide's time over the plan's)\n{:>8}", c.name, "us/op");
    for (const std::string& p : plans) fmt::print(" {:>16}", p.size() > 16 ? p.substr(0, 16) : p);
    fmt::print("\n");
    nlohmann::json cj{{"case", c.name}, {"T", c.in.capture_size}};
    for (std::size_t i = 0; i < o.dispatch_us.size(); ++i) {
      fmt::print("{:>8.1f}", o.dispatch_us[i]);
      const double wide = ms["wide"][i], eager = ms["eager"][i];
      nlohmann::json row{{"dispatch_us", o.dispatch_us[i]}};
      for (const std::string& p : plans) {
        const double t = ms[p][i];
        fmt::print(" {:>8.3f} ({:4.2f}x)", t, wide / t);
        row["ms"][p] = t;
        row["ms_rounds"][p] = rounds[p][i];
        row["vs_wide"][p] = wide / t;
        row["vs_eager"][p] = eager / t;
      }
      fmt::print("\n");
      cj["rows"].push_back(row);
    }
    std::vector<double> ratio;
    for (std::size_t i = 0; i < o.dispatch_us.size(); ++i)
      ratio.push_back(ms["wide"][i] / ms["narrow"][i]);
    for (double y : {1.5, 2.0}) {
      const double x = crossing(o.dispatch_us, ratio, y);
      fmt::print("narrow over wide reaches {:.1f}x at {}\n", y,
                 std::isnan(x) ? std::string("no cost of the sweep")
                               : fmt::format("{:.1f} us an eager op", x));
      cj["narrow_vs_wide_crossing_us"][fmt::format("{:.1f}", y)] =
          std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x);
    }
    std::vector<std::vector<double>> rel;
    for (const auto& [copy, nocopy] : copy_pairs) {
      std::vector<double> r;
      for (std::size_t i = 0; i < o.dispatch_us.size(); ++i)
        r.push_back(ms[copy][i] / ms[nocopy][i]);
      cj["copy_vs_nocopy"][copy + " / " + nocopy] = r;
      rel.push_back(std::move(r));
    }
    copy_rows.emplace_back(c.name, std::move(rel));
    std::fflush(stdout);
    out["cases"].push_back(cj);
  }
  fmt::print(
      "\ncopy form vs no-copy: the copy plan's step time over the no-copy plan's, -1 (%; "
      "negative: the copy form is faster)\n{:>44}",
      "us/op");
  for (double us : o.dispatch_us) fmt::print(" {:>7.1f}", us);
  fmt::print("\n");
  for (const auto& [name, rel] : copy_rows)
    for (std::size_t k = 0; k < copy_pairs.size(); ++k) {
      fmt::print("{:>12} {:>31}", name, copy_pairs[k].first);
      for (double r : rel[k]) fmt::print(" {:>+7.2f}", 100 * (r - 1));
      fmt::print("\n");
    }
  fmt::print(
      "\ncells: ms per step (x: wide's time over the plan's, in the same run and cost); copy "
      "form's static latent {:.1f} MiB over the stack (docs/GPU.md, \"Device memory per plan\")\n",
      static_cast<double>(stack.copy_form_bytes()) / (1024.0 * 1024.0));
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
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

int run(const BenchGpuOptions& o) {
  if (o.per_op + o.ablate + o.memory + !o.dispatch_us.empty() > 1) {
    fmt::print(stderr,
               "dsv32 bench-gpu: --per-op, --ablate, --memory and --dispatch-us are different "
               "benchmarks; give one\n");
    return kExitUsage;
  }
  {
    // The largest batch's cache in every layer at once (bf16 latent and rope, fp8 indexer keys
    // with their scales), and the host's weights (doubles) at the deepest stack timed: each
    // flag is bounded alone, their product is refused here, before any work, when it could fit
    // on no GPU of today (1 TiB) or on the host (1 TiB).
    const Config cfg = preset(o.preset);
    const int layers = std::max(o.layers, o.dispatch_us.empty() ? 0 : o.whatif_layers);
    const double tokens = static_cast<double>(largest_batch(o)) * (o.context + 1);
    refuse_over(
        "bench-gpu",
        fmt::format("--decode {} x --context {} x {} layers", largest_batch(o), o.context, layers),
        tokens * layers *
            (2.0 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.index_head_dim + 4),
        1024, " of device memory");
    refuse_over("bench-gpu", fmt::format("{} layers of {} weights on the host", layers, o.preset),
                8.0 * layers * static_cast<double>(cfg.layer_weight_count()), 1024,
                " of host memory");
  }
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_device_reason(); !why.empty()) {
    fmt::print(stderr, "dsv32 bench-gpu: {}\n", why);
    return kExitUsage;
  }
  if (o.per_op) return run_per_op(o);
  if (o.ablate) return run_ablate(o);
  if (o.memory) return run_memory(o);
  if (!o.dispatch_us.empty()) return run_whatif(o);
  const Config cfg = stack_config(o);
  const Weights w = Weights::generate(cfg, 1);
  const int max_batch = largest_batch(o), blocks = cache_blocks(cfg, o);
  fmt::print("bench-gpu: {} ({} layers), context {}, {} timed replays per cell, {}\n", o.preset,
             o.layers, o.context, o.repeats, gpu::device_summary());
  fmt::print("stack options: {}\n", options_text(o));
  nlohmann::json out;
  out["options"] = options_json(o);
  out["preset"] = o.preset;
  out["layers"] = o.layers;
  out["context"] = o.context;
  for (int tp : o.tp) {
    // Tensor-parallel: each of tp GPUs holds H / tp heads; a step's time is its slowest rank's.
    if (const std::string why = gpu::no_tp_reason(tp); !why.empty()) {
      fmt::print("tp {}: not run: {}\n", tp, why);
      out["not_run"][std::to_string(tp)] = why;
      continue;
    }
    gpu::TpGroup group(cfg, w, tp, blocks, max_batch, stack_options(o));
    std::string head = fmt::format("tp {} ({} heads a GPU)\n{:>6}", tp, cfg.num_heads / tp, "T");
    for (const std::string& p : boundary::plan_names()) head += fmt::format(" {:>16}", p);
    fmt::print("{}\n", head);
    for (int n : o.decode) {
      const StepInput in = decode_step(cfg, n, o.context, blocks);
      group.synthesize_context(in);
      std::string line = fmt::format("{:>6}", n);
      double eager_ms = 0;
      nlohmann::json row{{"T", n}, {"tp", tp}};
      for (const std::string& name : boundary::plan_names()) {
        const double ms = group.time_step(boundary::plan_preset(name, cfg), in, o.repeats);
        if (name == "eager") eager_ms = ms;
        line += fmt::format(" {:>8.3f} ({:4.2f}x)", ms, eager_ms / ms);
        row["ms"][name] = ms;
      }
      fmt::print("{}\n", line);
      out["rows"].push_back(row);
    }
  }
  fmt::print("cells: ms per step (speed-up over eager)\n");
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
#else
  (void)o;
  fmt::print(stderr, "dsv32 bench-gpu: this build has no CUDA\n");
  return kExitUsage;
#endif
}

}  // namespace

void add_bench_gpu(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchGpuOptions>();
  CLI::App* sub = app.add_subcommand("bench-gpu", "Step time of every plan, side by side");
  sub->add_option("--preset", o->preset, "Config preset")->capture_default_str();
  sub->add_option("--layers", o->layers, "Layers (all F)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  sub->add_option("--context", o->context, "Cached tokens per request")
      ->check(int_in(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--decode", o->decode, "Decode batch sizes")
      ->check(int_in(1, 4096))
      ->capture_default_str();
  sub->add_option("--repeats", o->repeats, "Timed replays per cell")->check(int_in(1, 100000));
  sub->add_option("--tp", o->tp,
                  "Tensor-parallel sizes, one table each (tp GPUs, num_heads / tp heads each)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  sub->add_option("--json", o->json, "Also write the results as JSON")->check(kOutputFile);
  sub->add_flag("--per-op", o->per_op,
                "Per-op times of one F layer against bandwidth floors (--context, --repeats)");
  sub->add_option("--per-op-presets", o->per_op_presets, "Presets of --per-op")
      ->capture_default_str();
  sub->add_option("--per-op-tokens", o->per_op_tokens, "Token counts of --per-op")
      ->check(int_in(1, 1 << 16))
      ->capture_default_str();
  sub->add_flag("--per-op-eager", o->per_op_eager,
                "Launch each op's repeats eagerly (host launches included) instead of timing "
                "them captured as one CUDA graph");
  sub->add_flag("--memory", o->memory,
                "Device memory of every capturing plan: the stack's static buffers and its "
                "graphs over vLLM's capture sizes up to --memory-max-size (table and --json)");
  sub->add_option("--memory-max-size", o->memory_max_size, "Largest capture size of --memory")
      ->check(int_in(1, 8192))
      ->capture_default_str();
  sub->add_option("--memory-layers", o->memory_layers,
                  "Layer counts --memory measures (a table each; the copy form's cost a layer "
                  "from the two largest)")
      ->check(int_in(1, 64))
      ->capture_default_str();
  sub->add_option("--memory-model-layers", o->memory_model_layers,
                  "Layers of the model --memory extrapolates the copy form's cost to")
      ->check(int_in(1, 1024))
      ->capture_default_str();
  sub->add_option("--memory-gpu-gib", o->memory_gpu_gib,
                  "GPU sizes (GiB) --memory weighs the copy form's cost against")
      ->check(CLI::Range(1.0, 4096.0))
      ->capture_default_str();
  sub->add_option("--memory-utilization", o->memory_utilization,
                  "vLLM's gpu_memory_utilization for --memory's comparison")
      ->check(CLI::Range(0.01, 0.99))
      ->capture_default_str();
  sub->add_option("--dispatch-us", o->dispatch_us,
                  "What-if: a framework's host cost per eager op in us (a sweep, e.g. 0 5 10 20 "
                  "40 80); times every plan at --whatif-layers layers (docs/PERFORMANCE.md)")
      ->check(CLI::Range(0.0, 100000.0));
  sub->add_option("--graph-launch-us", o->graph_launch_us,
                  "What-if: the host cost of each graph launch in us")
      ->check(CLI::Range(0.0, 100000.0))
      ->capture_default_str();
  sub->add_option("--whatif-layers", o->whatif_layers, "What-if: the stack's layers (all F)")
      ->check(int_in(1, 256))
      ->capture_default_str();
  sub->add_option("--whatif-rounds", o->whatif_rounds,
                  "What-if: times each cell is timed (interleaved); a cell reports the median")
      ->check(int_in(1, 101))
      ->capture_default_str();
  sub->add_option("--whatif-prefill", o->whatif_prefill,
                  "What-if: prefill chunks (tokens) timed besides the --decode batches")
      ->check(int_in(1, 8192))
      ->capture_default_str();
  sub->add_flag("--ablate", o->ablate,
                "What each launch of one F layer of --preset costs the step: the layer timed "
                "(eager and narrow) with each launch left out in turn, at --decode sizes and "
                "--context (the results are wrong by design; only the time counts)");
  for (auto [flag, value, what] :
       {std::tuple{"--pdl", &o->pdl, "Programmatic dependent launch of the ops' kernels"},
        std::tuple{"--overlap", &o->overlap, "Each F layer's indexer on a second stream"},
        std::tuple{"--index-mma", &o->index_mma,
                   "indexer_topk's scores on tensor cores where the shapes fit"},
        std::tuple{"--topk-bins", &o->topk_bins,
                   "indexer_topk's select with value bins ahead of the radix passes"}})
    sub->add_option(flag, *value, std::string(what) + " (A/B timing: on or off)")
        ->default_str("on");
  sub->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace dsv32::tools

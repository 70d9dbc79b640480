// `dsv32 bench-gpu`: step time of every plan side by side (CUDA events over replays) on decode
// batches at a long synthesized context, with each plan's ratio to `eager` in the same run.
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
#include "dsv32/gpu/tp.hpp"
#endif

namespace dsv32::tools {
namespace {

struct Options {
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
  // The stack's switches (gpu::StackOptions), for A/B runs; recorded in every JSON.
  bool pdl = true, overlap = true, index_mma = true, topk_bins = true;
};

#if DSV32_HAVE_CUDA
gpu::StackOptions stack_options(const Options& o) {
  gpu::StackOptions so;
  so.pdl = o.pdl;
  so.overlap = o.overlap;
  so.index_mma = o.index_mma;
  so.topk_bins = o.topk_bins;
  return so;
}

/// The stack's options as JSON (every benchmark's "options") and as one line of text.
nlohmann::json options_json(const Options& o) {
  nlohmann::json j;
  for (const auto& [name, on] : stack_options(o).fields()) j[name] = on;
  return j;
}
std::string options_text(const Options& o) {
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
int run_per_op(const Options& o) {
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
    std::map<int, double> layer_ms, narrow_ms;
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
    for (const auto& [label, key, ms_of] :
         {std::tuple{"layer (eager)", "layer", &layer_ms},
          std::tuple{"layer (narrow)", "layer_narrow", &narrow_ms}}) {
      fmt::print("{:<16}", label);
      for (int T : o.per_op_tokens) {
        double floor = 0;  // the eager plan's ops: no copy form
        for (const auto& [op, f] : floors[T])
          if (op != "latent_copy" && op != "uv_proj_static") floor += f;
        const double ms = ms_of->at(T);
        fmt::print(" {:>20}", cell(ms, floor));
        pj[key][std::to_string(T)] = {{"ms", ms}, {"floor_ms", floor}};
      }
      fmt::print("\n");
    }
    out["presets"][name] = pj;
  }
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

/// What each launch of one F layer costs the step: the layer timed (eager and narrow) with each
/// distinct launch left out in turn, against the layer with all of them (timed first and last).
/// The step's results are wrong by design while a launch is left out; only its time is used.
int run_ablate(const Options& o) {
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
Config stack_config(const Options& o) {
  Config cfg = preset(o.preset);
  cfg.num_layers = o.layers;
  cfg.index_topk_pattern = std::string(static_cast<std::size_t>(o.layers), 'F');
  cfg.validate();
  return cfg;
}

/// The largest --decode batch.
int largest_batch(const Options& o) {
  int m = 1;
  for (int n : o.decode) m = std::max(m, n);
  return m;
}

/// Cache blocks for the largest batch's requests at --context tokens (and one new token) each.
int cache_blocks(const Config& cfg, const Options& o) {
  return largest_batch(o) * ((o.context + 1 + cfg.block_size - 1) / cfg.block_size);
}

/// Device memory per plan: one stack sized for --memory-max-size tokens holds the graphs of
/// every capturing plan at every size of vLLM's list up to it (captures are keyed by plan and
/// size, as a full-and-piecewise runtime holds two kinds), each plan's from cudaMemGetInfo
/// deltas around its captures; nothing is freed between plans, so no plan's count reuses pages
/// another freed. The static buffers are measured once; the copy form's static latent is counted
/// as needed only by the plans that read it.
int run_memory(const Options& o) {
  const Config cfg = stack_config(o);
  const Weights w = Weights::generate(cfg, 1);
  const int max_batch = largest_batch(o), blocks = cache_blocks(cfg, o);
  const std::vector<int> sizes = boundary::capture_sizes(o.memory_max_size);
  const double mib = 1024.0 * 1024.0, gib = 1024.0 * mib;
  fmt::print(
      "bench-gpu --memory: {} ({} layers), {} cache blocks ({} tokens each of {} "
      "requests), capture sizes 1..{} ({} sizes), {}\n",
      o.preset, o.layers, blocks, o.context + 1, max_batch, o.memory_max_size, sizes.size(),
      gpu::device_summary());
  fmt::print("stack options: {}\n", options_text(o));
  const std::size_t before = gpu::device_used_bytes();
  gpu::Stack stack(cfg, w, blocks, o.memory_max_size, 0, nullptr, stack_options(o));
  const double statics = static_cast<double>(gpu::device_used_bytes() - before);
  const double copy = static_cast<double>(stack.copy_form_bytes());
  fmt::print(
      "static buffers (weights, caches, inter-op tensors): {:.3f} GiB, of which the copy "
      "form's static latent {:.3f} GiB\n",
      statics / gib, copy / gib);
  fmt::print("{:<16} {:>12} {:>12} {:>14} {:>12}\n", "plan", "needed", "graphs", "max a capture",
             "total");
  nlohmann::json out;
  out["options"] = options_json(o);
  out["preset"] = o.preset;
  out["layers"] = o.layers;
  out["context"] = o.context;
  out["num_blocks"] = blocks;
  out["capture_sizes"] = sizes;
  out["static_bytes"] = statics;
  out["copy_form_latent_bytes"] = copy;
  for (const std::string& name : boundary::plan_names()) {
    const boundary::Plan plan = boundary::plan_preset(name, cfg);
    if (!plan.capture) continue;  // eager: no captures, the same static buffers
    const std::size_t start = gpu::device_used_bytes();
    std::vector<std::size_t> per;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t b = gpu::device_used_bytes();
      stack.capture(plan, sizes[i]);
      per.push_back(gpu::device_used_bytes() - b);
      fmt::print(stderr, "\r  {}: captured {}/{} sizes", name, i + 1, sizes.size());
    }
    fmt::print(stderr, "\r{:40}\r", "");
    const double graphs = static_cast<double>(gpu::device_used_bytes() - start);
    const double needed = plan.copy_form ? statics : statics - copy;
    fmt::print("{:<16} {:>8.3f} GiB {:>8.3f} GiB {:>10.1f} MiB {:>8.3f} GiB\n", name, needed / gib,
               graphs / gib, static_cast<double>(*std::max_element(per.begin(), per.end())) / mib,
               (needed + graphs) / gib);
    out["rows"].push_back({{"plan", name},
                           {"needed_static_bytes", needed},
                           {"graph_bytes", graphs},
                           {"graph_bytes_per_size", per},
                           {"total_needed_bytes", needed + graphs}});
  }
  out["captures_held"] = stack.capture_count();
  fmt::print(
      "needed: the static buffers, less the copy form's latent for a no-copy plan; graphs: the "
      "plan's instantiated graphs over the sizes (cudaMemGetInfo deltas, 2 MiB pages); total = "
      "needed + graphs\n");
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

#endif

int run(const Options& o) {
  if (o.per_op + o.ablate + o.memory > 1) {
    fmt::print(stderr,
               "dsv32 bench-gpu: --per-op, --ablate and --memory are different benchmarks; "
               "give one\n");
    return kExitUsage;
  }
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_device_reason(); !why.empty()) {
    fmt::print(stderr, "dsv32 bench-gpu: {}\n", why);
    return kExitUsage;
  }
  if (o.per_op) return run_per_op(o);
  if (o.ablate) return run_ablate(o);
  if (o.memory) return run_memory(o);
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
  auto o = std::make_shared<Options>();
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

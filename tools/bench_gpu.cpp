// `dsv32 bench-gpu`: step time of every plan side by side (CUDA events over replays) on decode
// batches at a long synthesized context, with each plan's ratio to `eager` in the same run; the
// command line of every GPU benchmark.
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

#endif

namespace {

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
    // Over NCCL only: ranks sharing one GPU would time the sharing, not the layer.
    if (const std::string why = gpu::no_tp_reason(tp, gpu::TpTransport::nccl); !why.empty()) {
      fmt::print("tp {}: not run: {}\n", tp, why);
      out["not_run"][std::to_string(tp)] = why;
      continue;
    }
    gpu::TpGroup group(cfg, w, tp, blocks, max_batch, stack_options(o), gpu::TpTransport::nccl);
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
        const boundary::Plan plan = boundary::plan_preset(name, cfg);
        const double ms = group.time_step(plan, in, o.repeats);
        if (!plan.capture) eager_ms = ms;  // `eager`, first of the presets
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

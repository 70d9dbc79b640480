// `dsv32 bench-gpu --per-op` (each op of one F layer against its bandwidth floor) and `--ablate`
// (what each launch of the layer costs the step).
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
#include "dsv32/gpu/stack_lab.hpp"
#include "dsv32/gpu/tp.hpp"
#endif

namespace dsv32::tools {
#if DSV32_HAVE_CUDA
/// Bytes an op must move at least (weights once, activations in and out, the cache entries it
/// reads), in bf16 storage: the numerator of its bandwidth floor.
double op_bytes(const Config& c, Op op, const StepInput& in) {
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
  switch (op) {
    case Op::input_norm:
      elems = 2 * T * D + D;
      break;
    case Op::qkv_a_proj:
      elems = A * D + T * (D + A);
      break;
    case Op::indexer_wk_proj:
      elems = (dI + HI) * D + T * (D + dI + HI);
      break;
    case Op::norm_rope_cache:
      elems = T * (A + Rq + L + dr + 2 * dI + HI), bytes = T * dI;
      break;
    case Op::q_b_proj:
      elems = H * dq * Rq + T * (Rq + H * dq);
      break;
    case Op::uk_absorb:
      elems = H * dn * L + T * H * (dq + L);
      break;
    case Op::indexer_wq_b:
      elems = HI * dI * Rq + T * (Rq + HI * dI);
      break;
    case Op::fused_q:
      elems = T * H * (dq + dr) + T * HI * dI, bytes = T * HI * (dI + 8);
      break;
    case Op::indexer_topk:
      bytes = keys * (dI + 4) + T * HI * (dI + 4) + T * K * 4;
      break;
    case Op::sparse_mqa:
      elems = selected * (L + dr) + T * H * (2 * L + dr);
      break;
    case Op::uv_proj:
    case Op::uv_proj_static:
      elems = H * dv * L + T * H * (L + dv);
      break;
    case Op::latent_copy:
      elems = 2 * T * H * L;
      break;
    case Op::o_proj:
      elems = D * H * dv + T * (H * dv + D);
      break;
    case Op::residual_add:
      elems = 3 * T * D;
      break;
  }
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
    std::vector<Op> ops;
    std::map<int, std::vector<std::pair<Op, double>>> times;
    std::map<int, std::map<Op, double>> floors;
    std::map<int, double> layer_ms, narrow_ms, full_ms;
    // The device-driven variants of the H ops (`full`'s), decode batches only.
    std::map<int, std::map<Op, double>> device_ms;
    for (int T : o.per_op_tokens) {
      // Decode batches up to 64 requests; larger T: one prefill chunk at the same context.
      const bool decode = T <= 64;
      const int per = (o.context + T + cfg.block_size) / cfg.block_size;
      const int blocks = decode ? T * per : per;
      const StepInput in =
          decode ? decode_step(cfg, T, o.context, blocks) : chunk_step(cfg, T, o.context, blocks);
      gpu::Stack stack(cfg, w, blocks, T, 0, nullptr, stack_options(o));
      stack.lab().synthesize_context(in);
      times[T] = stack.lab().time_ops(in, o.repeats, !o.per_op_eager);
      layer_ms[T] = stack.lab().time_step(boundary::plan_preset(boundary::PlanPreset::eager, cfg),
                                          in, o.repeats);
      // The layer as vLLM runs it: captured, the narrow boundary's ops eager between segments.
      narrow_ms[T] = stack.lab().time_step(boundary::plan_preset(boundary::PlanPreset::narrow, cfg),
                                           in, o.repeats);
      if (decode) {  // full: one graph, the H ops device-driven
        full_ms[T] = stack.lab().time_step(boundary::plan_preset(boundary::PlanPreset::full, cfg),
                                           in, o.repeats);
        for (const auto& [op, ms] : stack.lab().time_ops(in, o.repeats, !o.per_op_eager, true))
          if (is_host_op(op) && op != Op::latent_copy) device_ms[T][op] = ms;
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
    for (const Op op : ops) {
      const std::string& label = op_name(op);
      fmt::print("{:<16}", label);
      for (int T : o.per_op_tokens) {
        double ms = 0;
        for (const auto& [n, v] : times[T])
          if (n == op) ms = v;
        fmt::print(" {:>20}", cell(ms, floors[T][op]));
        pj["ops"][label][std::to_string(T)] = {{"ms", ms}, {"floor_ms", floors[T][op]}};
      }
      fmt::print("\n");
    }
    // The device-driven H ops (decode batches): the same kernels over the capture size's rows.
    for (const Op op : {Op::indexer_topk, Op::sparse_mqa, Op::uv_proj}) {
      const std::string& label = op_name(op);
      fmt::print("{:<16}", label + "*");
      for (int T : o.per_op_tokens) {
        const auto it = device_ms[T].find(op);
        if (it == device_ms[T].end()) {
          fmt::print(" {:>20}", "-");
          continue;
        }
        fmt::print(" {:>20}", cell(it->second, floors[T][op]));
        pj["device_ops"][label][std::to_string(T)] = {{"ms", it->second},
                                                      {"floor_ms", floors[T][op]}};
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
          if (in_form(op, false)) floor += f;
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
  const boundary::Plan eager = boundary::plan_preset(boundary::PlanPreset::eager, cfg),
                       narrow = boundary::plan_preset(boundary::PlanPreset::narrow, cfg);
  for (int T : o.decode) {
    const int blocks = T * ((o.context + 1 + cfg.block_size - 1) / cfg.block_size);
    const StepInput in = decode_step(cfg, T, o.context, blocks);
    gpu::Stack stack(cfg, w, blocks, T, 0, nullptr, stack_options(o));
    stack.lab().synthesize_context(in);
    std::vector<std::string> labels;
    for (const std::string& l : stack.lab().launch_labels(in))
      if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
    // Eager and narrow us a step, and the host's us launching an eager step (a left-out
    // launch must not make the step host-bound, or its row measures the host).
    struct Cell {
      double eager, host, narrow;
    };
    const auto time_without = [&](const std::string& label) {
      stack.lab().skip_launch(label);
      const double e = stack.lab().time_step(eager, in, o.repeats) * 1e3;
      const double h = stack.lab().last_host_ms() * 1e3;
      const double n = stack.lab().time_step(narrow, in, o.repeats) * 1e3;
      stack.lab().skip_launch("");
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

#endif
}  // namespace dsv32::tools

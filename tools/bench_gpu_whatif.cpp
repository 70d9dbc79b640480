// `dsv32 bench-gpu --dispatch-us`: what a boundary plan costs or saves for a framework whose
// eager ops cost host time (docs/PERFORMANCE.md).
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
/// (StackLab::set_host_costs); ratios to `wide` and `eager` from the same run, and where `narrow`
/// over `wide` crosses 1.5x and 2x.
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
  for (const Case& c : cases) stack.lab().synthesize_context(c.in);
  // Untimed, every cell once: the graphs captured and the GPU's clocks up before the first
  // timed cell (the first cell of a cold GPU read ~30% slow).
  for (const Case& c : cases)
    for (const std::string& p : plans) stack.lab().time_step(plan_of.at(p), c.in, 1);
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
                     {"copy_form_latent_bytes", stack.report().copy_form_bytes}};
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
        stack.lab().set_host_costs(o.dispatch_us[i], o.graph_launch_us);
        for (const std::string& p : plans) {
          rounds[p][i].push_back(stack.lab().time_step(plan_of.at(p), c.in, o.repeats));
          fmt::print(
              stderr, "  {}/{} cells: {}, round {}, {} us an eager op, {}: {:.3f} ms ({:.0f} s)\n",
              ++done, cells, c.name, r + 1, o.dispatch_us[i], p, rounds[p][i].back(), elapsed());
        }
      }
    stack.lab().set_host_costs(0, 0);
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
      static_cast<double>(stack.report().copy_form_bytes) / (1024.0 * 1024.0));
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
  return kExitPass;
}

#endif
}  // namespace dsv32::tools

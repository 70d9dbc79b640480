// `dsv32 bench-gpu`: step time of every plan side by side (CUDA events over replays) on decode
// batches at a long synthesized context, with each plan's ratio to `eager` in the same run.
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"
#if DSV32_HAVE_CUDA
#include "dsv32/gpu/device.hpp"
#include "dsv32/gpu/stack.hpp"
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
};

#if DSV32_HAVE_CUDA
/// `n` decode requests, each with `ctx` cached tokens, in disjoint runs of blocks.
StepInput decode_step(const Config& cfg, int n, int ctx, int num_blocks) {
  StepInput in;
  const int per = (ctx + 1 + cfg.block_size - 1) / cfg.block_size;
  for (int r = 0; r < n; ++r) {
    RequestStep rs{r, ctx, 1, {}};
    for (int b = 0; b < per; ++b) rs.block_table.push_back(r * per + b);
    in.requests.push_back(rs);
  }
  const rng::Stream s(3, "bench-gpu/hidden");
  in.hidden.resize(n, cfg.hidden_size);
  for (Eigen::Index i = 0; i < in.hidden.size(); ++i)
    in.hidden.data()[i] = round_bf16(s.symmetric(i));
  in.derive(cfg, num_blocks);
  return in;
}
#endif

int run(const Options& o) {
#if DSV32_HAVE_CUDA
  if (const std::string why = gpu::no_device_reason(); !why.empty()) {
    fmt::print(stderr, "dsv32 bench-gpu: {}\n", why);
    return kExitUsage;
  }
  Config cfg = preset(o.preset);
  cfg.num_layers = o.layers;
  cfg.index_topk_pattern = std::string(1, 'F') + std::string(o.layers - 1, 'F');
  cfg.validate();
  const Weights w = Weights::generate(cfg, 1);
  int max_batch = 1;
  for (int n : o.decode) max_batch = std::max(max_batch, n);
  const int per = (o.context + 1 + cfg.block_size - 1) / cfg.block_size;
  const int blocks = max_batch * per;
  gpu::Stack stack(cfg, w, blocks, max_batch);
  fmt::print("bench-gpu: {} ({} layers), context {}, {} timed replays per cell, {}\n", o.preset,
             o.layers, o.context, o.repeats, gpu::device_summary());
  std::string head = fmt::format("{:>6}", "T");
  for (const std::string& p : gpu::plan_names()) head += fmt::format(" {:>16}", p);
  fmt::print("{}\n", head);
  nlohmann::json out;
  out["preset"] = o.preset;
  out["layers"] = o.layers;
  out["context"] = o.context;
  for (int n : o.decode) {
    const StepInput in = decode_step(cfg, n, o.context, blocks);
    stack.synthesize_context(in);
    std::string line = fmt::format("{:>6}", n);
    double eager_ms = 0;
    nlohmann::json row{{"T", n}};
    for (const std::string& name : gpu::plan_names()) {
      const double ms = stack.time_step(gpu::plan_preset(name, cfg), in, o.repeats);
      if (name == "eager") eager_ms = ms;
      line += fmt::format(" {:>8.3f} ({:4.2f}x)", ms, eager_ms / ms);
      row["ms"][name] = ms;
    }
    fmt::print("{}\n", line);
    out["rows"].push_back(row);
  }
  fmt::print("cells: ms per step (speed-up over eager)\n");
  if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
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
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub->add_option("--context", o->context, "Cached tokens per request")->capture_default_str();
  sub->add_option("--decode", o->decode, "Decode batch sizes")->capture_default_str();
  sub->add_option("--repeats", o->repeats, "Timed replays per cell")->check(CLI::PositiveNumber);
  sub->add_option("--json", o->json, "Also write the results as JSON");
  sub->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace dsv32::tools

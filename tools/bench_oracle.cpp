// `dsv32 bench-oracle`: the oracle's speed at full sizes, per op, against this machine's Eigen
// fp64 GEMM rate measured in the same run.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "commands.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/oracle/memory.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32::tools {
namespace {

struct BenchOracleOptions {
  std::string preset = "dsv32";
  int context = 8192;
  std::vector<int> decode = {1, 8, 64};
  int prefill = 512;
  std::vector<std::string> modes = {"exact", "emulated"};
  int repeats = 1;
  std::string json;
  double max_gib = 16;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double eigen_gemm_gflops() {
  const int n = 2048;
  const rng::Stream s(1, "bench/gemm");
  Mat a(n, n), b(n, n);
  for (Eigen::Index i = 0; i < a.size(); ++i)
    a.data()[i] = s.symmetric(i), b.data()[i] = s.symmetric(a.size() + i);
  Mat c(n, n);
  c.noalias() = a * b;  // warm-up
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c.noalias() = a * b;
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / best / 1e9;
}

/// A step of `reqs` requests each with `ctx` cached tokens and `q` new ones, blocks in order.
StepInput make_step(const Config& cfg, int reqs, int ctx, int q) {
  StepInput in;
  const int per = (ctx + q + cfg.block_size - 1) / cfg.block_size;
  for (int r = 0; r < reqs; ++r) {
    RequestStep rs{r, ctx, q, {}};
    for (int b = 0; b < per; ++b) rs.block_table.push_back(r * per + b);
    in.requests.push_back(rs);
  }
  const rng::Stream s(1, "bench/hidden");
  in.hidden.resize(reqs * q, cfg.hidden_size);
  for (Eigen::Index i = 0; i < in.hidden.size(); ++i)
    in.hidden.data()[i] = round_bf16(s.symmetric(i));
  in.derive(cfg, reqs * per);
  return in;
}

/// GEMM-shaped FLOPs of each op of one F layer for the step.
OpArray<double> op_flops(const Config& c, const StepInput& in) {
  const double T = in.capture_size, D = c.hidden_size, H = c.num_heads, Rq = c.q_lora_rank,
               L = c.kv_lora_rank, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim,
               dv = c.v_head_dim, HI = c.index_n_heads, dI = c.index_head_dim;
  double topk = 0, mqa = 0;
  for (const RequestStep& r : in.requests) {
    topk += 2.0 * r.q * HI * dI * r.seq_len();
    for (int i = 0; i < r.q; ++i)
      mqa += 2.0 * H * std::min(c.index_topk, r.ctx + i + 1) * (2 * L + dr);
  }
  OpArray<double> f;
  f[Op::qkv_a_proj] = 2 * T * D * c.qkv_a_rows();
  f[Op::indexer_wk_proj] = 2 * T * D * (dI + HI);
  f[Op::q_b_proj] = 2 * T * Rq * H * (dn + dr);
  f[Op::uk_absorb] = 2 * T * H * dn * L;
  f[Op::indexer_wq_b] = 2 * T * Rq * HI * dI;
  f[Op::indexer_topk] = topk;
  f[Op::sparse_mqa] = mqa;
  f[Op::uv_proj] = 2 * T * H * L * dv;
  f[Op::o_proj] = 2 * T * H * dv * D;
  return f;
}

/// The largest decode case's cache, one oracle's (doubles): refused over --max-gib before the
/// weights are made.
void check_sizes(const BenchOracleOptions& o) {
  Config cfg = preset(o.preset);
  int batch = 1;
  for (int n : o.decode) batch = std::max(batch, n);
  const double tokens = static_cast<double>(batch) * (o.context + 1) + o.prefill;
  const double per_token =
      8.0 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim + 1 + cfg.hidden_size);
  refuse_over(
      "bench-oracle",
      fmt::format("--decode {} x --context {} ({} cached tokens)", batch, o.context, tokens),
      tokens * per_token, o.max_gib, " (--max-gib)");
}

void run(const BenchOracleOptions& o) {
  check_sizes(o);
  keep_freed_memory();  // CPU-only benchmark: see docs/DECISIONS.md (not with CUDA in the process)
  Config cfg = preset(o.preset);
  cfg.num_layers = 1;
  cfg.index_topk_pattern = "F";
  fmt::print("bench-oracle: preset {} (one layer), context {}, threads {}\n", o.preset, o.context,
             Eigen::nbThreads());
  const double gemm = eigen_gemm_gflops();
  fmt::print("Eigen fp64 GEMM 2048^3: {:.1f} GFLOP/s (the reference rate)\n", gemm);
  auto t0 = std::chrono::steady_clock::now();
  const auto w = std::make_shared<Weights>(Weights::generate(cfg, 1));
  fmt::print("weights generated in {:.2f} s\n", seconds_since(t0));

  struct Case {
    std::string name;
    int reqs, ctx, q;
  };
  std::vector<Case> cases;
  for (int n : o.decode) cases.push_back({fmt::format("decode T={}", n), n, o.context, 1});
  if (o.prefill > 0) cases.push_back({fmt::format("prefill T={}", o.prefill), 1, 0, o.prefill});

  nlohmann::json out;
  out["gemm_gflops"] = gemm;
  out["preset"] = o.preset;
  out["context"] = o.context;
  for (const std::string& mode_name : o.modes) {
    const Mode mode = mode_name == "exact" ? Mode::exact : Mode::emulated;
    for (const Case& cs : cases) {
      const StepInput in = make_step(cfg, cs.reqs, cs.ctx, cs.q);
      Oracle oracle(cfg, w, mode,
                    static_cast<int>(in.requests.size()) *
                        static_cast<int>(in.requests[0].block_table.size()));
      oracle.synthesize_context(in, 7);
      // Best of the repeats, per op and for the step, as the reference rate is the best of its
      // runs: a noisy machine slows single runs, never speeds them up. The mean is kept too.
      Profile prof;  // best of the repeats, op by op
      double step_s = 1e30, mean_s = 0;
      oracle.step(in);  // warm-up
      for (int i = 0; i < o.repeats; ++i) {
        Profile one;
        StepOptions opts;
        opts.profile = &one;
        t0 = std::chrono::steady_clock::now();
        oracle.step(in, opts);
        const double s = seconds_since(t0);
        step_s = std::min(step_s, s);
        mean_s += s / o.repeats;
        for (const OpInfo& op : kOpTable)
          prof.seconds[op.op] =
              i == 0 ? one.seconds[op.op] : std::min(prof.seconds[op.op], one.seconds[op.op]);
        prof.trace = i == 0 ? one.trace : std::min(prof.trace, one.trace);
      }
      double total_flops = 0;
      fmt::print("\n{} [{}]: {:.3f} s/step (best of {}; mean {:.3f}), {:.2f} ms/token\n", cs.name,
                 mode_name, step_s, o.repeats, mean_s, 1e3 * step_s / in.num_tokens);
      fmt::print("  {:<16} {:>10} {:>10} {:>10} {:>8}\n", "op", "ms", "GFLOP", "GFLOP/s", "% GEMM");
      nlohmann::json jc{{"case", cs.name},
                        {"mode", mode_name},
                        {"step_s", step_s},
                        {"mean_step_s", mean_s},
                        {"tokens", in.num_tokens}};
      const auto flops = op_flops(cfg, in);
      // The ops the oracle runs (the no-copy form), then the trace's copies.
      std::vector<std::tuple<std::string, double, double>> rows;
      for (const Op op : layer_ops(cfg, 0))
        rows.emplace_back(op_name(op), prof.seconds[op], flops[op]);
      rows.emplace_back("trace", prof.trace, 0.0);
      for (const auto& [op, sec, f] : rows) {
        total_flops += f;
        const double rate = sec > 0 ? f / sec / 1e9 : 0;
        fmt::print("  {:<16} {:>10.2f} {:>10.3f} {:>10.1f} {:>7.0f}%\n", op, sec * 1e3, f / 1e9,
                   rate, f > 0 ? 100 * rate / gemm : 0.0);
        jc["ops"].push_back({{"op", op}, {"ms", sec * 1e3}, {"gflop", f / 1e9}, {"gflops", rate}});
      }
      fmt::print("  {:<16} {:>10.2f} {:>10.3f} {:>10.1f} {:>7.0f}%\n", "total", step_s * 1e3,
                 total_flops / 1e9, total_flops / step_s / 1e9,
                 100 * total_flops / step_s / 1e9 / gemm);
      out["cases"].push_back(jc);
    }
  }
  if (!o.json.empty()) files::write_atomically(o.json, out.dump(2) + "\n");
}

}  // namespace

void add_bench_oracle(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<BenchOracleOptions>();
  CLI::App* sub = app.add_subcommand("bench-oracle", "Time the oracle per op at full sizes");
  sub->add_option("--preset", o->preset, "Config preset")->capture_default_str();
  sub->add_option("--context", o->context, "Cached tokens per decode request")
      ->check(int_in(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--decode", o->decode, "Decode batch sizes (one token per request)")
      ->check(int_in(1, 4096))
      ->capture_default_str();
  sub->add_option("--prefill", o->prefill, "Prefill tokens (0: none)")
      ->check(int_in(0, 1 << 16))
      ->capture_default_str();
  sub->add_option("--modes", o->modes, "exact and/or emulated")
      ->check(CLI::IsMember({"exact", "emulated"}))
      ->capture_default_str();
  sub->add_option("--repeats", o->repeats, "Timed steps per case")->check(int_in(1, 100000));
  sub->add_option("--json", o->json, "Also write the results as JSON")->check(kOutputFile);
  sub->add_option("--max-gib", o->max_gib, "Refuse sizes whose cache needs more memory")
      ->check(positive_up_to(1 << 20))
      ->capture_default_str();
  sub->callback([o, &exit_code] {
    run(*o);
    exit_code = kExitPass;
  });
}

}  // namespace dsv32::tools

// Kernel probes of the GPU numerics tests (tests/gpu/test_gpu_numerics.cpp): single kernels of
// indexer_topk run through their launchers on random inputs, against each other and against
// exact host results.
#include "support/gpu_probes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "../gpu/src/buffers.cuh"
#include "../gpu/src/kernels/index_scores.cuh"
#include "../gpu/src/kernels/topk_select.cuh"
#include "dsv32/gpu/device.hpp"
#include "dsv32/oracle/compare.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32::gpu {
namespace {

using detail::check;
using detail::download;
using detail::upload;
using detail::zeros;

/// Element i of a counter-RNG stream of e4m3 codes: any finite code (0x7F / 0xFF are NaN).
std::uint8_t random_e4m3(const rng::Stream& s, std::uint64_t i) {
  return static_cast<std::uint8_t>(s.below(i, 0x7F) | (s.below(i + (1ull << 40), 2) << 7));
}

/// One random token's index scores from every score kernel (see index_score_kernels_disagree).
struct IndexScoreRun {
  std::vector<std::uint8_t> q8, codes;  // (heads, 128); (keys, 128) in position order
  std::vector<float> omega, kscale;     // (heads); (keys) in position order
  std::vector<float> grouped, per_key, mma;
};

IndexScoreRun run_index_score_kernels(int heads, int keys, std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (heads < 1 || keys < 1) throw std::invalid_argument("index_score_kernels: heads, keys >= 1");
  const rng::Stream s(seed, "index-score-kernels");
  const auto code = [&](std::uint64_t i) { return random_e4m3(s, i); };
  k::Dims d{};
  d.HI = heads;
  d.dI = 128;
  d.B = 64;
  d.max_blocks = (keys + d.B - 1) / d.B;
  IndexScoreRun run;
  std::vector<std::uint8_t> kc(static_cast<std::size_t>(d.max_blocks) * d.B * 128);
  std::vector<float> ks(static_cast<std::size_t>(d.max_blocks) * d.B);
  std::vector<int> table(d.max_blocks);
  run.q8.resize(static_cast<std::size_t>(heads) * 128);
  run.omega.resize(heads);
  for (std::size_t i = 0; i < run.q8.size(); ++i) run.q8[i] = code(i);
  for (std::size_t i = 0; i < kc.size(); ++i) kc[i] = code(i + run.q8.size());
  for (int h = 0; h < heads; ++h) run.omega[h] = static_cast<float>(s.symmetric(1000000 + h));
  for (std::size_t j = 0; j < ks.size(); ++j)
    ks[j] = static_cast<float>(std::ldexp(1.0 + s.uniform(2000000 + j), -8));
  for (int b = 0; b < d.max_blocks; ++b) table[b] = d.max_blocks - 1 - b;  // reversed pages
  for (int j = 0; j < keys; ++j) {  // position j lives in slot table[j / B] B + j % B
    const std::size_t slot = static_cast<std::size_t>(table[j / d.B]) * d.B + j % d.B;
    run.codes.insert(run.codes.end(), kc.begin() + slot * 128, kc.begin() + (slot + 1) * 128);
    run.kscale.push_back(ks[slot]);
  }
  const auto dev = [](const auto& host) { return upload(host, "index_score_kernels upload"); };
  const auto dq = dev(run.q8), dk = dev(kc);
  const auto dom = dev(run.omega), dks = dev(ks);
  const auto dt = dev(table), pos = dev(std::vector<int>{keys - 1}), req = dev(std::vector<int>{0});
  auto a = zeros<float>(keys), b = zeros<float>(keys), c = zeros<float>(keys);
  const k::Meta m{pos->get(), nullptr, req->get(), dt->get(), nullptr, nullptr};
  const k::IndexCache cache{dk->get(), dks->get()};
  k::allow_index_scores_smem(d);
  const k::Launch go{nullptr, "index_score_kernels"};
  const auto scores = [&](k::IndexScoreKernel kernel, float* out) {
    k::launch_index_scores(go, kernel, d, m, dq->get(), dom->get(), cache, out, keys, 1, keys);
  };
  scores(k::IndexScoreKernel::grouped, a->get());
  scores(k::IndexScoreKernel::per_key, b->get());
  const bool mma = k::index_mma_fits(d);
  if (mma) scores(k::IndexScoreKernel::mma, c->get());
  run.grouped = download(a->get(), keys);
  run.per_key = download(b->get(), keys);
  if (mma) run.mma = download(c->get(), keys);
  return run;
}

}  // namespace

std::string topk_select_off(int K, const std::vector<int>& lengths, int levels,
                            std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (K < 1 || lengths.empty()) throw std::invalid_argument("topk_select_off: K >= 1, rows >= 1");
  if (levels < -3) throw std::invalid_argument("topk_select_off: levels >= -3");
  const int rows = static_cast<int>(lengths.size());
  const int width = *std::max_element(lengths.begin(), lengths.end());
  if (*std::min_element(lengths.begin(), lengths.end()) < 1)
    throw std::invalid_argument("topk_select_off: lengths >= 1");
  const rng::Stream s(seed, "topk-select");
  std::vector<float> sc(static_cast<std::size_t>(rows) * width);
  for (std::size_t i = 0; i < sc.size(); ++i) {
    const double u = s.symmetric(i);
    if (levels > 0) {
      sc[i] = 1.0f + static_cast<float>(s.below(i, levels));
    } else if (levels == 0) {
      sc[i] = static_cast<float>(1.0 + u * 0.5);
    } else {  // both signs, +0 and -0 (-2: and outliers; -3: and infinities)
      const std::uint64_t kind = s.below(i ^ 0x9E3779B97F4A7C15ull, 64);
      const float inf = std::numeric_limits<float>::infinity();
      sc[i] = kind == 0                   ? 0.0f
              : kind == 1                 ? -0.0f
              : kind == 2 && levels <= -2 ? static_cast<float>(1e30 * u)
              : kind == 3 && levels == -3 ? (u < 0 ? -inf : inf)
                                          : static_cast<float>(u * 3.0);
    }
  }
  std::vector<int> positions(rows);
  for (int t = 0; t < rows; ++t) positions[t] = lengths[t] - 1;
  // The expected rows: the K best by (score, then the smaller position), in position order;
  // scores compare as the kernel's keys do (their bits as a total order: +0 above -0).
  const auto key = [](float v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  };
  std::vector<int> want(static_cast<std::size_t>(rows) * K, -1);
  for (int t = 0; t < rows; ++t) {
    std::vector<int> order(lengths[t]);
    for (int j = 0; j < lengths[t]; ++j) order[j] = j;
    const float* row = &sc[static_cast<std::size_t>(t) * width];
    const int take = std::min(K, lengths[t]);
    std::partial_sort(order.begin(), order.begin() + take, order.end(), [&](int a, int b) {
      return key(row[a]) > key(row[b]) || (key(row[a]) == key(row[b]) && a < b);
    });
    std::sort(order.begin(), order.begin() + take);
    std::copy(order.begin(), order.begin() + take,
              want.begin() + static_cast<std::ptrdiff_t>(t) * K);
  }
  const auto dev = [](const auto& host) { return upload(host, "topk_select_off upload"); };
  const auto dsc = dev(sc);
  const auto dpos = dev(positions);
  k::Dims d{};
  d.K = K;
  const k::Meta m{dpos->get(), nullptr, nullptr, nullptr, nullptr, nullptr};
  // Both selects: with value bins (the default) and the radix passes alone.
  for (const bool bins : {true, false}) {
    const auto out = dev(std::vector<int>(want.size(), -1));  // as norm_rope_cache clears them
    k::launch_topk_select({nullptr, "topk_select_off"}, bins, d, m, dsc->get(), width, rows,
                          out->get());
    const std::vector<int> got = download(out->get(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i])
        return std::string(bins ? "with bins" : "radix only") + ": row " + std::to_string(i / K) +
               " entry " + std::to_string(i % K) + ": " + std::to_string(got[i]) + ", expected " +
               std::to_string(want[i]);
  }
  return "";
}

std::string index_scores_blocking_disagrees(int tokens, int keys, std::uint64_t seed) {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  if (tokens < 1 || keys < 2)
    throw std::invalid_argument("index_scores_blocking: tokens >= 1, keys >= 2");
  const rng::Stream s(seed, "index-scores-blocking");
  const auto code = [&](std::uint64_t i) { return random_e4m3(s, i); };
  k::Dims d{};
  d.HI = 64;
  d.dI = 128;
  d.B = 64;
  d.max_blocks = (keys + d.B - 1) / d.B;
  // Two requests with their own pages; tokens alternate between them in runs (a decode batch
  // next to a prefill chunk), positions rising within each.
  const int pages = 2 * d.max_blocks;
  std::vector<std::uint8_t> kc(static_cast<std::size_t>(pages) * d.B * 128),
      q8(static_cast<std::size_t>(tokens) * d.HI * 128);
  std::vector<float> ks(static_cast<std::size_t>(pages) * d.B),
      om(static_cast<std::size_t>(tokens) * d.HI);
  std::vector<int> table(pages), pos(tokens), req(tokens);
  for (std::size_t i = 0; i < kc.size(); ++i) kc[i] = code(i);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = code(i + kc.size());
  for (std::size_t i = 0; i < om.size(); ++i) om[i] = static_cast<float>(s.symmetric(5000000 + i));
  for (std::size_t j = 0; j < ks.size(); ++j)
    ks[j] = static_cast<float>(std::ldexp(1.0 + s.uniform(6000000 + j), -8));
  for (int b = 0; b < pages; ++b) table[b] = pages - 1 - b;
  int next[2] = {keys / 3, keys / 2};
  for (int t = 0; t < tokens; ++t) {
    req[t] = (t / 3) % 2;
    pos[t] = std::min(keys - 1, next[req[t]]++);
  }
  const auto dev = [](const auto& host) { return upload(host, "index_scores_blocking upload"); };
  const auto dk = dev(kc);
  const auto dq = dev(q8);
  const auto dks = dev(ks);
  const auto dom = dev(om);
  const auto dt = dev(table);
  const auto dpos = dev(pos);
  const auto dreq = dev(req);
  const k::Meta m{dpos->get(), nullptr, dreq->get(), dt->get(), nullptr, nullptr};
  const k::IndexCache cache{dk->get(), dks->get()};
  std::vector<float> first;
  for (int per : {1, 2, 3, 8, 16}) {
    auto out = zeros<float>(static_cast<std::size_t>(tokens) * keys);
    k::launch_index_scores({nullptr, "index_scores_blocking"}, k::IndexScoreKernel::mma, d, m,
                           dq->get(), dom->get(), cache, out->get(), keys, tokens, keys, per);
    const std::vector<float> got = download(out->get(), static_cast<std::size_t>(tokens) * keys);
    if (first.empty()) {
      first = got;
      continue;
    }
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j <= pos[t]; ++j) {
        const std::size_t i = static_cast<std::size_t>(t) * keys + j;
        if (std::memcmp(&got[i], &first[i], sizeof(float)) != 0)
          return std::to_string(per) + " tokens a block, token " + std::to_string(t) + " key " +
                 std::to_string(j) + ": " + std::to_string(got[i]) + " against " +
                 std::to_string(first[i]) + " at one token a block";
      }
  }
  return "";
}

std::string index_score_kernels_disagree(int heads, int keys, std::uint64_t seed) {
  const IndexScoreRun run = run_index_score_kernels(heads, keys, seed);
  for (int j = 0; j < keys; ++j)
    if (std::memcmp(&run.grouped[j], &run.per_key[j], sizeof(float)) != 0)
      return "key " + std::to_string(j) + ": grouped " + std::to_string(run.grouped[j]) +
             ", per key " + std::to_string(run.per_key[j]);
  return "";
}

std::string index_scores_off_bound(int heads, int keys, std::uint64_t seed) {
  const IndexScoreRun run = run_index_score_kernels(heads, keys, seed);
  std::vector<double> q(run.q8.size()), kv(run.codes.size()),
      om(run.omega.begin(), run.omega.end());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = e4m3_value(run.q8[i]);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = e4m3_value(run.codes[i]);
  std::vector<const double*> kp;
  for (int j = 0; j < keys; ++j) kp.push_back(&kv[static_cast<std::size_t>(j) * 128]);
  const std::vector<double> kscale(run.kscale.begin(), run.kscale.end());
  const IndexScores exact = index_score_row(q.data(), om.data(), heads, 128, kp, kscale);
  const double gamma = gamma_fp32(static_cast<std::int64_t>(heads) * 128);
  const std::pair<const char*, const std::vector<float>*> kernels[] = {
      {"grouped", &run.grouped}, {"per key", &run.per_key}, {"mma", &run.mma}};
  for (const auto& [name, got] : kernels) {
    if (got->empty()) continue;  // the tensor-core kernel does not serve these shapes
    for (int j = 0; j < keys; ++j) {
      const double err = std::fabs(static_cast<double>((*got)[j]) - exact.score[j]);
      if (!(err <= gamma * exact.abs_terms[j]))  // NaN fails
        return std::string(name) + " kernel, key " + std::to_string(j) + ": " +
               std::to_string((*got)[j]) + " against " + std::to_string(exact.score[j]) +
               " (error " + std::to_string(err) + ", bound " +
               std::to_string(gamma * exact.abs_terms[j]) + ")";
    }
  }
  return "";
}

}  // namespace dsv32::gpu

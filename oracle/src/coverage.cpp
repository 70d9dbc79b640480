#include "dsv32/oracle/coverage.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>

namespace dsv32 {
namespace {

/// The order key of an fp32 value (larger value, larger key), its top kCoarseBits bits.
std::uint32_t coarse_bin(double score) {
  const float f = static_cast<float>(score);
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return u >> (32 - Coverage::kCoarseBits);
}

constexpr std::array<std::string_view, kNumMetrics> kMetricNames{
    "rows", "padded",      "multi_token", "over_k",   "scored", "pruned",
    "ties", "largest_tie", "largest_bin", "max_keys", "k_edge", "reused_blocks"};

struct ComparisonName {
  std::string_view text;
  Comparison op;
};
constexpr std::array<ComparisonName, 5> kComparisons{{{">=", Comparison::ge},
                                                      {">", Comparison::gt},
                                                      {"<=", Comparison::le},
                                                      {"<", Comparison::lt},
                                                      {"==", Comparison::eq}}};

std::string percent_text(long n, long base) {
  if (base <= 0) return "";
  std::ostringstream s;
  s.precision(3);
  s << " (" << 100.0 * static_cast<double>(n) / static_cast<double>(base) << "%)";
  return s.str();
}

}  // namespace

std::string_view metric_name(Metric m) {
  return kMetricNames[static_cast<std::size_t>(m)];
}

std::optional<Metric> find_metric(std::string_view name) {
  for (std::size_t i = 0; i < kNumMetrics; ++i)
    if (kMetricNames[i] == name) return static_cast<Metric>(i);
  return std::nullopt;
}

void Coverage::add_step(const StepInput& in, int K) {
  rows += in.num_tokens;
  padded += std::max(0, in.capture_size - in.num_tokens);
  for (const RequestStep& r : in.requests) {
    if (r.q > 1 && r.ctx > 0) multi_token += r.q;
    if (r.ctx > K) over_k += r.q;
    const int blocks = static_cast<int>(r.block_table.size());
    for (int b = 0; b < blocks; ++b) {
      if (r.block_table[b] < 0) continue;  // a golden's table padding
      const auto [it, fresh] = block_owner.try_emplace(r.block_table[b], r.id);
      if (!fresh && it->second != r.id) ++reused_blocks, it->second = r.id;
    }
  }
}

void Coverage::add_scores(const std::vector<double>& scores, int K) {
  const long n = static_cast<long>(scores.size());
  ++scored;
  max_keys = std::max(max_keys, n);
  std::map<std::uint32_t, long> bins;
  for (const double s : scores) largest_bin = std::max(largest_bin, ++bins[coarse_bin(s)]);
  if (n >= K - 1 && n <= K + 1) ++k_edge;
  if (n <= K) return;
  ++pruned;
  std::vector<double> sorted = scores;
  std::nth_element(sorted.begin(), sorted.begin() + (K - 1), sorted.end(), std::greater<>());
  const double kth = sorted[K - 1];
  const long group = std::count(scores.begin(), scores.end(), kth);
  const long above = std::count_if(scores.begin(), scores.end(), [&](double s) { return s > kth; });
  if (above + group > K) {  // the tie group straddles the cut: the tie rule decides
    ++ties;
    largest_tie = std::max(largest_tie, group);
  }
}

void Coverage::merge(const Coverage& o) {
  rows += o.rows;
  padded += o.padded;
  multi_token += o.multi_token;
  over_k += o.over_k;
  scored += o.scored;
  pruned += o.pruned;
  ties += o.ties;
  largest_tie = std::max(largest_tie, o.largest_tie);
  largest_bin = std::max(largest_bin, o.largest_bin);
  max_keys = std::max(max_keys, o.max_keys);
  k_edge += o.k_edge;
  reused_blocks += o.reused_blocks;
}

long Coverage::value(Metric m) const {
  switch (m) {
    case Metric::rows:
      return rows;
    case Metric::padded:
      return padded;
    case Metric::multi_token:
      return multi_token;
    case Metric::over_k:
      return over_k;
    case Metric::scored:
      return scored;
    case Metric::pruned:
      return pruned;
    case Metric::ties:
      return ties;
    case Metric::largest_tie:
      return largest_tie;
    case Metric::largest_bin:
      return largest_bin;
    case Metric::max_keys:
      return max_keys;
    case Metric::k_edge:
      return k_edge;
    case Metric::reused_blocks:
      return reused_blocks;
  }
  return 0;
}

std::vector<std::pair<std::string, long>> Coverage::metrics() const {
  std::vector<std::pair<std::string, long>> out;
  for (std::size_t i = 0; i < kNumMetrics; ++i)
    out.emplace_back(kMetricNames[i], value(static_cast<Metric>(i)));
  return out;
}

bool Coverage::has_share(Metric m) {
  switch (m) {
    case Metric::padded:
    case Metric::multi_token:
    case Metric::over_k:
    case Metric::pruned:
    case Metric::ties:
    case Metric::k_edge:
      return true;
    default:
      return false;
  }
}

long Coverage::base_of(Metric m) const {
  switch (m) {
    case Metric::padded:
      return rows + padded;
    case Metric::multi_token:
    case Metric::over_k:
      return rows;
    case Metric::pruned:
    case Metric::k_edge:
      return scored;
    case Metric::ties:
      return pruned;
    default:
      return 0;
  }
}

std::string Coverage::line() const {
  std::ostringstream s;
  s << "coverage: " << rows << " rows (" << padded << " padded, " << multi_token << " multi-token, "
    << over_k << " past K in context); pruned " << pruned << " of " << scored << " scored"
    << percent_text(pruned, scored) << "; ties at the K-th score " << ties << " (largest group "
    << largest_tie << "); largest coarse bin " << largest_bin << " keys; longest row " << max_keys
    << " keys; " << k_edge << " rows at K-1..K+1 candidates; " << reused_blocks << " blocks reused";
  return s.str();
}

Requirement Requirement::parse(const std::string& text, const std::vector<std::string>& more) {
  Requirement r;
  r.text = text;
  const std::size_t at = text.find_first_of("<>=");
  if (at == std::string::npos || at == 0)
    throw std::invalid_argument(text + ": give METRIC OP VALUE, e.g. pruned>=50%");
  r.metric = text.substr(0, at);
  r.of_coverage = find_metric(r.metric);
  if (!r.of_coverage && std::find(more.begin(), more.end(), r.metric) == more.end()) {
    std::string names;
    for (const std::string_view name : kMetricNames)
      names += (names.empty() ? "" : ", ") + std::string(name);
    for (const std::string& name : more) names += ", " + name;
    throw std::invalid_argument(text + ": no metric " + r.metric + " (" + names + ")");
  }
  std::size_t v = at;
  while (v < text.size() && (text[v] == '<' || text[v] == '>' || text[v] == '=')) ++v;
  const std::string_view op = std::string_view(text).substr(at, v - at);
  const auto c = std::find_if(kComparisons.begin(), kComparisons.end(),
                              [&](const ComparisonName& k) { return k.text == op; });
  if (c == kComparisons.end())
    throw std::invalid_argument(text + ": comparison " + std::string(op) +
                                " (one of >=, >, <=, <, ==)");
  r.op = c->op;
  std::string num = text.substr(v);
  if (!num.empty() && num.back() == '%') {
    r.percent = true;
    num.pop_back();
    if (!r.of_coverage || !Coverage::has_share(*r.of_coverage))
      throw std::invalid_argument(text + ": " + r.metric +
                                  " is a count, not a share (give a number)");
  }
  std::size_t used = 0;
  try {
    r.value = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (num.empty() || used != num.size() || !std::isfinite(r.value) || r.value < 0 ||
      (r.percent && r.value > 100))
    throw std::invalid_argument(text + ": value " + num +
                                (r.percent ? " (a percentage, 0..100)" : " (a count >= 0)"));
  return r;
}

std::string Requirement::check(const Coverage& c, const std::map<std::string, long>& more) const {
  long n = of_coverage ? c.value(*of_coverage) : 0;
  if (const auto it = more.find(metric); it != more.end()) n = it->second;
  const long base = of_coverage ? c.base_of(*of_coverage) : 0;
  const double got =
      percent ? (base > 0 ? 100.0 * static_cast<double>(n) / static_cast<double>(base) : 0.0)
              : static_cast<double>(n);
  bool met = false;
  switch (op) {
    case Comparison::ge:
      met = got >= value;
      break;
    case Comparison::gt:
      met = got > value;
      break;
    case Comparison::le:
      met = got <= value;
      break;
    case Comparison::lt:
      met = got < value;
      break;
    case Comparison::eq:
      met = got == value;
      break;
  }
  if (met) return "";
  std::ostringstream s;
  s << text << ": " << metric << " is " << n;
  if (base > 0) s << " of " << base << percent_text(n, base);
  return s.str();
}

}  // namespace dsv32

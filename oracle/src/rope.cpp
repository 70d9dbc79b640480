#include "dsv32/oracle/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "dsv32/oracle/numerics.hpp"

namespace dsv32 {

std::vector<double> rope_frequencies_fp64(const Config& cfg) {
  const int dr = cfg.qk_rope_head_dim;
  const double theta = cfg.rope_theta;
  std::vector<double> w(dr / 2);
  for (int i = 0; i < dr / 2; ++i) w[i] = std::pow(theta, -2.0 * i / dr);
  if (!cfg.rope_scaling) return w;
  const Yarn& y = *cfg.rope_scaling;
  const auto corr = [&](double n) {
    return dr * std::log(y.original_max_position_embeddings / (2.0 * std::numbers::pi * n)) /
           (2.0 * std::log(theta));
  };
  const double lo = std::max(std::floor(corr(y.beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(y.beta_slow)), static_cast<double>(dr - 1));
  if (hi == lo) hi += 0.001;
  for (int i = 0; i < dr / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    w[i] = w[i] * (1.0 - ramp) + (w[i] / y.factor) * ramp;
  }
  return w;
}

Rope::Rope(const Config& cfg) : bf16_(cfg.rope_table == RopeTable::bf16) {
  for (double f : rope_frequencies_fp64(cfg)) w_.push_back(static_cast<float>(f));
}

float Rope::angle(int position, int i) const {
  return static_cast<float>(position) * w_.at(i);  // one fp32 multiply, as deployed
}

namespace {

/// fp32(v), through memory: GCC 12 at -O3 for x86-64 levels below v3 drops this narrowing where
/// Rope::apply inlines cos and sin side by side (Golden.SameBytesFromTheOracleBuiltFor_scalar).
double to_fp32(double v) {
  volatile float f = static_cast<float>(v);
  return f;
}

}  // namespace

double Rope::cos(int position, int i) const {
  const double c = to_fp32(std::cos(static_cast<double>(angle(position, i))));
  return bf16_ ? round_bf16(c) : c;
}

double Rope::sin(int position, int i) const {
  const double s = to_fp32(std::sin(static_cast<double>(angle(position, i))));
  return bf16_ ? round_bf16(s) : s;
}

void Rope::apply(std::span<double> x, int position, RopeLayout layout) const {
  const int half = static_cast<int>(w_.size());
  if (static_cast<int>(x.size()) < 2 * half) throw std::invalid_argument("rope: vector too short");
  for (int i = 0; i < half; ++i) {
    const int a = layout == RopeLayout::interleaved ? 2 * i : i;
    const int b = layout == RopeLayout::interleaved ? 2 * i + 1 : i + half;
    const double c = cos(position, i), s = sin(position, i);
    const double xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

void hadamard_transform(std::span<double> x) {
  const std::size_t n = x.size();
  if (n == 0 || (n & (n - 1)) != 0)
    throw std::invalid_argument("hadamard: length not a power of 2");
  for (std::size_t h = 1; h < n; h *= 2)
    for (std::size_t i = 0; i < n; i += 2 * h)
      for (std::size_t j = i; j < i + h; ++j) {
        const double a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const double s = 1.0 / std::sqrt(static_cast<double>(n));
  for (double& v : x) v *= s;
}

}  // namespace dsv32

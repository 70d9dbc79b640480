#include "dsv32/oracle/numerics.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>

namespace dsv32 {

std::uint8_t e4m3_bits(double x) {
  if (std::isnan(x)) return 0x7F;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;  // satfinite; nothing below 448 rounds past it
  if (a < 0x1p-6) {
    // Subnormals: value = m * 2^-9, m in 0..7; m == 8 is the smallest normal, same bits.
    const double m = std::nearbyint(a * 0x1p9);  // exact scaling; default mode is to-nearest-even
    return sign | static_cast<std::uint8_t>(m);
  }
  int k = 0;
  std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1)
  int e = k - 1;
  double m = std::nearbyint((std::ldexp(a, -e) - 1.0) * 8.0);
  if (m == 8.0) {
    m = 0.0;
    ++e;
  }
  return sign | static_cast<std::uint8_t>(((e + 7) << 3) | static_cast<int>(m));
}

namespace {

double decode_e4m3(std::uint8_t bits) {
  const int e = (bits >> 3) & 0xF;
  const int m = bits & 0x7;
  if (e == 0xF && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (bits & 0x80) ? -mag : mag;
}

/// Every code's value, decoded once (a golden's prefix decodes 10^8 of them).
const std::array<double, 256>& e4m3_table() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = decode_e4m3(static_cast<std::uint8_t>(b));
    return t;
  }();
  return table;
}

}  // namespace

double e4m3_value(std::uint8_t bits) {
  return e4m3_table()[bits];
}

double e4m3_quantum(double x) {
  const double a = std::fabs(x);
  if (a < 0x1p-6) return 0x1p-9;
  int k = 0;
  std::frexp(std::min(a, kE4m3Max), &k);
  return std::ldexp(1.0, k - 1 - 3);
}

int ue8m0_exponent(double amax) {
  const double a = std::max(amax, static_cast<double>(kIndexerAmaxFloor));
  if (!std::isfinite(a)) return 127;  // only garbage (padded) rows get here
  int k = 0;
  std::frexp(a, &k);  // a < 2^k, and 448 * 2^(k-9) = 1.75 * 2^(k-1)
  int e = k - 10;
  while (std::ldexp(kE4m3Max, e) < a) ++e;
  return e;
}

double ue8m0_scale(double amax) {
  return std::ldexp(1.0, ue8m0_exponent(amax));
}

Fp8Block quantize_ue8m0(std::span<const double> x) {
  double amax = 0.0;
  for (double v : x) amax = std::max(amax, std::fabs(v));
  Fp8Block b;
  b.scale = ue8m0_scale(amax);
  b.codes.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) b.codes[i] = e4m3_bits(x[i] / b.scale);
  return b;
}

float ds_mla_tile_scale(double amax) {
  return std::max(static_cast<float>(amax) / 448.0f, FLT_MIN);
}

namespace {

/// Calls f(first, end, scale) for each fp8_ds_mla tile of `v`, its scale from its amax.
template <class F>
void for_each_tile(std::span<const double> v, F&& f) {
  for (std::size_t t0 = 0; t0 < v.size(); t0 += kDsMlaTile) {
    const std::size_t t1 = std::min(v.size(), t0 + kDsMlaTile);
    double amax = 0.0;
    for (std::size_t i = t0; i < t1; ++i) amax = std::max(amax, std::fabs(v[i]));
    if (!f(t0, t1, ds_mla_tile_scale(amax))) return;
  }
}

}  // namespace

std::vector<double> ds_mla_roundtrip(std::span<const double> latent) {
  std::vector<double> out(latent.size());
  for_each_tile(latent, [&](std::size_t t0, std::size_t t1, float s) {
    for (std::size_t i = t0; i < t1; ++i) {
      const float q = static_cast<float>(e4m3_value(e4m3_bits(static_cast<float>(latent[i]) / s)));
      out[i] = q * s;
    }
    return true;
  });
  return out;
}

DsMlaGrid ds_mla_grid(std::span<const double> readback) {
  DsMlaGrid out;
  for_each_tile(readback, [&](std::size_t t0, std::size_t t1, float s) {
    for (std::size_t i = t0; i < t1; ++i) {
      const double x = readback[i] / s, code = round_e4m3(x);
      const double spacing = std::min(e4m3_quantum(code), e4m3_quantum(code * (1 - 0x1p-10)));
      if (!(std::fabs(x - code) <= spacing / 8)) {
        out.off_grid = static_cast<std::ptrdiff_t>(i), out.scale = s, out.nearest = code * s;
        return false;
      }
    }
    return true;
  });
  return out;
}

}  // namespace dsv32

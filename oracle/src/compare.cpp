#include "dsv32/oracle/compare.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>

#include "dsv32/oracle/numerics.hpp"

namespace dsv32 {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0.0;
  const std::size_t n = std::min(a.data.size(), b.data.size());
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a.data[i] - b.data[i]));
  return m;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : t.data) m = std::max(m, std::fabs(v));  // fmax semantics: NaN ignored
  return m;
}

namespace {

double rms_of(const Tensor& t) {
  double s = 0.0;
  for (double v : t.data) s += v * v;
  return t.data.empty() ? 0.0 : std::sqrt(s / static_cast<double>(t.data.size()));
}

/// Checks shapes and finiteness and fills max_err, counts, first bad, cosine difference.
CompareResult measure(const Tensor& got, const Tensor& want, double tol, std::string rule) {
  CompareResult r;
  r.tensor = want.name;
  r.rule = std::move(rule);
  r.tol = tol;
  r.rms = rms_of(want);
  r.count = want.numel();
  if (got.shape != want.shape) {
    r.refused = true;
    r.note = "shape " + got.shape_string() + " != expected " + want.shape_string();
    return r;
  }
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (std::size_t i = 0; i < want.data.size(); ++i) {
    const double a = got.data[i], b = want.data[i];
    const bool same_anomaly =
        (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && std::isinf(b) && a == b);
    const double err = same_anomaly ? 0.0 : std::fabs(a - b);
    const bool bad = !same_anomaly && !(err <= tol);  // NaN err is bad
    if (!std::isnan(err))
      r.max_err = std::max(r.max_err, err);
    else
      r.max_err = std::numeric_limits<double>::quiet_NaN();
    if (bad) {
      if (r.first_bad < 0) {
        r.first_bad = static_cast<std::int64_t>(i);
        r.got_at = a;
        r.want_at = b;
      }
      ++r.count_over;
    }
    if (std::isfinite(a) && std::isfinite(b)) {
      dot += a * b;
      na += a * a;
      nb += b * b;
    }
  }
  r.cos_diff = (na + nb) > 0 ? 1.0 - 2.0 * dot / (na + nb) : 0.0;
  r.pass = r.count_over == 0;
  return r;
}

/// Refuses a comparison whose references (T0, T1, their scales) hold NaN or Inf: a gate is
/// computed from them, and one Inf makes it infinite (everything passes) or NaN. Returns true
/// when refused.
bool refuse_non_finite(CompareResult& r, std::initializer_list<const Tensor*> refs) {
  for (const Tensor* t : refs) {
    if (!t) continue;
    for (std::size_t i = 0; i < t->data.size(); ++i)
      if (!std::isfinite(t->data[i])) {
        r.refused = true;
        r.pass = false;
        std::ostringstream s;
        s << "reference " << (t->name.empty() ? "tensor" : t->name) << " holds " << t->data[i]
          << " at flat " << i << ": no gate can be formed";
        r.note = s.str();
        return true;
      }
  }
  if (!std::isfinite(r.tol)) {
    r.refused = true;
    r.pass = false;
    r.note = "the gate is not finite";
    return true;
  }
  return false;
}

void refuse_if_vacuous(CompareResult& r, const Tensor& t0, DType storage) {
  if (r.refused) return;
  if (!(r.rms > 0.0)) {
    r.refused = true;
    r.pass = false;
    r.note = "reference has zero norm: the comparison would be vacuous";
    return;
  }
  const double cap = vacuity_cap(t0, storage);
  if (!(r.tol <= cap) || !std::isfinite(cap)) {
    r.refused = true;
    r.vacuous = true;
    r.pass = false;
    std::ostringstream s;
    s << "vacuous gate: tol " << r.tol << " exceeds the cap " << cap << " (RMS " << r.rms << ")";
    r.note = s.str();
  }
}

/// One element of a quantized comparison: max_err in quanta q; over when |g - w| > q + slack,
/// when `ok` is false, or when only one of them is NaN.
void count_in_quanta(CompareResult& r, std::int64_t k, double g, double w, double q, double slack,
                     bool ok = true) {
  const double err = std::fabs(g - w);
  if (!std::isnan(err)) r.max_err = std::max(r.max_err, err / q);
  if (!std::isnan(err)) r.quanta_ratio = std::max(r.quanta_ratio, err / (q + slack));
  if (!ok || !(err <= q + slack) || std::isnan(g) != std::isnan(w)) {
    if (r.first_bad < 0) {
      r.first_bad = k;
      r.got_at = g;
      r.want_at = w;
    }
    ++r.count_over;
  }
}

}  // namespace

double CompareResult::gate_ratio() const {
  const double x = in_quanta ? quanta_ratio : tol > 0 ? max_err / tol : 0.0;
  if (!pass && !(x > 1.0)) return std::numeric_limits<double>::infinity();
  return x;
}

std::string CompareResult::summary() const {
  std::ostringstream s;
  s.precision(6);
  s << tensor << ": "
    << (refused ? "REFUSED"
        : pass  ? "ok"
                : "FAIL")
    << "  max_err " << max_err << " tol " << tol << " [" << rule << "]  rms " << rms
    << "  cos_diff " << cos_diff;
  if (first_bad >= 0)
    s << "  first bad flat " << first_bad << ": got " << got_at << " want " << want_at << "  ("
      << count_over << "/" << count << " over)";
  if (!note.empty()) s << "  note: " << note;
  return s.str();
}

double round_to(DType dt, double v) {
  switch (dt) {
    case DType::bfloat16:
      return round_bf16(v);
    case DType::float32:
      return static_cast<float>(v);
    case DType::float8_e4m3fn:
      return round_e4m3(v);
    default:
      return v;
  }
}

double ulp_in(DType dt, double magnitude) {
  const double a =
      std::max(std::fabs(magnitude), static_cast<double>(std::numeric_limits<float>::min()));
  int k = 0;
  std::frexp(a, &k);  // a in [2^(k-1), 2^k)
  switch (dt) {
    case DType::bfloat16:
      return std::ldexp(1.0, k - 1 - 7);
    case DType::float32:
      return std::ldexp(1.0, k - 1 - 23);
    case DType::float8_e4m3fn:
      return e4m3_quantum(magnitude);
    default:
      return std::ldexp(1.0, k - 1 - 52);
  }
}

double fa_floor(const Tensor& t0, DType storage) {
  double m = 0.0;
  for (double v : t0.data) {
    if (!std::isfinite(v)) continue;
    const double r = round_to(storage, round_to(storage, v + 0.3) - 0.3);
    m = std::max(m, std::fabs(r - v));
  }
  return 2.0 * m;
}

double gamma_fp32(std::int64_t n) {
  const double nu = static_cast<double>(n) * 0x1p-24;
  return nu / (1.0 - nu);
}

double vacuity_cap(const Tensor& t0, DType precision) {
  const double ulps = precision == DType::float8_e4m3fn ? 4.0 : 16.0;
  return std::max(0.01 * rms_of(t0), ulps * ulp_in(precision, max_abs(t0)));
}

namespace {

/// A gate widened from its own tolerance towards `wide` (from the stage's statistic over the
/// run), never past the vacuity cap: that widening alone does not make a gate vacuous.
double widened_tol(double own, double wide, double cap) {
  return std::max(own, std::min(wide, cap));
}

}  // namespace

CompareResult compare_bf16(const Tensor& got, const Tensor& t0, const Tensor& t1, DType storage,
                           DType cap_precision, double run_spread) {
  // The run's spread where it is larger than the step's own.
  const bool same_shape = t1.shape == t0.shape;
  const double own = same_shape ? max_abs_diff(t1, t0) : 0.0;
  const double floor = fa_floor(t0, storage), own_tol = 2.0 * own + floor;
  const bool run = same_shape && run_spread > own;
  const double tol =
      run ? widened_tol(own_tol, 2.0 * run_spread + floor, vacuity_cap(t0, cap_precision))
          : own_tol;
  CompareResult r =
      measure(got, t0, tol,
              run ? "2*max|T1-T0| over the run (capped) + fa_floor" : "2*max|T1-T0| + fa_floor");
  if (!same_shape) {
    r.refused = true;
    r.note = "T1 shape " + t1.shape_string() + " != T0 shape " + t0.shape_string();
  }
  if (!r.refused) refuse_non_finite(r, {&t0, &t1});
  // The cap is set by the pipeline's precision (bf16), also for stages stored in fp32 (omega,
  // lse, scales) whose inputs went through bf16 roundings.
  refuse_if_vacuous(r, t0, cap_precision);
  r.pass = r.pass && !r.refused;
  return r;
}

CompareResult compare_fp32(const Tensor& got, const Tensor& t0, std::int64_t n, double scale) {
  // At the stage's run scale where that is larger (a step whose values cancelled).
  const double rel = 2.0 * gamma_fp32(n), own_scale = max_abs(t0), own = rel * own_scale;
  const bool widened = scale > own_scale;
  const double tol = widened ? widened_tol(own, rel * scale, vacuity_cap(t0, DType::float32)) : own;
  CompareResult r =
      measure(got, t0, tol,
              (widened ? "2*gamma_n*max(max|T0|, run scale) capped, n=" : "2*gamma_n*max|T0|, n=") +
                  std::to_string(n));
  if (!r.refused) refuse_non_finite(r, {&t0});
  refuse_if_vacuous(r, t0, DType::float32);
  r.pass = r.pass && !r.refused;
  return r;
}

CompareResult compare_abs(const Tensor& got, const Tensor& want, double tol) {
  CompareResult r = measure(got, want, tol, tol == 0.0 ? "bitwise" : "abs");
  r.pass = r.pass && !r.refused;
  return r;
}

CompareResult compare_quantized(const Tensor& got_vals, const Tensor& got_scales,
                                const Tensor& want_vals, const Tensor& want_scales,
                                std::int64_t block, const Tensor* t1_vals, const Tensor* t1_scales,
                                double boundary_rel) {
  CompareResult r = measure(got_vals, want_vals, 0.0, "one e4m3 quantum, dequantized");
  if (r.refused) return r;
  if (got_scales.numel() * block != got_vals.numel() || got_scales.shape != want_scales.shape ||
      (t1_vals && (t1_vals->shape != want_vals.shape || !t1_scales ||
                   t1_scales->shape != want_scales.shape))) {
    r.refused = true;
    r.pass = false;
    r.note = "scale or T1 shapes do not match the values";
    return r;
  }
  if (refuse_non_finite(r, {&want_vals, &want_scales, t1_vals, t1_scales})) return r;
  if (t1_vals) r.rule += " + 2 * block T1 spread";
  r.max_err = 0.0;
  r.count_over = 0;
  r.first_bad = -1;
  std::int64_t scale_flips = 0;
  for (std::int64_t b = 0; b < got_scales.numel(); ++b) {
    const double sg = got_scales.data[b], sw = want_scales.data[b];
    double amax = 0.0, spread = 0.0;
    for (std::int64_t i = 0; i < block; ++i) {
      const std::int64_t k = b * block + i;
      amax = std::max(amax, std::fabs(want_vals.data[k] * sw));
      if (t1_vals)
        spread = std::max(
            spread, std::fabs(t1_vals->data[k] * t1_scales->data[b] - want_vals.data[k] * sw));
    }
    bool scale_ok = sg == sw;
    if (!scale_ok && (sg == 2 * sw || sw == 2 * sg)) {
      // Legal only where amax / 448 is within rounding of a power of two.
      const double x = std::max(amax, static_cast<double>(kIndexerAmaxFloor)) / kE4m3Max;
      const double p2 = std::exp2(std::round(std::log2(x)));
      scale_ok = std::fabs(x - p2) <= boundary_rel * p2;
      if (scale_ok) ++scale_flips;
    }
    for (std::int64_t i = 0; i < block; ++i) {
      const std::int64_t k = b * block + i;
      const double g = got_vals.data[k] * sg, w = want_vals.data[k] * sw;
      const double q = e4m3_quantum(want_vals.data[k]) * std::max(sg, sw);
      count_in_quanta(r, k, g, w, q, 2 * spread, scale_ok);
    }
  }
  r.tol = 1.0;  // max_err is in quanta
  r.in_quanta = true;
  if (scale_flips)
    r.note =
        std::to_string(scale_flips) + " block scale(s) differ by 2x at a power-of-two boundary";
  r.pass = r.count_over == 0;
  return r;
}

CompareResult compare_fp8_cache(const Tensor& got, const Tensor& t0, const Tensor& t1,
                                std::int64_t tile, double rel, double spread_floor) {
  CompareResult r = measure(got, t0, 0.0, "one e4m3 quantum at tile scale + 2 * tile T1 spread");
  if (r.refused) return r;
  if (t1.shape != t0.shape || t0.shape.size() != 2 || tile < 1) {
    r.refused = true;
    r.pass = false;
    r.note = "T1 shape or the tile does not match the values";
    return r;
  }
  if (refuse_non_finite(r, {&t0, &t1})) return r;
  const std::int64_t rows = t0.shape[0], cols = t0.shape[1];
  r.max_err = 0.0;
  r.count_over = 0;
  r.first_bad = -1;
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t c0 = 0; c0 < cols; c0 += tile) {
      const std::int64_t c1 = std::min(cols, c0 + tile);
      double amax = 0.0, amax0 = 0.0, spread = 0.0;
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t k = row * cols + c;
        amax0 = std::max(amax0, std::fabs(t0.data[k]));
        amax = std::max({amax, std::fabs(t0.data[k]), std::fabs(t1.data[k])});
        spread = std::max(spread, std::fabs(t1.data[k] - t0.data[k]));
      }
      const double scale = std::max(amax, 1e-30) / kE4m3Max;  // the cache's tile scale
      // The floor widens a tile's spread at most to the vacuity cap of the stages computed from
      // the cache (4 e4m3 quanta at the tile's max, TOLERANCES.md): widening alone never makes
      // the gate vacuous.
      spread = std::max(spread, std::min(spread_floor, 4 * e4m3_quantum(kE4m3Max) * scale));
      // T0's own tile scale: T0's values are codes on it (its amax is the code 448).
      const double scale0 = std::max(amax0, 1e-30) / kE4m3Max;
      for (std::int64_t c = c0; c < c1; ++c) {
        const std::int64_t k = row * cols + c;
        const double g = got.data[k], w = t0.data[k];
        // The step to a neighbouring code: at the tile scale, or T0's own code's step towards
        // the candidate (a code at a binade's bottom reads just below it on a larger scale,
        // yet its step up is the binade's quantum; its step down is half that). T0's code is
        // |w| / scale0 snapped to the e4m3 grid: T0's value is the code times the scale
        // rounded to fp32 (MATH.md section 4), so the quotient can land a rounding error
        // (2^-24, not less) below a binade's bottom.
        const double code0 = round_e4m3(std::fabs(w) / scale0);
        const double step0 =
            std::fabs(g) > std::fabs(w) ? e4m3_quantum(code0) : e4m3_quantum(code0 * (1 - 0x1p-10));
        const double q = std::max(e4m3_quantum(std::fabs(w) / scale) * scale, step0 * scale0);
        count_in_quanta(r, k, g, w, q, 2 * spread + rel * (std::fabs(w) + q));
      }
    }
  r.tol = 1.0;  // max_err is in quanta
  r.in_quanta = true;
  r.pass = r.count_over == 0;
  return r;
}

double index_score_eps(const Config& cfg, double abs_term_sum) {
  return gamma_fp32(static_cast<std::int64_t>(cfg.index_n_heads) * cfg.index_head_dim) *
         abs_term_sum;
}

std::string check_topk_row(const std::vector<int>& row, const std::vector<double>& scores, int K,
                           double eps) {
  const int n = static_cast<int>(scores.size());  // p + 1
  const int kt = std::min(K, n);
  if (static_cast<int>(row.size()) != K)
    return "row has " + std::to_string(row.size()) + " entries, expected K=" + std::to_string(K);
  std::set<int> chosen;
  for (int k = 0; k < K; ++k) {
    const int v = row[k];
    if (k < kt) {
      if (v < 0 || v >= n)
        return "entry " + std::to_string(k) + " = " + std::to_string(v) + " outside [0, " +
               std::to_string(n - 1) + "]";
      if (!chosen.insert(v).second) return "position " + std::to_string(v) + " chosen twice";
    } else if (v != -1) {
      return "entry " + std::to_string(k) + " = " + std::to_string(v) + ", expected -1 after " +
             std::to_string(kt) + " picks";
    }
  }
  if (n <= K) {
    for (int j = 0; j < n; ++j)
      if (row[j] != j)
        return "p+1 <= K: expected positions 0..p in order, entry " + std::to_string(j) + " = " +
               std::to_string(row[j]);
    return "";
  }
  double min_chosen = std::numeric_limits<double>::infinity(), max_rest = -min_chosen;
  int arg_min = -1, arg_max = -1;
  for (int j = 0; j < n; ++j) {
    if (std::isnan(scores[j]))
      return "reference score at position " + std::to_string(j) + " is NaN";
    if (chosen.count(j)) {
      if (scores[j] < min_chosen) min_chosen = scores[j], arg_min = j;
    } else if (scores[j] > max_rest) {
      max_rest = scores[j], arg_max = j;
    }
  }
  if (min_chosen < max_rest - eps) {
    std::ostringstream s;
    s.precision(9);
    s << "chosen position " << arg_min << " (score " << min_chosen << ") is worse than unchosen "
      << arg_max << " (score " << max_rest << ") by more than eps " << eps;
    return s.str();
  }
  return "";
}

}  // namespace dsv32

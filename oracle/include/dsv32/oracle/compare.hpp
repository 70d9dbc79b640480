// The gates of TESTING.md sections 1-2: compute separate from compare, reports that name the
// first bad element with both values, counts, and the cosine difference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32 {

/// Outcome of one tensor comparison.
struct CompareResult {
  std::string tensor;
  bool pass = false;
  bool refused = false;         // the gate itself was vacuous or the inputs unusable
  bool vacuous = false;         // refused because the reference's own gate exceeds the cap
  bool in_quanta = false;       // max_err counts e4m3 quanta (quantized rules; tol is 1)
  std::string rule;             // how the tolerance was formed
  double max_err = 0.0;         // max |got - want|
  double tol = 0.0;             // the gate on max_err
  double rms = 0.0;             // RMS of the reference
  std::int64_t first_bad = -1;  // flat index of the first element over tol (or NaN mismatch)
  double got_at = 0.0, want_at = 0.0;
  std::int64_t count_over = 0;  // elements over tol
  std::int64_t count = 0;       // elements compared
  double cos_diff = 0.0;        // 1 - 2<a,b>/(|a|^2+|b|^2)
  std::string note;             // e.g. scales that differ by a factor of two
  double quanta_ratio = 0.0;    // quantized rules: max over elements of error / its allowance
  /// How far over (or under) its gate the comparison lies: max_err / tol, or for the quantized
  /// rules each element's error over its own allowance; +inf for a failure that no finite ratio
  /// measures (a refused gate, a NaN where the reference has none, a set or bitwise rule), so a
  /// failing comparison never reports a ratio of 1 or less.
  double gate_ratio() const;
  /// One line: tensor, verdict, max_err/tol, first bad index with both values, counts.
  std::string summary() const;
};

/// Storage-precision helpers: the value rounded to `dt`, and one unit in the last place there.
double round_to(DType dt, double v);
double ulp_in(DType dt, double magnitude);

/// The latent read back from an fp8_ds_mla cache (`c`, rows x L): within one e4m3 quantum at
/// each element's magnitude (tile scale max(|T0|, |T1|) of the tile / 448, tiles of `tile`
/// columns; or, where larger, the step from T0's own code towards the candidate's on T0's own
/// tile scale: a code at a binade's bottom, 2^e, measured on the larger scale lands just under
/// 2^e, yet its step up is 2^e's quantum) plus
/// twice the tile's T1 - T0 spread, plus `rel` (|T0| + the quantum): the candidate's own tile
/// scale may differ from T0's by that relative amount (in fp32 precision T1 = T0 and the spread
/// is 0, yet the GPU's fp32 amax is not T0's: a flipped code then measured 1 + 1e-7 quanta).
/// A tile's spread is at least `spread_floor` (the run's largest T1 - T0 of the stage, as the
/// bf16 gates take it: a row's few values can make T1's noise look smaller than it is).
/// max_err is reported in quanta.
CompareResult compare_fp8_cache(const Tensor& got, const Tensor& t0, const Tensor& t1,
                                std::int64_t tile, double rel = 0.0, double spread_floor = 0.0);

/// FlashAttention's floor in storage precision: 2 * max |(T0 + 0.3 - 0.3) - T0|, each op rounded.
double fa_floor(const Tensor& t0, DType storage);
/// gamma_n = n u / (1 - n u) with u = 2^-24: the fp32 bound on a length-n dot product.
double gamma_fp32(std::int64_t n);
/// The widest tolerance a gate may have before the comparer refuses it (docs/TOLERANCES.md):
/// max(1% of RMS(T0), n ulps of `precision` at max |T0|), n = 16 (2 for e4m3: one flipped
/// code of an fp8 cache is the pipeline's own resolution).
double vacuity_cap(const Tensor& t0, DType precision);

/// bf16-precision gate: max|got - T0| <= 2 spread + fa_floor(T0, storage), spread = max|T1 -
/// T0| or, where larger, `run_spread` (diff_traces passes the stage's largest T1 - T0 over the
/// steps of the run: its rounding noise measured on more than one step's few values), that
/// widening never past the vacuity cap; the cap is taken in bf16 (the pipeline's precision)
/// whatever the stage's storage dtype.
CompareResult compare_bf16(const Tensor& got, const Tensor& t0, const Tensor& t1, DType storage,
                           DType cap_precision = DType::bfloat16, double run_spread = 0.0);
/// fp32-precision gate: max|got - T0| <= 2 gamma_n max(max|T0|, scale), n the dot length the
/// error is bounded over (diff_traces passes fp32_chain_dot) and `scale` the stage's magnitude
/// over the whole run (diff_traces passes the largest max|T0| of the stage over the steps): a
/// step whose values cancel far below their terms is judged at the stage's scale, the gate then
/// no wider than the vacuity cap.
CompareResult compare_fp32(const Tensor& got, const Tensor& t0, std::int64_t n, double scale = 0.0);
/// Largest |value| of a tensor (0 for an empty one; NaN ignored).
double max_abs(const Tensor& t);
/// max |a - b| over the elements both have (NaN ignored, as max_abs).
double max_abs_diff(const Tensor& a, const Tensor& b);
/// Fixed-tolerance compare (bitwise when tol == 0), e.g. plan vs eager.
CompareResult compare_abs(const Tensor& got, const Tensor& want, double tol);
/// Quantized blocks: values dequantized with their scales must agree within one e4m3 quantum at
/// each element's magnitude, widened by twice the block's T1 - T0 spread when T1 is given (in
/// bf16 precision the values entering the quantizer carry bf16 roundings that move codes by
/// more than a quantum; in fp32 precision T1 = T0 and the rule is the literal one). A block
/// scale may differ by 2x only where amax/448 is within `boundary_rel` of a power of two
/// (reported in note). Values are (rows, block), scales (rows).
CompareResult compare_quantized(const Tensor& got_vals, const Tensor& got_scales,
                                const Tensor& want_vals, const Tensor& want_scales,
                                std::int64_t block, const Tensor* t1_vals = nullptr,
                                const Tensor* t1_scales = nullptr, double boundary_rel = 1e-5);

/// fp32 accumulation error bound of one index score: gamma_n * sum of |terms| (n = HI * dI).
double index_score_eps(const Config& cfg, double abs_term_sum);
/// Validity of one top-k row against reference scores of positions 0..p (TESTING.md section 2):
/// exactly K_t distinct positions in [0, p] then -1; {0..p} when p + 1 <= K; min chosen >=
/// max rest - eps. Returns an empty string when valid, else what is wrong.
std::string check_topk_row(const std::vector<int>& row, const std::vector<double>& scores, int K,
                           double eps);

}  // namespace dsv32

// The model's RoPE (YaRN or plain) cos/sin table, both pair layouts, and the Hadamard rotation.
#pragma once

#include <span>
#include <vector>

#include "dsv32/oracle/config.hpp"

namespace dsv32 {

/// Pair layout: interleaved pairs (2i, 2i+1) or NeoX half-split pairs (i, i + dr/2).
enum class RopeLayout { interleaved, neox };

/// cos/sin of the model: w_i in fp64 rounded to fp32; angle = fp32(p) * w_i in fp32;
/// cos/sin in fp64 rounded to fp32, or further to bf16 (rope_table = bf16).
class Rope {
 public:
  explicit Rope(const Config& cfg);
  /// The fp32 frequencies w_i, i < dr/2.
  const std::vector<float>& freqs() const { return w_; }
  double cos(int position, int i) const;
  double sin(int position, int i) const;
  /// Rotates the first dr values of x in place at `position` (dr = qk_rope_head_dim).
  void apply(std::span<double> x, int position, RopeLayout layout) const;

 private:
  float angle(int position, int i) const;
  std::vector<float> w_;
  bool bf16_;
};

/// The YaRN (or plain) frequencies of MATH.md section 1 in fp64, before rounding to fp32.
std::vector<double> rope_frequencies_fp64(const Config& cfg);

/// In-place normalized Sylvester Hadamard transform of a power-of-two length vector:
/// x <- H_n x / sqrt(n), H[i][j] = (-1)^popcount(i & j).
void hadamard_transform(std::span<double> x);

}  // namespace dsv32

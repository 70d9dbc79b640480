// Bit-exact number formats of the model: bf16, e4m3fn, ue8m0 scales, fp8_ds_mla tiles.
// Each conversion matches CUDA's (cvt.rn.bf16.f32, cvt.rn.satfinite.e4m3x2.f32).
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <vector>

namespace dsv32 {

/// bf16 bit pattern of x, round to nearest even; NaN becomes the canonical 0x7FFF. Inline (as
/// bf16_value): the emulated mode rounds whole tensors with them, and a call per element keeps
/// those loops from vectorizing.
inline std::uint16_t bf16_bits(float x) {
  if (x != x) return 0x7FFF;
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t bias = 0x7FFFu + ((u >> 16) & 1u);  // ties go to the even neighbour
  return static_cast<std::uint16_t>((u + bias) >> 16);
}
/// The fp32 value of a bf16 bit pattern (exact).
inline float bf16_value(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}
/// x rounded to bf16 and widened back to fp32.
inline float round_bf16(float x) {
  return bf16_value(bf16_bits(x));
}
/// A double rounded to fp32, then to bf16 (MATH.md rounds "from fp32").
inline double round_bf16(double x) {
  return round_bf16(static_cast<float>(x));
}

/// Largest finite e4m3fn magnitude.
inline constexpr double kE4m3Max = 448.0;
/// e4m3fn bit pattern of x: round to nearest even, saturate to +-448, NaN -> 0x7F.
/// Exact from double, so it serves both fp32 inputs and the fp64 oracle.
std::uint8_t e4m3_bits(double x);
/// The value of an e4m3fn bit pattern (NaN for 0x7F/0xFF).
double e4m3_value(std::uint8_t bits);
inline double round_e4m3(double x) {
  return e4m3_value(e4m3_bits(x));
}
/// Spacing of the e4m3 grid at magnitude |x| (one quantum), for comparisons.
double e4m3_quantum(double x);

/// Floor on the amax of an indexer fp8 block (vLLM's DSv3.2 path), as fp32.
inline constexpr float kIndexerAmaxFloor = 1e-4f;
/// Exponent e of the smallest power of two with max(amax, 1e-4) <= 448 * 2^e (exact compare).
int ue8m0_exponent(double amax);
/// 2^ue8m0_exponent(amax).
double ue8m0_scale(double amax);

/// One indexer fp8 block: e4m3 codes of x / scale and the ue8m0 scale.
struct Fp8Block {
  std::vector<std::uint8_t> codes;
  double scale = 1.0;
};
/// Quantizes a 128-vector with a ue8m0 scale (x / scale is exact: scale is a power of two).
Fp8Block quantize_ue8m0(std::span<const double> x);

/// fp8_ds_mla tile width of the latent.
inline constexpr int kDsMlaTile = 128;
/// Tile scale: max(fp32(amax) / 448 in fp32, FLT_MIN); not a power of two.
float ds_mla_tile_scale(double amax);
/// Quantizes a latent vector tile by tile (e4m3(fp32(c) / scale), division in fp32) and returns
/// the read-back value * scale in fp32. This is the model's quantizer, the same in both modes.
std::vector<double> ds_mla_roundtrip(std::span<const double> latent);

/// Whether a latent row read back from an fp8_ds_mla cache holds codes: each tile's scale is
/// recovered from its largest magnitude (the code 448 times the scale), and every value must be
/// an e4m3 code times that scale, within an eighth of the grid's spacing there (a bf16 copy of
/// the read-back value, or a scale off by an fp32 rounding, moves it by at most 2^-6 of it).
struct DsMlaGrid {
  /// The first column whose value is no code times its tile's scale (a latent that was never
  /// quantized lands anywhere between two codes), else -1.
  std::ptrdiff_t off_grid = -1;
  double scale = 0.0, nearest = 0.0;  // at off_grid: its tile's scale and the nearest code value
};
DsMlaGrid ds_mla_grid(std::span<const double> readback);

}  // namespace dsv32

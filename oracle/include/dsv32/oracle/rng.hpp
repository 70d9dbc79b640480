// Counter-based random numbers: platform independent, no std:: distributions.
//
// draw(seed, stream, i) = mix64(mix64(seed ^ mix64(stream + C)) + i), mix64 = SplitMix64's
// finalizer. A stream is named by a string (FNV-1a 64 of its bytes), so "layer2/w_q_b" gives the
// same numbers on every machine, in any order of generation, and element i never depends on how
// many other elements were drawn.
#pragma once

#include <cstdint>
#include <string_view>

namespace dsv32::rng {

__extension__ typedef unsigned __int128 u128;

/// SplitMix64 finalizer (a bijection of 64-bit words).
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// FNV-1a 64 of a stream name.
constexpr std::uint64_t stream_id(std::string_view name) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

/// One counter-based generator: element i of a named stream under a seed.
class Stream {
 public:
  constexpr Stream(std::uint64_t seed, std::string_view name)
      : key_(mix64(seed ^ mix64(stream_id(name)))) {}
  constexpr Stream(std::uint64_t seed, std::uint64_t stream) : key_(mix64(seed ^ mix64(stream))) {}
  /// Raw 64 random bits of element i.
  constexpr std::uint64_t bits(std::uint64_t i) const { return mix64(key_ + i); }
  /// Uniform in [0, 1) with 53 random bits.
  constexpr double uniform(std::uint64_t i) const {
    return static_cast<double>(bits(i) >> 11) * 0x1p-53;
  }
  /// Uniform in [-1, 1).
  constexpr double symmetric(std::uint64_t i) const { return 2.0 * uniform(i) - 1.0; }
  /// Integer in [0, n) (multiply-shift, bias below 2^-32 for n < 2^32).
  constexpr std::uint64_t below(std::uint64_t i, std::uint64_t n) const {
    return static_cast<std::uint64_t>((static_cast<u128>(bits(i)) * n) >> 64);
  }

 private:
  std::uint64_t key_;
};

}  // namespace dsv32::rng

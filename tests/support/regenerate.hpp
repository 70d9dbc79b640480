// Regenerating the committed goldens and comparing their bytes with the fixtures: shared by
// test_golden (this build) and golden_regen (the oracle built for other instruction sets).
#pragma once

#include <omp.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dsv32/golden/golden.hpp"

namespace dsv32::testing {

inline std::string bytes_of(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

/// One committed case regenerated on `threads` threads.
struct Regeneration {
  std::string name;
  int threads = 0;
  bool identical = false;
  std::filesystem::path got, ref;  // got is kept only where it differs
};

/// The thread counts regenerate_committed runs on: 1 and 2; under AddressSanitizer, whose run
/// is for memory errors (the ci build checks the thread counts), 2 alone, at half the cost.
inline std::vector<int> regeneration_threads() {
#if defined(__SANITIZE_ADDRESS__)
  return {2};
#else
  return {1, 2};
#endif
}

/// Every committed case of the registry regenerated into `out` on each of
/// regeneration_threads() (with the generator attribute of its fixture in `fixtures`) and
/// compared byte for byte with it.
inline std::vector<Regeneration> regenerate_committed(const std::filesystem::path& fixtures,
                                                      const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  std::vector<Regeneration> runs;
  for (const int threads : regeneration_threads()) {
    omp_set_num_threads(threads);
    for (const golden::CaseSpec& spec : golden::registry()) {
      if (!spec.committed) continue;
      Regeneration r{spec.name, threads, false, out / (spec.name + ".h5"),
                     fixtures / (spec.name + ".h5")};
      const golden::GoldenCase committed = golden::read(r.ref.string());
      golden::write(r.got.string(), golden::generate(spec, committed.generator));
      r.identical = bytes_of(r.got) == bytes_of(r.ref);
      if (r.identical) std::filesystem::remove(r.got);
      runs.push_back(std::move(r));
    }
  }
  return runs;
}

}  // namespace dsv32::testing

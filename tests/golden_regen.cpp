// Regenerates every committed golden with the oracle this binary was built with, on 1 thread and
// on 2, and compares the bytes with the fixtures. Usage: golden_regen FIXTURES_DIR OUT_DIR
// (exit 0: all identical, 1: a case differs, 2: bad usage or input).
#include <omp.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/fixed_order.hpp"

namespace {

std::string bytes_of(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FIXTURES_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path fixtures = argv[1], out = argv[2];
  const std::string isa(dsv32::fixed::isa());
  int cases = 0, same = 0;
  try {
    fs::create_directories(out);
    for (const int threads : {1, 2}) {
      omp_set_num_threads(threads);
      for (const dsv32::golden::CaseSpec& spec : dsv32::golden::registry()) {
        if (!spec.committed) continue;
        ++cases;
        const fs::path ref = fixtures / (spec.name + ".h5"), got = out / (spec.name + ".h5");
        const dsv32::golden::GoldenCase committed = dsv32::golden::read(ref.string());
        dsv32::golden::write(got.string(), dsv32::golden::generate(spec, committed.generator));
        const bool equal = bytes_of(got) == bytes_of(ref);
        same += equal;
        std::printf("  %d thread(s)  %-28s %s\n", threads, spec.name.c_str(),
                    equal ? "byte-identical" : "DIFFERS, inspect with:");
        if (equal)
          fs::remove(got);
        else
          std::printf("    dsv32 diff %s %s\n", got.c_str(), ref.c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_regen: %s\n", e.what());
    return 2;
  }
  std::printf(
      "golden_regen: oracle kernels %s, 1 and 2 threads: %d/%d regenerations byte-identical\n",
      isa.c_str(), same, cases);
  return same == cases && cases > 0 ? 0 : 1;
}

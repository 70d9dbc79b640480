// Regenerates every committed golden with the oracle this binary was built with, on 1 thread and
// on 2, and compares the bytes with the fixtures. Usage: golden_regen FIXTURES_DIR OUT_DIR
// (exit 0: all identical, 1: a case differs, 2: bad usage or input).
#include <cstdio>
#include <exception>
#include <string>

#include "dsv32/oracle/fixed_order.hpp"
#include "support/regenerate.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FIXTURES_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  std::vector<dsv32::testing::Regeneration> runs;
  try {
    runs = dsv32::testing::regenerate_committed(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_regen: %s\n", e.what());
    return 2;
  }
  int same = 0;
  for (const dsv32::testing::Regeneration& r : runs) {
    same += r.identical;
    std::printf("  %d thread(s)  %-28s %s\n", r.threads, r.name.c_str(),
                r.identical ? "byte-identical" : "DIFFERS, inspect with:");
    if (!r.identical) std::printf("    dsv32 diff %s %s\n", r.got.c_str(), r.ref.c_str());
  }
  const std::string isa(dsv32::fixed::isa());
  std::printf(
      "golden_regen: oracle kernels %s, 1 and 2 threads: %d/%zu regenerations byte-identical\n",
      isa.c_str(), same, runs.size());
  return same == static_cast<int>(runs.size()) && !runs.empty() ? 0 : 1;
}

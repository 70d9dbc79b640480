// The main of every test binary: binds the process to the GPUs CTest assigned it through
// resource groups (docs/GPU.md, "Spreading the suite over GPUs") before CUDA starts, then runs
// GoogleTest. Without CTEST_RESOURCE_GROUP_COUNT (ctest without a resource spec, or a binary run
// by hand) nothing changes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "replay.hpp"

namespace {

std::string env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? v : "";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

/// The GPU ids CTest assigned (one per resource group, in group order); nullopt and a message on
/// stderr when its variables are malformed.
std::optional<std::vector<int>> assigned_gpus() {
  std::vector<int> ids;
  const std::string count = env("CTEST_RESOURCE_GROUP_COUNT");
  if (count.empty()) return ids;
  int n = -1;
  try {
    n = std::stoi(count);
  } catch (...) {
  }
  if (n < 0) {
    std::fprintf(stderr, "test main: CTEST_RESOURCE_GROUP_COUNT='%s' is not a count\n",
                 count.c_str());
    return std::nullopt;
  }
  for (int g = 0; g < n; ++g) {
    const std::string var = "CTEST_RESOURCE_GROUP_" + std::to_string(g);
    if (env(var) != "gpus") {
      std::fprintf(stderr, "test main: %s='%s': only 'gpus' resources are known\n", var.c_str(),
                   env(var).c_str());
      return std::nullopt;
    }
    // "id:1,slots:2" (one GPU per group: a group's slots come from one resource).
    const std::string spec = env(var + "_GPUS");
    const std::vector<std::string> fields = split(spec, ',');
    if (fields.empty() || fields[0].rfind("id:", 0) != 0 || fields[0].size() == 3) {
      std::fprintf(stderr, "test main: %s_GPUS='%s' is not 'id:N,slots:M'\n", var.c_str(),
                   spec.c_str());
      return std::nullopt;
    }
    try {
      ids.push_back(std::stoi(fields[0].substr(3)));
    } catch (...) {
      std::fprintf(stderr, "test main: %s_GPUS='%s': the id is not a number\n", var.c_str(),
                   spec.c_str());
      return std::nullopt;
    }
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<std::vector<int>> ids = assigned_gpus();
  if (!ids) return 2;
  if (!ids->empty()) {
    // Spec ids count the devices this process would see: map them through a
    // CUDA_VISIBLE_DEVICES the caller set, then show the test only its own.
    const std::vector<std::string> outer = split(env("CUDA_VISIBLE_DEVICES"), ',');
    std::string visible;
    for (int id : *ids) {
      if (!outer.empty() && (id < 0 || id >= static_cast<int>(outer.size()))) {
        std::fprintf(stderr, "test main: CTest assigned GPU %d; CUDA_VISIBLE_DEVICES='%s'\n", id,
                     env("CUDA_VISIBLE_DEVICES").c_str());
        return 2;
      }
      visible += (visible.empty() ? "" : ",") + (outer.empty() ? std::to_string(id) : outer[id]);
    }
    setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
    if (const std::string log = env("DSV32_GPU_BINDING_LOG"); !log.empty()) {
      std::string filter;
      for (int i = 1; i < argc; ++i)
        if (std::string a = argv[i]; a.rfind("--gtest_filter=", 0) == 0) filter = a.substr(15);
      std::ofstream(log, std::ios::app) << "gpus=" << visible << " " << filter << "\n";
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  // --dsv32_replay_lines: each test's ctest name and the replay line its failures print, a tab
  // between (support/replay.hpp); checked against ctest by Tests.EveryReplayLineRunsExactlyItsTest.
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--dsv32_replay_lines") {
      const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
      for (int s = 0; s < unit.total_test_suite_count(); ++s)
        for (int t = 0; t < unit.GetTestSuite(s)->total_test_count(); ++t) {
          const std::string name =
              dsv32::testing::ctest_name(*unit.GetTestSuite(s)->GetTestInfo(t));
          std::printf("%s\t%s\n", name.c_str(), dsv32::testing::replay_line(name).c_str());
        }
      return 0;
    }
  return RUN_ALL_TESTS();
}

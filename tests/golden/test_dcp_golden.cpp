// A golden under decode context parallelism (GOLDEN.md): each rank's block tables and stages
// are written, read back as they were, recomputed from the file's own inputs, and refused by
// name when a rank's part is missing or its tables are not the ranks'.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>

#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32 {
namespace {

namespace fs = std::filesystem;

/// A DCP case: 4 ranks, interleave 2, a prefill, then decodes and a join (every step kind).
golden::CaseSpec dcp_case(DcpIndexerMode mode, DcpTables tables) {
  golden::CaseSpec s;
  s.name = "dcp-test";
  s.cfg = preset("tiny-fs");
  s.cfg.block_size = 4;
  s.cfg.dcp_size = 4;
  s.cfg.dcp_interleave = 2;
  s.cfg.dcp_indexer_mode = mode;
  s.seed = 5;
  s.num_blocks = 48;
  s.dcp_tables = tables;
  s.steps = {{{{0, 30}}, 0, {}}, {{{0, 1}, {1, 6}}, 8, {}}, {{{0, 1}, {1, 1}}, 0, {}}};
  return s;
}

std::string refusal(const std::string& path) {
  try {
    golden::read(path);
  } catch (const h5::GoldenError& e) {
    return e.what();
  }
  return "";
}

void edit(const std::string& path, const std::function<void(hid_t)>& f) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  f(file);
  H5Fclose(file);
}

/// "" when two DCP layer traces hold the same values (NaN never equal).
std::string same_ranks(const DcpLayerTrace& a, const DcpLayerTrace& b) {
  if (a.rows.size() != b.rows.size()) return "rank counts differ";
  for (std::size_t r = 0; r < a.rows.size(); ++r) {
    if (a.rows[r] != b.rows[r]) return "rank " + std::to_string(r) + " topk";
    if (a.share[r] != b.share[r]) return "rank " + std::to_string(r) + " share";
    if (a.olat[r] != b.olat[r]) return "rank " + std::to_string(r) + " olat";
    if (a.lse[r] != b.lse[r]) return "rank " + std::to_string(r) + " lse";
  }
  return "";
}

TEST(DcpGolden, EveryRanksPartIsWrittenReadBackAndRecomputed) {
  const fs::path dir = fs::temp_directory_path() / "dsv32-dcp-golden";
  fs::create_directories(dir);
  for (const DcpIndexerMode mode : {DcpIndexerMode::exact, DcpIndexerMode::union_})
    for (const DcpTables tables : {DcpTables::shared, DcpTables::distinct}) {
      const std::string what =
          std::string(to_string(mode)) + (tables == DcpTables::shared ? " shared" : " distinct");
      const golden::GoldenCase gen = golden::generate(dcp_case(mode, tables), "test");
      const std::string path = (dir / "dcp.h5").string();
      golden::write(path, gen);
      const golden::GoldenCase got = golden::read(path);
      EXPECT_EQ(got.cfg, gen.cfg) << what;
      ASSERT_EQ(got.steps.size(), gen.steps.size());
      const auto [t0, t1] = golden::recompute(got);
      for (std::size_t s = 0; s < gen.steps.size(); ++s) {
        EXPECT_EQ(got.steps[s].dcp_tables, gen.steps[s].dcp_tables) << what << " step " << s;
        for (int l = 0; l < gen.cfg.num_layers; ++l) {
          const auto where = what + " step " + std::to_string(s) + " layer " + std::to_string(l);
          EXPECT_EQ(same_ranks(*got.expected[s].layers[l].dcp, *gen.expected[s].layers[l].dcp), "")
              << where;
          EXPECT_EQ(same_ranks(*t0[s].layers[l].dcp, *gen.expected[s].layers[l].dcp), "") << where;
          // T1 as stored (its storage dtypes) is T1 recomputed from the file.
          EXPECT_EQ(same_ranks(*t1[s].layers[l].dcp, *got.emulated[s].layers[l].dcp), "") << where;
          // T1 follows T0's rows on every rank (union: each rank its own).
          EXPECT_EQ(gen.emulated[s].layers[l].dcp->rows, gen.expected[s].layers[l].dcp->rows)
              << where;
        }
      }
      for (const StageDiff& d : diff_traces(got.cfg, got.expected, t0, t1))
        EXPECT_EQ(d.result.max_err, 0.0) << what << " " << d.where();
      // An empty rank's lse is stored as -inf, and read back.
      bool empty_seen = false;
      for (const StepTrace& st : got.expected)
        for (const LayerTrace& lt : st.layers)
          for (std::size_t r = 0; r < lt.dcp->share.size(); ++r)
            for (Eigen::Index t = 0; t < lt.dcp->share[r].rows(); ++t)
              if (lt.dcp->share[r](t, 0) < 0) {
                empty_seen = true;
                EXPECT_EQ(lt.dcp->lse[r](t, 0), -INFINITY) << what;
              }
      EXPECT_TRUE(empty_seen) << what << ": the case has a rank owning nothing of a row";
    }
  fs::remove_all(dir);
}

TEST(DcpGolden, AMissingRankOrATableOfAnotherRequestIsRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "dsv32-dcp-golden-bad";
  fs::create_directories(dir);
  const std::string path = (dir / "dcp.h5").string();
  const golden::GoldenCase gen =
      golden::generate(dcp_case(DcpIndexerMode::exact, DcpTables::shared), "test");
  golden::write(path, gen);
  ASSERT_EQ(refusal(path), "");
  edit(path, [](hid_t f) { H5Ldelete(f, "steps/step1/expected/layer0/rank3", H5P_DEFAULT); });
  EXPECT_NE(refusal(path).find("/steps/step1/expected/layer0/rank3: missing group"),
            std::string::npos)
      << refusal(path);
  golden::write(path, gen);
  edit(path, [](hid_t f) { H5Ldelete(f, "steps/step2/inputs/rank1", H5P_DEFAULT); });
  EXPECT_NE(refusal(path).find("/steps/step2/inputs/rank1: missing group"), std::string::npos)
      << refusal(path);
  // Rank 2's table of request 1 made request 0's: two requests in one block.
  golden::GoldenCase bad = gen;
  bad.steps[2].dcp_tables[2][1] = bad.steps[2].dcp_tables[2][0];
  golden::write(path, bad, {}, false);
  EXPECT_NE(refusal(path).find("rank 2 request 1: block id"), std::string::npos) << refusal(path);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsv32

// `judge` of a DCP candidate read from a file: a golden's own T1 with its ranks passes, its ranks
// judged; a candidate whose LSEs are in base 2 passes when its file says so and fails, naming
// the base, when it does not; a candidate giving only its merge is judged on the merge.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>

#include "dsv32/golden/golden.hpp"
#include "dsv32/judge/judge.hpp"

namespace dsv32 {
namespace {

namespace fs = std::filesystem;

golden::CaseSpec dcp_case() {
  golden::CaseSpec s;
  s.name = "dcp-judge";
  s.cfg = preset("tiny-fs");
  s.cfg.block_size = 4;
  s.cfg.dcp_size = 2;
  s.cfg.dcp_interleave = 4;
  s.seed = 9;
  s.num_blocks = 40;
  s.dcp_tables = DcpTables::distinct;
  s.steps = {{{{0, 24}}, 0, {}}, {{{0, 1}, {1, 5}}, 8, {}}};
  return s;
}

/// A candidate file of `gc` whose expected traces are `cand` (the golden layout), with root
/// attribute lse_base = `base` when given.
std::string candidate(const fs::path& dir, golden::GoldenCase gc, std::vector<StepTrace> cand,
                      const std::string& base = "") {
  const std::string path = (dir / "cand.h5").string();
  fs::remove(path);
  gc.expected = std::move(cand);
  golden::write(path, gc, {}, /*verify=*/false);
  if (!base.empty()) {
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, base.size());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, "lse_base", type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, base.c_str());
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
    H5Fclose(f);
  }
  return path;
}

Judgement judge_file(const golden::GoldenCase& gc, const std::string& path) {
  const std::vector<StepTrace> cand = golden::read_candidate(path, gc);
  return judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks, gc.steps, cand,
               1, /*partial=*/true, golden::read_candidate_lse_base(path));
}

std::string all(const Judgement& j) {
  std::string s;
  for (const std::string& f : j.failures) s += f + "\n";
  return s;
}

TEST(JudgeDcp, RanksFromAFileAreJudgedAndTheirLseBaseIsTheFilesWord) {
  const fs::path dir = fs::temp_directory_path() / "dsv32-judge-dcp";
  fs::create_directories(dir);
  const golden::GoldenCase gc = golden::generate(dcp_case(), "test");
  // A candidate as an implementation runs: the emulated oracle choosing its own sets.
  std::vector<StepTrace> t1;
  Oracle own(gc.cfg, std::make_shared<const Weights>(gc.weights), Mode::emulated, gc.num_blocks);
  for (const StepInput& in : gc.steps) t1.push_back(own.step(in));

  const Judgement ok = judge_file(gc, candidate(dir, gc, t1));
  EXPECT_TRUE(ok.failures.empty()) << all(ok);
  int rank_rows = 0;
  for (const Judgement::Row& r : ok.rows) rank_rows += r.stage.starts_with("rank") ? 1 : 0;
  EXPECT_EQ(rank_rows, 2 * gc.cfg.num_layers * 2 * 4) << "steps x layers x ranks x stages";

  std::vector<StepTrace> base2 = t1;
  for (StepTrace& st : base2)
    for (LayerTrace& lt : st.layers)
      for (Mat& lse : lt.dcp->lse) lse /= std::log(2.0);
  const Judgement wrong = judge_file(gc, candidate(dir, gc, base2));
  EXPECT_NE(all(wrong).find("base 2 judged as natural log"), std::string::npos) << all(wrong);
  EXPECT_NE(all(wrong).find("(op sparse_mqa)"), std::string::npos) << all(wrong);
  const Judgement said = judge_file(gc, candidate(dir, gc, base2, "2"));
  EXPECT_TRUE(said.failures.empty()) << all(said);
  try {
    golden::read_candidate_lse_base(candidate(dir, gc, t1, "10"));
    ADD_FAILURE() << "lse_base 10 accepted";
  } catch (const h5::GoldenError& e) {
    EXPECT_NE(std::string(e.what()).find("lse_base = '10'"), std::string::npos) << e.what();
  }

  std::vector<StepTrace> merge_only = t1;
  for (StepTrace& st : merge_only)
    for (LayerTrace& lt : st.layers) lt.dcp.reset();
  const Judgement merged = judge_file(gc, candidate(dir, gc, merge_only));
  EXPECT_TRUE(merged.failures.empty()) << all(merged);
  for (const Judgement::Row& r : merged.rows) EXPECT_FALSE(r.stage.starts_with("rank"));
  fs::remove_all(dir);
}

TEST(JudgeDcp, UnionRowsAreEachRanksOwnTopkOfTheKeysItOwns) {
  const fs::path dir = fs::temp_directory_path() / "dsv32-judge-dcp-union";
  fs::create_directories(dir);
  golden::CaseSpec spec = dcp_case();
  spec.cfg.dcp_indexer_mode = DcpIndexerMode::union_;
  const golden::GoldenCase gc = golden::generate(spec, "test");
  std::vector<StepTrace> own;
  Oracle o(gc.cfg, std::make_shared<const Weights>(gc.weights), Mode::emulated, gc.num_blocks);
  for (const StepInput& in : gc.steps) own.push_back(o.step(in));
  const Judgement ok = judge_file(gc, candidate(dir, gc, own));
  EXPECT_TRUE(ok.failures.empty()) << all(ok);
  EXPECT_GT(ok.topk_rows, 0);
  // Rank 1 attends a key of rank 0 in the prefill's last row (past K on both ranks).
  std::vector<StepTrace> stray = own;
  const int t = gc.steps[0].num_tokens - 1;
  IndexRows& r1 = stray[0].layers[0].dcp->rows[1];
  const IndexRows& r0 = stray[0].layers[0].dcp->rows[0];
  ASSERT_GE(r1(t, gc.cfg.index_topk - 1), 0);
  r1(t, 0) = r0(t, 0);
  const Judgement bad = judge_file(gc, candidate(dir, gc, stray));
  EXPECT_NE(all(bad).find("rank 1 (union"), std::string::npos) << all(bad);
  EXPECT_NE(all(bad).find("is not rank 1's"), std::string::npos) << all(bad);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsv32

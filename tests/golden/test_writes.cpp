// Outputs whole or not at all when writers share a path or a directory or are one run's, no two
// outputs on one path, and no golden written that its own reader would refuse
// (docs/BAD_INPUT.md, "Writes").
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/golden/h5.hpp"
#include "outputs.hpp"
#include "support/golden_cases.hpp"

namespace dsv32 {
namespace {

namespace fs = std::filesystem;

class Writes : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsv32-writes-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string bytes_of(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

// Two writers of one path once shared NAME.tmp: one could rename the other's half-written file
// into place. Each now renames its own whole file, so the result is one writer's bytes.
TEST_F(Writes, TwoWritersOfOnePathLeaveOneWritersWholeFile) {
  const std::string path = (dir_ / "shared.bin").string();
  const std::string a(std::size_t{4} << 20, 'a'), b(std::size_t{3} << 20, 'b');
  for (int round = 0; round < 10; ++round) {
    std::thread ta([&] { files::write_atomically(path, a); });
    std::thread tb([&] { files::write_atomically(path, b); });
    ta.join();
    tb.join();
    const std::string got = bytes_of(path);
    ASSERT_TRUE(got == a || got == b) << "round " << round << ": " << got.size() << " bytes";
    ASSERT_EQ(names(), std::vector<std::string>{"shared.bin"});
  }
}

// What a SIGKILL leaves (a temporary of a writer that no longer runs) is removed by the next
// write of that path; a live writer's temporary is not.
TEST_F(Writes, AKilledWritersTemporaryIsRemovedByTheNextWrite) {
  const std::string path = (dir_ / "x.json").string();
  const std::string dead = "x.json.2147483646-0.tmp";  // above Linux's largest pid_max
  const std::string live = "x.json." + std::to_string(::getpid()) + "-999.tmp";
  std::ofstream(dir_ / dead) << "stale";
  std::ofstream(dir_ / live) << "in progress";
  std::ofstream(dir_ / "x.json.notes.tmp") << "not ours";
  files::write_atomically(path, "{}\n");
  EXPECT_EQ(names(), (std::vector<std::string>{"x.json", live, "x.json.notes.tmp"}));
}

TEST_F(Writes, AFailedVerificationLeavesNothing) {
  const std::string path = (dir_ / "v.bin").string();
  std::string seen;
  EXPECT_THROW(files::write_atomically(path, "bytes", {},
                                       [&](const std::string& tmp) {
                                         seen = bytes_of(tmp);
                                         throw std::runtime_error("refused");
                                       }),
               std::runtime_error);
  EXPECT_EQ(seen, "bytes") << "verify saw the whole temporary file";
  EXPECT_TRUE(names().empty());
}

// A golden the reader refuses (here: more cache blocks than its bound) is not written.
TEST_F(Writes, AGoldenItsOwnReaderRefusesIsNotWritten) {
  golden::GoldenCase gc = golden::read(testing::fixture("default"));
  gc.num_blocks = golden::ReadLimits{}.max_num_blocks + 1;
  const std::string path = (dir_ / "default.h5").string();
  try {
    golden::write(path, gc);
    FAIL() << "a golden over the reader's bound was written";
  } catch (const h5::GoldenError& e) {
    EXPECT_NE(std::string(e.what()).find("not written: its own reader refuses it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(names().empty());
}

// The lock serialises whoever holds it: a second holder waits for the first to let go.
TEST_F(Writes, ADirectoryLockIsExclusive) {
  std::vector<int> order;
  std::mutex m;
  std::thread second;
  {
    const files::DirectoryLock first(dir_.string());
    second = std::thread([&] {
      const files::DirectoryLock lock(dir_.string());
      const std::lock_guard g(m);
      order.push_back(2);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::lock_guard g(m);
    order.push_back(1);
  }
  second.join();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_TRUE(names().empty()) << "the lock leaves no file";
  EXPECT_THROW(files::DirectoryLock((dir_ / "missing").string()), files::WriteError);
}

// A run's outputs are whole or not at all (dsv32 golden once left its first cases' files when a
// later one failed): nothing takes its name before commit(), a set dropped uncommitted leaves
// nothing, and a commit that fails part-way puts back every file it had replaced.
TEST_F(Writes, StagedFilesAreAllWrittenOrNone) {
  const std::string a = (dir_ / "a.h5").string(), b = (dir_ / "b.json").string();
  std::ofstream(a) << "old a";
  {
    files::StagedFiles run;
    const files::StagedFiles::File f = run.add(a, "new a");
    EXPECT_EQ(f.bytes, 5u);
    EXPECT_EQ(f.fnv1a64, files::fnv1a64("new a"));
    run.add(b, "new b");
    EXPECT_EQ(bytes_of(a), "old a") << "renamed before commit";
    EXPECT_FALSE(fs::exists(b));
    EXPECT_THROW(run.add((dir_ / "." / "b.json").string(), "again"), files::WriteError);
  }  // dropped: nothing of it is left
  EXPECT_EQ(names(), std::vector<std::string>{"a.h5"});
  EXPECT_EQ(bytes_of(a), "old a");
  {
    files::StagedFiles run;
    run.add(a, "new a");
    run.add(b, "new b");
    fs::create_directory(b);  // the second rename fails: the first is undone
    EXPECT_THROW(run.commit(), files::WriteError);
  }
  EXPECT_EQ(names(), (std::vector<std::string>{"a.h5", "b.json"}));
  EXPECT_EQ(bytes_of(a), "old a");
  EXPECT_TRUE(fs::is_directory(b));
  fs::remove(b);
  files::StagedFiles run;
  run.add(a, "new a");
  run.add(b, "new b");
  run.commit();
  EXPECT_EQ(bytes_of(a), "new a");
  EXPECT_EQ(bytes_of(b), "new b");
  EXPECT_EQ(names(), (std::vector<std::string>{"a.h5", "b.json"}));
}

// No two outputs on one path, none over an input, compared as paths also before the files
// exist (`dsv32 gpu G --json F --dump F` once passed a check that compared existing files).
TEST_F(Writes, OutputsThatCollideAreNamed) {
  using tools::output_clash;
  const std::string in = (dir_ / "in.h5").string(), out = (dir_ / "out.h5").string();
  std::ofstream(in) << "golden";
  const std::string sub = (dir_ / "sub").string();
  fs::create_directory(sub);
  fs::create_directory_symlink(sub, dir_ / "via");
  EXPECT_EQ(output_clash({{"--json", out}, {"--dump", (dir_ / "other.h5").string()}},
                         {{"the golden", in}}),
            "");
  EXPECT_EQ(output_clash({{"--json", ""}, {"--dump", ""}}, {{"the golden", in}}), "");
  for (const std::string& twin :
       {out, (dir_ / "." / "out.h5").string(), (dir_ / "sub" / ".." / "out.h5").string()}) {
    const std::string why = output_clash({{"--json", out}, {"--dump", twin}}, {});
    EXPECT_NE(why.find("--dump " + twin + " and --json " + out + " name one file"),
              std::string::npos)
        << why;
  }
  EXPECT_NE(output_clash({{"--json", (dir_ / "sub" / "x").string()},
                          {"--dump", (dir_ / "via" / "x").string()}},
                         {})
                .find("name one file"),
            std::string::npos)
      << "a link to a directory on the way";
  fs::create_hard_link(in, dir_ / "hard.h5");
  for (const std::string& same :
       {in, (dir_ / "hard.h5").string(), (dir_ / "sub" / ".." / "in.h5").string()})
    EXPECT_NE(output_clash({{"--json", same}}, {{"the golden", in}}).find("is also an input"),
              std::string::npos)
        << same;
  EXPECT_FALSE(fs::exists(out)) << "the check writes nothing";
}

}  // namespace
}  // namespace dsv32

#include <gtest/gtest.h>
#include <hdf5.h>

#include <sys/wait.h>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/trace_diff.hpp"
#include "support/golden_cases.hpp"
#include "support/regenerate.hpp"

namespace dsv32 {
namespace {

using testing::bytes_of;
using testing::fixture;

namespace fs = std::filesystem;

/// A scratch directory per test, removed afterwards.
class GoldenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsv32-golden-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  /// A copy of the default fixture to tamper with.
  std::string copy_of_default() {
    const std::string p = (dir_ / "copy.h5").string();
    fs::copy_file(fixture("default"), p);
    return p;
  }
  /// The message golden::read throws for `path`, or "" when it accepts the file.
  static std::string refusal(const std::string& path) {
    try {
      golden::read(path);
    } catch (const h5::GoldenError& e) {
      return e.what();
    }
    return "";
  }
  /// The temporary files (NAME.PID-N.tmp) left in the test's directory.
  std::vector<std::string> temporaries() const {
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().extension() == ".tmp") left.push_back(e.path().filename().string());
    return left;
  }
  fs::path dir_;
};

/// Opens a file read-write with the raw C API, runs `fn(file id)`, closes it.
template <class F>
void tamper(const std::string& path, F&& fn) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  fn(f);
  H5Fclose(f);
}

/// Rewrites one float64 dataset of a file in place: fn edits its values.
template <class F>
void edit_doubles(const std::string& path, const char* dataset, F&& fn) {
  tamper(path, [&](hid_t f) {
    const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
    const hid_t sp = H5Dget_space(d);
    std::vector<double> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp)));
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    fn(v);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(sp);
    H5Dclose(d);
  });
}

void set_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Adelete(obj, name);
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  const hid_t sp = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  const char* p = value.c_str();
  H5Awrite(a, t, &p);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
}

/// Where the committed goldens' bits are promised (docs/DETERMINISM.md).
#if defined(__x86_64__)
#define DSV32_SKIP_UNLESS_BITS_PROMISED()
#else
#define DSV32_SKIP_UNLESS_BITS_PROMISED()                                                  \
  GTEST_SKIP()                                                                             \
      << "the committed goldens' bits are promised on x86-64 only (docs/DETERMINISM.md); " \
         "here they are checked within gates by selfcheck and the GPU tests"
#endif

// On one thread and on two: the oracle's bits depend on neither (nor on the instruction set:
// Golden.SameBytesFromTheOracleBuiltFor_* run the same check with other builds).
TEST(Golden, RegeneratedFixturesAreByteIdentical) {
  DSV32_SKIP_UNLESS_BITS_PROMISED();
  const fs::path dir = fs::temp_directory_path() / "dsv32-regen";
  const std::vector<testing::Regeneration> runs =
      testing::regenerate_committed(DSV32_FIXTURES_DIR, dir);
  for (const testing::Regeneration& r : runs)
    EXPECT_TRUE(r.identical) << r.name << " on " << r.threads << " thread(s): regenerated file "
                             << "differs from the committed fixture (oracle drift?); inspect "
                             << "with: dsv32 diff " << r.got << " " << r.ref;
  fs::remove_all(dir);
  std::size_t committed = 0;
  for (const golden::CaseSpec& spec : golden::registry()) committed += spec.committed ? 1 : 0;
  EXPECT_GE(committed, 18u);
  EXPECT_EQ(runs.size(), committed * testing::regeneration_threads().size());
}

TEST(Golden, ReadBackEqualsWhatWasGenerated) {
  DSV32_SKIP_UNLESS_BITS_PROMISED();
  const golden::CaseSpec& spec = golden::find_case("mixed");
  const golden::GoldenCase gen = golden::generate(spec, "test");
  const golden::GoldenCase got = golden::read(fixture("mixed"));
  EXPECT_EQ(got.cfg, spec.cfg);
  ASSERT_EQ(got.steps.size(), gen.steps.size());
  const std::vector<StageDiff> d = diff_traces(spec.cfg, got.expected, gen.expected, gen.emulated);
  for (const StageDiff& s : d) EXPECT_EQ(s.result.max_err, 0.0) << s.where();
  for (std::size_t s = 0; s < gen.steps.size(); ++s) {
    EXPECT_EQ(got.steps[s].positions, gen.steps[s].positions);
    EXPECT_EQ(got.steps[s].slots, gen.steps[s].slots);
    EXPECT_EQ(got.steps[s].capture_size, gen.steps[s].capture_size);
  }
  EXPECT_EQ(got.weights.layers[1].w_kv_b, gen.weights.layers[1].w_kv_b);
}

TEST_F(GoldenFiles, MissingFileIsRefused) {
  EXPECT_NE(refusal((dir_ / "nope.h5").string()).find("no such file"), std::string::npos);
}

TEST_F(GoldenFiles, TruncatedFileIsRefused) {
  const std::string p = copy_of_default();
  fs::resize_file(p, fs::file_size(p) / 2);
  EXPECT_FALSE(refusal(p).empty());
  fs::resize_file(p, 100);
  EXPECT_NE(refusal(p).find("not a readable HDF5 file"), std::string::npos);
}

TEST_F(GoldenFiles, WrongSchemaOrVersionIsRefused) {
  std::string p = copy_of_default();
  tamper(p, [](hid_t f) { set_string_attr(f, "schema", "something-else"); });
  EXPECT_NE(refusal(p).find("schema 'something-else'"), std::string::npos);
  fs::remove(p);
  p = copy_of_default();
  tamper(p, [](hid_t f) {
    H5Adelete(f, "schema_version");
    const hid_t sp = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, "schema_version", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    const long long v = 99;
    H5Awrite(a, H5T_NATIVE_LLONG, &v);
    H5Aclose(a);
    H5Sclose(sp);
  });
  EXPECT_NE(refusal(p).find("schema_version 99"), std::string::npos);
}

TEST_F(GoldenFiles, MissingConfigKeyIsRefused) {
  const std::string p = copy_of_default();
  tamper(p, [](hid_t f) {
    std::string cfg = golden::config_to_json(preset("tiny-fs"));
    cfg.replace(cfg.find("\"index_topk\""), std::string("\"index_topk\"").size(), "\"index_topq\"");
    set_string_attr(f, "config", cfg);
  });
  EXPECT_NE(refusal(p).find("missing key 'index_topk'"), std::string::npos);
}

TEST_F(GoldenFiles, MissingDatasetIsRefusedByName) {
  const std::string p = copy_of_default();
  tamper(p, [](hid_t f) { H5Ldelete(f, "steps/step1/expected/layer2/olat", H5P_DEFAULT); });
  const std::string why = refusal(p);
  EXPECT_NE(why.find("/steps/step1/expected/layer2/olat: missing dataset"), std::string::npos)
      << why;
}

TEST_F(GoldenFiles, WrongShapeIsRefusedByName) {
  const std::string p = copy_of_default();
  tamper(p, [](hid_t f) {
    H5Ldelete(f, "weights/layer0/g_q", H5P_DEFAULT);
    const hsize_t n = 7;
    const hid_t sp = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(f, "weights/layer0/g_q", H5T_STD_U16LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT);
    const std::uint16_t z[7] = {};
    H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, z);
    set_string_attr(d, "dtype", "bfloat16");
    H5Dclose(d);
    H5Sclose(sp);
  });
  const std::string why = refusal(p);
  EXPECT_NE(why.find("/weights/layer0/g_q: shape [7], expected [48]"), std::string::npos) << why;
}

TEST_F(GoldenFiles, WrongDtypeIsRefusedByName) {
  const std::string p = copy_of_default();
  tamper(p, [](hid_t f) {
    const hid_t d = H5Dopen2(f, "steps/step0/emulated/layer0/o", H5P_DEFAULT);
    set_string_attr(d, "dtype", "float32");
    H5Dclose(d);
  });
  const std::string why = refusal(p);
  EXPECT_NE(why.find("/steps/step0/emulated/layer0/o: stored type does not match dtype float32"),
            std::string::npos)
      << why;
}

/// Replaces a bfloat16 dataset (uint16 bits) by a float64 one of the same values, `fn` editing
/// them first, with attribute dtype float64: another tool's way of writing the same tensor.
template <class F>
void bf16_as_float64(const std::string& path, const char* dataset, F&& fn) {
  tamper(path, [&](hid_t f) {
    const hid_t d = H5Dopen2(f, dataset, H5P_DEFAULT);
    const hid_t sp = H5Dget_space(d);
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp)));
    H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, bits.data());
    H5Dclose(d);
    H5Ldelete(f, dataset, H5P_DEFAULT);
    std::vector<double> v(bits.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = bf16_value(bits[i]);
    fn(v);
    const hid_t n =
        H5Dcreate2(f, dataset, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(n, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    set_string_attr(n, "dtype", "float64");
    H5Dclose(n);
    H5Sclose(sp);
  });
}

TEST_F(GoldenFiles, AnotherDtypeIsReadWhereItsValuesAreExact) {
  const std::string p = copy_of_default();
  bf16_as_float64(p, "steps/step0/inputs/hidden", [](std::vector<double>&) {});
  bf16_as_float64(p, "weights/layer0/w_o", [](std::vector<double>&) {});
  const golden::GoldenCase got = golden::read(p);
  const golden::GoldenCase want = golden::read(fixture("default"));
  EXPECT_TRUE(got.steps.front().hidden.topRows(want.steps.front().num_tokens) ==
              want.steps.front().hidden.topRows(want.steps.front().num_tokens));
  EXPECT_TRUE(got.weights.layers.front().w_o == want.weights.layers.front().w_o);
}

TEST_F(GoldenFiles, AnotherDtypeWhoseValuesAreNotExactIsRefusedByName) {
  const std::string p = copy_of_default();
  bf16_as_float64(p, "steps/step0/inputs/hidden", [](std::vector<double>& v) { v[3] += 1e-9; });
  const std::string why = refusal(p);
  EXPECT_NE(why.find("/steps/step0/inputs/hidden: dtype float64, expected bfloat16, and the value "
                     "at (0, 3) is not exactly a bfloat16 value"),
            std::string::npos)
      << why;
}

TEST_F(GoldenFiles, NanInExpectedIsRefusedByName) {
  const std::string p = copy_of_default();
  edit_doubles(p, "steps/step2/expected/layer1/y",
               [](std::vector<double>& v) { v[65] = std::nan(""); });
  const std::string why = refusal(p);
  EXPECT_NE(why.find("/steps/step2/expected/layer1/y: NaN at (1, 1)"), std::string::npos) << why;
}

TEST_F(GoldenFiles, DiffNamesThePerturbedStage) {
  const golden::GoldenCase ref = golden::read(fixture("default"));
  golden::GoldenCase bad = ref;
  Tensor& olat = const_cast<Tensor&>(bad.expected[2].layers[1].at("olat"));
  olat.data[40] += 0.25;
  const std::vector<StageDiff> self =
      diff_traces(ref.cfg, ref.expected, ref.expected, ref.emulated);
  for (const StageDiff& s : self) EXPECT_EQ(s.result.max_err, 0.0) << s.where();
  const std::vector<StageDiff> d = diff_traces(ref.cfg, bad.expected, ref.expected, ref.emulated);
  const auto first =
      std::find_if(d.begin(), d.end(), [](const StageDiff& s) { return !s.result.pass; });
  ASSERT_NE(first, d.end());
  EXPECT_EQ(first->where(), "step2/layer1/olat");
  EXPECT_EQ(stage_op(first->stage), "sparse_mqa");
  EXPECT_EQ(first->result.first_bad, 40);
  EXPECT_EQ(std::count_if(d.begin(), d.end(), [](const StageDiff& s) { return !s.result.pass; }),
            1);
}

TEST_F(GoldenFiles, DiffCommandExitCodes) {
  const std::string tool = DSV32_TOOL;
  const std::string fx = fixture("default");
  EXPECT_EQ(WEXITSTATUS(std::system((tool + " diff " + fx + " " + fx + " >/dev/null").c_str())), 0);
  const std::string p = copy_of_default();
  edit_doubles(p, "steps/step3/expected/layer2/kR", [](std::vector<double>& v) { v[3] = -v[3]; });
  const std::string log = (dir_ / "diff.txt").string();
  EXPECT_EQ(WEXITSTATUS(std::system((tool + " diff " + p + " " + fx + " > " + log).c_str())), 1);
  EXPECT_NE(bytes_of(log).find("first divergent stage: step3/layer2/kR (op norm_rope_cache)"),
            std::string::npos)
      << bytes_of(log);
  fs::resize_file(p, 64);
  EXPECT_EQ(WEXITSTATUS(std::system((tool + " diff " + p + " " + fx + " 2>/dev/null").c_str())), 2);
}

TEST_F(GoldenFiles, InterruptedWriterLeavesNoFinalFile) {
  const std::string tool = DSV32_TOOL;
  const std::string cmd = "DSV32_GOLDEN_ABORT_AFTER=40 " + tool + " golden --case mixed --out " +
                          dir_.string() + " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  EXPECT_FALSE(fs::exists(dir_ / "mixed.h5"));
  EXPECT_TRUE(temporaries().empty());  // built in memory: nothing on disk yet
  EXPECT_EQ(
      WEXITSTATUS(std::system(
          (tool + " golden --case mixed --out " + dir_.string() + " >/dev/null 2>&1").c_str())),
      0);
  EXPECT_NO_THROW(golden::read((dir_ / "mixed.h5").string()));
}

// Regenerating data that did not change keeps the file as it was (its generator attribute
// names the revision that wrote the data), so the README's fixture command leaves git clean;
// data that changed is written anew, with this build's generator.
TEST_F(GoldenFiles, RegeneratingUnchangedDataKeepsTheFileAsItWas) {
  const std::string tool = DSV32_TOOL, path = (dir_ / "kv-fp8.h5").string();
  fs::copy_file(fixture("kv-fp8"), path);
  const std::string log = (dir_ / "log.txt").string();
  const std::string cmd = tool + " golden --case kv-fp8 --out " + dir_.string() + " > " + log;
  ASSERT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
  EXPECT_EQ(bytes_of(path), bytes_of(fixture("kv-fp8")));
  EXPECT_NE(bytes_of(log).find("unchanged"), std::string::npos) << bytes_of(log);
  edit_doubles(path, "steps/step1/expected/layer0/o", [](std::vector<double>& v) { v[0] += 1; });
  ASSERT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0);
  const golden::GoldenCase again = golden::read(path), committed = golden::read(fixture("kv-fp8"));
  EXPECT_EQ(again.expected[1].layers[0].at("o").data, committed.expected[1].layers[0].at("o").data);
  EXPECT_NE(again.generator, committed.generator);
  EXPECT_EQ(bytes_of(log).find("unchanged"), std::string::npos) << bytes_of(log);
}

TEST_F(GoldenFiles, ASignalWhileWritingRemovesTheTemporaryFile) {
  // A child writes 64 MiB and is sent SIGTERM after its first chunk: the handler removes the
  // temporary file, then the process ends by the signal.
  const std::string path = (dir_ / "big.bin").string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    files::install_signal_cleanup();
    const std::string bytes(std::size_t{64} << 20, 'x');
    files::write_atomically(path, bytes, [](std::size_t, std::size_t) { std::raise(SIGTERM); });
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(temporaries().empty());
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(GoldenFiles, AWriteIntoAMissingDirectoryNamesItAndLeavesNothing) {
  const std::string path = (dir_ / "no-such-dir" / "x.json").string();
  try {
    files::write_atomically(path, "{}\n");
    FAIL() << "wrote into a missing directory";
  } catch (const files::WriteError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir/x.json."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".tmp: cannot create"), std::string::npos) << e.what();
  }
  EXPECT_THROW(files::require_writable_location(path), files::WriteError);
  EXPECT_THROW(files::require_writable_location(dir_.string()), files::WriteError);  // a dir
}

TEST_F(GoldenFiles, ACrashOrRefusalInsideTheReaderIsContained) {
  const std::string p = copy_of_default();
  try {
    h5::contain(
        p, [] { std::raise(SIGSEGV); }, 1 << 30);
    FAIL() << "a crash in the child was not reported";
  } catch (const h5::GoldenError& e) {
    // "(Segmentation fault)", or a sanitizer's exit status where one catches the fault first.
    EXPECT_NE(std::string(e.what()).find("the HDF5 library crashed ("), std::string::npos)
        << e.what();
  }
  try {
    h5::contain(
        p, [] { throw h5::GoldenError("x.h5:/steps: what the child said"); }, 1 << 30);
    FAIL() << "a refusal in the child was not reported";
  } catch (const h5::GoldenError& e) {
    EXPECT_STREQ(e.what(), "x.h5:/steps: what the child said");
  }
  // A message longer than a pipe holds once blocked the child, whose silence was then
  // reported as a hang in the library.
  try {
    h5::contain(
        p, [] { throw h5::GoldenError("x.h5: " + std::string(1 << 20, 'm')); }, 1 << 30);
    FAIL() << "a long refusal in the child was not reported";
  } catch (const h5::GoldenError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("x.h5: mmm", 0), 0u) << std::string(e.what(), 80);
  }
#if !defined(__SANITIZE_ADDRESS__)
  try {
    h5::contain(
        p, [] { std::vector<char> v(std::size_t{1} << 36, 1); }, 1 << 20);
    FAIL() << "an allocation past the bound was not reported";
  } catch (const h5::GoldenError& e) {
    EXPECT_NE(std::string(e.what()).find("memory bound"), std::string::npos) << e.what();
  }
#endif
  EXPECT_NO_THROW(h5::contain(
      p, [&] { golden::read(p); }, 1 << 30));
}

TEST_F(GoldenFiles, InfInExpectedIsRefusedByName) {
  const std::string p = copy_of_default();
  edit_doubles(p, "steps/step1/expected/layer0/lse",
               [](std::vector<double>& v) { v[2] = -std::numeric_limits<double>::infinity(); });
  EXPECT_NE(refusal(p).find("/steps/step1/expected/layer0/lse: -Inf at (0, 2)"), std::string::npos)
      << refusal(p);
}

TEST(GoldenConfig, JsonRoundTripsEveryPreset) {
  for (const std::string& name : preset_names()) {
    const Config c = preset(name);
    EXPECT_EQ(golden::config_from_json(golden::config_to_json(c)), c) << name;
    // DCP's keys appear only under DCP, so files without it keep their bytes.
    EXPECT_EQ(golden::config_to_json(c).find("dcp"), std::string::npos) << name;
  }
  Config dcp = preset("tiny");
  dcp.block_size = 64;
  dcp.dcp_size = 8;
  dcp.dcp_interleave = 64;
  dcp.dcp_indexer_mode = DcpIndexerMode::union_;
  EXPECT_EQ(golden::config_from_json(golden::config_to_json(dcp)), dcp);
  EXPECT_THROW(golden::config_from_json("{"), h5::GoldenError);
}

}  // namespace
}  // namespace dsv32

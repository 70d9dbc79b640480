// `dsv32 golden`: list and generate golden files from the case registry; check any golden file
// against this oracle.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "dsv32/golden/case_file.hpp"
#include "dsv32/golden/files.hpp"
#include "dsv32/golden/golden.hpp"
#include "dsv32/golden/json_text.hpp"
#include "dsv32/judge/judge.hpp"
#include "report.hpp"
#include "version.hpp"

namespace dsv32::tools {
namespace {

struct GoldenOptions {
  bool list = false, all = false;
  std::vector<std::string> cases;
  std::string out;
  std::string generator;  // overrides the generator attribute (regeneration checks)
  std::vector<std::string> check;
  bool bitwise = false;
  std::vector<std::string> specs;  // case files (docs/CASES.md)
  double max_gib = 16;
};

/// `--check`: each file's expected and emulated tensors recomputed by this oracle from the
/// file's own config, weights and inputs. A file whose expected tensors are not this oracle's
/// bits (another tool's, an older version's) passes when they are within TESTING.md's gates
/// (judged as a candidate); `--bitwise` asks for the same bits.
int check(const GoldenOptions& o) {
  int rc = kExitPass;
  golden::ReadLimits limits;
  limits.max_bytes = o.max_gib * (1ull << 30);
  for (const std::string& path : o.check) {
    const golden::GoldenCase gc = golden::read(path, limits);
    const auto [t0, t1] = golden::recompute(gc);
    const Divergence d0 = first_divergence(gc.cfg, t0, gc.expected);
    const Divergence d1 = first_divergence(gc.cfg, t1, gc.emulated);
    const auto said = [](const Divergence& d) {
      return d.found() ? "differ first at " + d.where() + ": " + d.detail
                       : std::string("identical");
    };
    fmt::print("{}: case {}, {} steps, written by {}\n  expected (T0): {}\n  emulated (T1): {}\n",
               path, gc.case_id, gc.steps.size(), gc.generator, said(d0), said(d1));
    bool ok = !d0.found() && !d1.found();
    if (d0.found() && !o.bitwise) {
      const Judgement j = judge(gc.cfg, std::make_shared<const Weights>(gc.weights), gc.num_blocks,
                                gc.steps, gc.expected);
      ok = j.failures.empty();
      fmt::print("  expected as a candidate: {}\n",
                 ok ? "within the gates (" + j.worst_text() + ")" : "FAIL " + j.failures.front());
    }
    fmt::print("  {}\n", ok ? "pass" : "FAIL");
    if (!ok) rc = kExitFail;
  }
  return rc;
}

int list() {
  fmt::print("{:<26} {:<9} {:>6} {:>5}  {}\n", "case", "committed", "layers", "steps",
             "description");
  for (const golden::CaseSpec& c : golden::registry())
    fmt::print("{:<26} {:<9} {:>6} {:>5}  {}\n", c.name, c.committed ? "yes" : "no",
               c.cfg.num_layers, c.steps.size(), c.description);
  return kExitPass;
}

/// The manifest already in `dir` (an empty one where there is none), read strictly: a file
/// this tool did not write (not a regular file, not JSON, nested deep, a key twice, cases that
/// are not objects naming their case) is refused by name, before any case is generated.
nlohmann::json read_manifest(const std::filesystem::path& dir) {
  const std::string path = (dir / "MANIFEST.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    return nlohmann::json::object({{"cases", nlohmann::json::array()}});
  const auto refuse = [&](const std::string& why) {
    throw CLI::ValidationError(
        "golden", path + ": " + why + " (not a manifest this tool writes: move it away)");
  };
  if (const std::string why = files::not_regular_file_reason(path); !why.empty()) refuse(why);
  if (std::filesystem::file_size(path, ec) > (std::uintmax_t{64} << 20)) refuse("over 64 MiB");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json m;
  try {
    m = golden::parse_json_strict(text.str(), path);
  } catch (const golden::JsonError& e) {
    throw CLI::ValidationError("golden", e.what());
  }
  if (!m.is_object()) refuse("expected a JSON object");
  if (!m.contains("cases")) m["cases"] = nlohmann::json::array();
  if (!m["cases"].is_array()) refuse("'cases' is not an array");
  for (const auto& e : m["cases"])
    if (!e.is_object() || !e.contains("case") || !e["case"].is_string())
      refuse("an entry of 'cases' is not an object with a string 'case': " + golden::quote_json(e));
  return m;
}

/// Whether the golden already at `path` is `gc` but for its generator attribute, which it then
/// keeps: GOLDEN.md's generator names the revision that wrote the data, so regenerating
/// unchanged data (the README's fixture command) leaves the file, and `git status`, as they were.
bool unchanged_but_generator(const std::string& path, golden::GoldenCase& gc) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::string kept;
  try {
    kept = golden::read(path).generator;
  } catch (const std::exception&) {
    return false;  // unreadable: written anew
  }
  const std::string fresh = gc.generator;
  gc.generator = kept;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const bool same = bytes.str() == golden::image(path, gc);
  if (!same) gc.generator = fresh;
  return same;
}

/// The manifest of `dir` (read again now, under the directory's lock) with `entries` put in:
/// entries of regenerated cases are replaced, the others kept, so it lists every case there.
nlohmann::json merged_manifest(const std::string& dir, const nlohmann::json& entries) {
  nlohmann::json merged = read_manifest(dir);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& e : merged["cases"]) {
    bool replaced = false;
    for (const auto& n : entries) replaced = replaced || n["case"] == e["case"];
    if (!replaced) cases.push_back(e);
  }
  for (const auto& n : entries) cases.push_back(n);
  std::sort(cases.begin(), cases.end(), [](const auto& a, const auto& b) {
    return a["case"].template get<std::string>() < b["case"].template get<std::string>();
  });
  merged["cases"] = cases;
  merged["schema_version"] = golden::kSchemaVersion;
  merged.erase("generator");  // each file records its own generator
  return merged;
}

/// A run's cases and their outputs: `todo[first_spec..]` come from `o.specs` and also get a
/// candidate skeleton. Every output path is checked before any work: a directory in the way, an
/// output that is a case file read, two outputs on one path.
struct Outputs {
  std::vector<std::string> golden, skeleton;  // per case; skeleton "" for a registry case
  std::string manifest;
};
Outputs check_outputs(const GoldenOptions& o, const std::vector<golden::CaseSpec>& todo,
                      std::size_t first_spec) {
  const std::filesystem::path dir(o.out);
  Outputs out{{}, {}, (dir / "MANIFEST.json").string()};
  std::vector<NamedPath> outputs, inputs;
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const std::string& name = todo[i].name;
    out.golden.push_back((dir / (name + ".h5")).string());
    out.skeleton.push_back(i < first_spec ? "" : (dir / (name + ".candidate.json")).string());
    outputs.push_back({"case " + name + "'s golden", out.golden.back()});
    outputs.push_back({"case " + name + "'s candidate skeleton", out.skeleton.back()});
  }
  outputs.push_back({"the manifest", out.manifest});
  for (const std::string& spec : o.specs) inputs.push_back({"--spec", spec});
  refuse_output_clash("golden", outputs, inputs);
  for (const NamedPath& p : outputs)
    if (!p.path.empty()) files::require_writable_location(p.path);
  return out;
}

int generate(const GoldenOptions& o) {
  std::vector<golden::CaseSpec> todo;
  if (o.all)
    for (const golden::CaseSpec& c : golden::registry())
      if (c.committed) todo.push_back(c);
  for (const std::string& n : o.cases) todo.push_back(golden::find_case(n));
  const std::size_t first_spec = todo.size();  // todo[first_spec..] come from case files
  for (const std::string& path : o.specs) todo.push_back(golden::read_case_file(path));
  for (std::size_t i = 0; i < todo.size(); ++i)
    for (std::size_t k = 0; k < i; ++k)
      if (todo[k].name == todo[i].name)
        throw CLI::ValidationError(
            "golden", "case " + todo[i].name + " is asked for twice (--case, --spec or --all)");
  if (todo.empty())
    throw CLI::ValidationError("golden", "give --case NAME, --spec FILE, --all or --list");
  // What each case will cost, before any starts; a case over the bound is refused.
  for (const golden::CaseSpec& spec : todo) {
    const golden::CaseEstimate e = golden::estimate(spec);
    fmt::print(stderr,
               "  {}: {} layers, {} steps; about {:.2f} GiB held and {:.0f} s to generate\n",
               spec.name, spec.cfg.num_layers, spec.steps.size(), e.bytes / (1 << 30), e.seconds);
    if (e.bytes > o.max_gib * (1 << 30))
      throw CLI::ValidationError(
          "golden", spec.name + " needs about " + fmt::format("{:.1f}", e.bytes / (1 << 30)) +
                        " GiB, over --max-gib " + fmt::format("{:g}", o.max_gib) +
                        " (raise it to generate the case)");
  }
  std::filesystem::create_directories(o.out);
  const Outputs paths = check_outputs(o, todo, first_spec);
  read_manifest(o.out);  // refused now, not after the work
  const std::string generator = o.generator.empty() ? generator_string("golden") : o.generator;
  // Every output goes to a temporary file of its own (on disk, not held in memory); nothing
  // takes its name until every case is made, and then all of them with the manifest, under the
  // directory's lock. A run that fails leaves the directory as it was.
  files::StagedFiles staged;
  nlohmann::json entries = nlohmann::json::array();
  std::vector<std::string> rows;
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const golden::CaseSpec& spec = todo[i];
    const auto t0 = std::chrono::steady_clock::now();
    const std::string& path = paths.golden[i];
    golden::GoldenCase gc = golden::generate(spec, generator, [&](int s, int n) {
      progress(fmt::format("  {}: step {}/{}", spec.name, s, n));
    });
    progress(fmt::format("  {}: writing", spec.name), true);
    long datasets = 0;
    const bool unchanged = o.generator.empty() && unchanged_but_generator(path, gc);
    const files::StagedFiles::File written = golden::stage(staged, path, gc, [&] {
      ++datasets;
      // Fault injection for the interrupted-writer test: abort mid-write.
      if (const char* n = std::getenv("DSV32_GOLDEN_ABORT_AFTER"); n && datasets == std::atol(n))
        std::abort();
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows.push_back(fmt::format("{:<26} {:>5} {:>10} {:>8.2f}  {}{}", spec.name, gc.steps.size(),
                               written.bytes, secs, path,
                               unchanged ? " (unchanged: kept as it was)" : ""));
    // A case from a file also gets the skeleton of a candidate for it (docs/CANDIDATE.md).
    if (const std::string& skeleton = paths.skeleton[i]; !skeleton.empty()) {
      staged.add(skeleton, golden::candidate_skeleton(spec));
      rows.push_back(fmt::format("{:<26} {:>5} {:>10} {:>8}  {}", "", "", "", "", skeleton));
    }
    // The hash of the bytes written, not of the path read back later.
    entries.push_back({{"case", spec.name},
                       {"file", spec.name + ".h5"},
                       {"description", spec.description},
                       {"bytes", written.bytes},
                       {"fnv1a64", fmt::format("{:016x}", written.fnv1a64)},
                       {"steps", gc.steps.size()},
                       {"config", nlohmann::json::parse(golden::config_to_json(gc.cfg))}});
  }
  {
    // Under the directory's lock: another run into it renames its files and merges its entries
    // before or after this one, never in between (which lost entries, and recorded one run's
    // hash over another's golden).
    const files::DirectoryLock lock(o.out);
    staged.add(paths.manifest, merged_manifest(o.out, entries).dump(2) + "\n");
    staged.commit();
  }
  fmt::print("{:<26} {:>5} {:>10} {:>8}  {}\n", "case", "steps", "bytes", "seconds", "file");
  for (const std::string& row : rows) fmt::print("{}\n", row);
  return kExitPass;
}

}  // namespace

void add_golden(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GoldenOptions>();
  CLI::App* sub = app.add_subcommand("golden", "List or generate HDF5 golden files");
  CLI::Option* list_opt = sub->add_flag("--list", o->list, "List the registry's cases");
  CLI::Option* cases =
      sub->add_option("--case", o->cases, "Generate this case (repeatable)")->check(kRegistryCase);
  CLI::Option* specs =
      sub->add_option("--spec", o->specs,
                      "Generate the case of this case file (repeatable; docs/CASES.md), with the "
                      "skeleton of a candidate for it")
          ->check(kInputFile);
  sub->add_option("--max-gib", o->max_gib,
                  "Refuse a case whose estimated memory (or, with --check, a file whose tensors) "
                  "exceeds this many GiB")
      ->check(positive_up_to(1 << 20))
      ->capture_default_str();
  CLI::Option* all =
      sub->add_flag("--all", o->all, "Generate every committed case and MANIFEST.json");
  sub->add_option("--out", o->out, "Output directory (created when missing)")
      ->check(CLI::Validator(
          [](std::string& dir) {
            std::error_code ec;
            return std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)
                       ? dir + ": exists and is not a directory"
                       : std::string();
          },
          "DIR"))
      ->default_val(".");
  sub->add_option("--generator", o->generator,
                  "Generator attribute to record (default: this build)");
  CLI::Option* check_opt =
      sub->add_option(
             "--check", o->check,
             "Recompute these golden files' expected tensors from their own config, weights "
             "and inputs and compare (pass: the same bits, or within TESTING.md's gates)")
          ->check(kInputFile);
  sub->add_flag("--bitwise", o->bitwise, "With --check: pass only on the same bits")
      ->needs(check_opt);
  // One job a run: listing, checking and generating are never silently preferred to another.
  list_opt->excludes(cases)->excludes(specs)->excludes(all)->excludes(check_opt);
  check_opt->excludes(cases)->excludes(specs)->excludes(all);
  sub->callback([o, &exit_code] {
    exit_code = o->list ? list() : !o->check.empty() ? check(*o) : generate(*o);
  });
}

}  // namespace dsv32::tools

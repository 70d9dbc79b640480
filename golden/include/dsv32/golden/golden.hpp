// GOLDEN.md: one case per HDF5 file (config, weights, steps, T0 and T1 stage tensors).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dsv32/golden/files.hpp"
#include "dsv32/golden/h5.hpp"
#include "dsv32/oracle/oracle.hpp"
#include "dsv32/oracle/trace_diff.hpp"

namespace dsv32::golden {

inline constexpr const char* kSchema = "dsv32-golden";
inline constexpr std::int64_t kSchemaVersion = 1;
/// The version of a file that gives a prefix (/prefix, GOLDEN.md "Given prefix"); readers of
/// version 1 refuse it rather than read a context they would not have.
inline constexpr std::int64_t kSchemaVersionPrefix = 2;

/// Config <-> the JSON of GOLDEN.md (Hugging Face names). Parsing ignores unknown keys and
/// refuses missing ones, a value of the wrong JSON type (a float or a boolean for an integer
/// key, an integer past int32) and any Config::validate refuses, naming the key.
std::string config_to_json(const Config& cfg);
Config config_from_json(const std::string& json);
/// The first field in which two configs differ, with both values ("hidden_size 64 vs 128"), or
/// "" when they are equal.
std::string config_difference(const Config& a, const Config& b);

/// The stated bounds of a reader (docs/BAD_INPUT.md), checked before anything is allocated.
struct ReadLimits {
  /// Bytes held for the file's tensors (as doubles) and the caches of the two oracles that
  /// judge it (the committed fixtures need a few MB of it).
  double max_bytes = 16.0 * (1ull << 30);
  int max_tokens = 1 << 16;      // capture_size (so T_a) of one step
  int max_steps = 4096;          // steps of a case
  int max_num_blocks = 1 << 20;  // the cache's blocks (num_blocks, or 1 + the largest id named)
  /// Parse in a child process first (h5::contain): a file that crashes libhdf5 is an error.
  bool contain = true;
};

/// Everything a golden file holds.
struct GoldenCase {
  std::string case_id;
  std::uint64_t seed = 0;
  std::string generator;          // tool, version, git revision
  std::string tolerance_profile;  // "bf16" or "fp32" (the gate family of TESTING.md)
  Config cfg;
  Weights weights;
  std::vector<StepInput> steps;     // derived; padded rows NaN after reading
  std::vector<StepTrace> expected;  // T0 (exact, float64)
  std::vector<StepTrace> emulated;  // T1 (emulated, storage dtypes)
  int num_blocks = 0;
};

/// Writes `c` to path (temporary name, then rename). `on_dataset` (optional) is called after
/// each dataset, for progress and for fault-injection tests. With `verify`, the whole file is
/// read back by `read` before it takes its name, so that no golden is reported written that
/// this tool would refuse (GoldenError "PATH: not written: ..."); `dsv32 gpu --dump`, whose
/// traces are a candidate's and may hold NaN, writes without.
void write(const std::string& path, const GoldenCase& c,
           const std::function<void()>& on_dataset = {}, bool verify = true);
/// `c` staged for `path` in `out` (files::StagedFiles): the bytes and (with `verify`) the
/// read-back check of `write`, the file taking its name only when `out` commits, with the run's
/// other outputs. Returns what was written (bytes and hash).
files::StagedFiles::File stage(files::StagedFiles& out, const std::string& path,
                               const GoldenCase& c, const std::function<void()>& on_dataset = {},
                               bool verify = true);
/// The bytes `write(path, c)` would write (the file is built in memory; nothing is written).
std::string image(const std::string& path, const GoldenCase& c);
/// Reads and validates a golden file: schema, version, config, every dataset's presence,
/// dtype and shape; steps exactly step0..step{n-1}; block tables (ids in the cache, -1 only
/// past a request's blocks), lengths and capture sizes within the cache and `limits`; only
/// finite values in weights, inputs and both traces. Throws h5::GoldenError naming the file
/// and the dataset.
GoldenCase read(const std::string& path, const ReadLimits& limits = {});

/// Reads `path` as `read` does and says what it is ("case default, 3 layers, 4 steps, 64 cache
/// blocks"), or throws as `read` does. Contained, the file is parsed once, in the child alone:
/// `dsv32 validate` (which the Python package runs before every golden it reads) takes half
/// of `read`'s time.
std::string describe(const std::string& path, const ReadLimits& limits = {});

/// A candidate's traces for `golden` (docs/CANDIDATE.md): `/steps/step{s}/expected/` of
/// `path`, `layer{l}/{stage}` and `output`, from step 0 on. Any subset of a layer's stages (a
/// missing stage is left out of the trace); `output` required; each tensor in any GOLDEN.md
/// logical dtype (`topk` integral), shaped (T_a, stage shape) of the golden's step; NaN kept
/// (judging fails it). Fewer steps than the golden are returned as they are (judging fails the
/// first missing one); steps other than step0..step{n-1} (as `read` takes them), more steps,
/// other layers, unknown stage names, wrong shapes, a stage judged only with another that is
/// missing (a scale without its codes, codes without their scale: unjudgeable_stage) and
/// unreadable files are refused with a GoldenError naming the dataset.
std::vector<StepTrace> read_candidate(const std::string& path, const GoldenCase& golden,
                                      const ReadLimits& limits = {});

/// The base of a candidate's LSEs (GOLDEN.md): its root attribute `lse_base`, "e" (natural log,
/// also when absent) or "2"; anything else refused by name. Read after read_candidate.
LseBase read_candidate_lse_base(const std::string& path, const ReadLimits& limits = {});

/// `c`'s expected (T0) and emulated (T1, following T0's sets) traces recomputed by this
/// oracle from `c`'s own config, weights and inputs, as `generate` makes them and a golden file
/// stores them (T1 rounded to its storage dtypes).
std::pair<std::vector<StepTrace>, std::vector<StepTrace>> recompute(const GoldenCase& c);

/// One step of a case plan: requests with new-token counts, capture size, ids finished after.
struct StepPlan {
  std::vector<StepRequest> requests;
  int capture_size = 0;  // 0: no padding
  std::vector<int> finish_after;
};

/// A named case of the registry; its name is its filter key and its file name (NAME.h5).
struct CaseSpec {
  std::string name;
  std::string description;
  Config cfg;
  std::uint64_t seed = 1;
  int num_blocks = 64;
  std::vector<StepPlan> steps;
  bool committed = true;                     // small enough for fixtures/
  std::map<int, HiddenShape> hidden;         // request id -> how its hidden rows repeat
  std::vector<int> zero_index_key_rope;      // F layers whose index keys have no rotary part
  std::vector<std::string> require;          // what the case claims to exercise (COVERAGE.md)
  DcpTables dcp_tables = DcpTables::shared;  // under DCP: vLLM's shared ids, or per-rank ids
};

/// The registry (GOLDEN.md / issue 4 coverage), in a fixed order.
const std::vector<CaseSpec>& registry();
/// The case named `name`; throws std::invalid_argument listing the known names.
CaseSpec find_case(const std::string& name);  // a copy: no reference into a temporary

/// Runs the oracle in both modes (T1 on T0's index sets) over the case's steps. `progress`
/// gets (step, steps) after each step. A case whose `require` (its claims about what it
/// exercises, counted from T0's scores as the judge counts them) does not hold is refused.
GoldenCase generate(const CaseSpec& spec, const std::string& generator,
                    const std::function<void(int, int)>& progress = {});

}  // namespace dsv32::golden

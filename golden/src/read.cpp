// Reading golden and candidate files strictly (GOLDEN.md, docs/BAD_INPUT.md): every size
// bounded before it is allocated, every refusal naming the dataset.
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "dsv32/golden/golden.hpp"
#include "dsv32/oracle/trace_diff.hpp"
#include "layout.hpp"

namespace dsv32::golden {
namespace {

using detail::Shape;
using detail::stage_shape;
using detail::trace_dtype;
using h5::Budget;

Mat to_mat(const Tensor& t) {
  Mat m(t.shape.at(0), t.shape.size() > 1 ? t.shape[1] : 1);
  std::copy(t.data.begin(), t.data.end(), m.data());
  return m;
}
Vec to_vec(const Tensor& t) {
  return Eigen::Map<const Vec>(t.data.data(), static_cast<Eigen::Index>(t.data.size()));
}

/// Refuses NaN and +-Inf among `values` (the data of `meta`, which names them), naming the
/// dataset and the element: one Inf in a reference turns its gate off (tolerances and caps are
/// computed from it).
void refuse_non_finite(const h5::Group& g, const Tensor& meta, const double* values,
                       std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]))
      throw h5::GoldenError(g.where(meta.name) + ": " +
                            (std::isnan(values[i]) ? "NaN"
                             : values[i] > 0       ? "+Inf"
                                                   : "-Inf") +
                            " at " + meta.index_string(static_cast<std::int64_t>(i)));
}
void refuse_non_finite(const h5::Group& g, const Tensor& t) {
  refuse_non_finite(g, t, t.data.data(), t.data.size());
}

/// A finite (rows, cols) matrix (a vector: cols 1 and `shape` of rank 1) read straight into its
/// storage: the weights of a DSv3.2-size golden are 1.6 GB as doubles.
Mat read_finite_mat(const h5::Group& g, const std::string& name, DType dt, const Shape& shape) {
  const Eigen::Index rows = shape.at(0), cols = shape.size() > 1 ? shape[1] : 1;
  Mat m;
  const Tensor meta = g.read_into(name, dt, shape, [&](std::size_t) {
    m.resize(rows, cols);
    return m.data();
  });
  refuse_non_finite(g, meta, m.data(), static_cast<std::size_t>(m.size()));
  return m;
}

/// A finite tensor of `shape`.
Tensor read_finite(const h5::Group& g, const std::string& name, DType dt, const Shape& shape) {
  Tensor t = g.read(name, dt, shape);
  refuse_non_finite(g, t);
  return t;
}

StepTrace read_trace(const h5::Group& g, const Config& cfg, std::int64_t Ta, bool exact) {
  StepTrace tr;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const h5::Group lg = g.child("layer" + std::to_string(l), false);
    LayerTrace lt;
    for (const Stage s : layer_stages()) {
      if (stage_info(s).indexer && !cfg.is_full_layer(l)) continue;
      lt.tensors.push_back(
          read_finite(lg, stage_name(s), trace_dtype(cfg, s, exact), stage_shape(cfg, s, Ta)));
    }
    tr.layers.push_back(std::move(lt));
  }
  tr.output = read_finite(g, stage_name(Stage::output), trace_dtype(cfg, Stage::output, exact),
                          stage_shape(cfg, Stage::output, Ta));
  return tr;
}

/// The number of steps of /steps: its members must be exactly step0..step{n-1}, n >= 1 (a
/// missing step would drop the later ones; an unknown member is another layout).
/// N when `name` is `prefix` followed by N in plain decimal (no sign, no leading zero, at most
/// six digits), else -1: "step3" is step 3; "step03", "step-1" and "stepx" are no step.
int numbered(const std::string& name, const std::string& prefix) {
  const std::size_t k = prefix.size();
  if (name.size() <= k || name.size() > k + 6 || name.compare(0, k, prefix) != 0 ||
      (name[k] == '0' && name.size() > k + 1))
    return -1;
  for (std::size_t i = k; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoi(name.substr(k));
}

int count_steps(const h5::Group& sg, int max_steps) {
  const std::vector<std::string> names = sg.names();
  std::vector<bool> seen;
  for (const std::string& n : names) {
    const int s = numbered(n, "step");
    if (s < 0)
      throw h5::GoldenError(sg.where(n) +
                            ": not a step (the members of /steps are step0, step1, ...)");
    if (s >= max_steps)
      throw h5::GoldenError(sg.where(n) + ": more than the reader's limit of " +
                            std::to_string(max_steps) + " steps");
    if (static_cast<int>(seen.size()) <= s) seen.resize(s + 1, false);
    seen[s] = true;
  }
  if (seen.empty()) throw h5::GoldenError(sg.where("step0") + ": missing group (no steps)");
  for (std::size_t s = 0; s < seen.size(); ++s)
    if (!seen[s])
      throw h5::GoldenError(sg.where("step" + std::to_string(s)) + ": missing group (step" +
                            std::to_string(seen.size() - 1) + " exists; steps run in order)");
  return static_cast<int>(seen.size());
}

/// Block table entries as GOLDEN.md has them: block ids in [0, num_blocks) and then only -1
/// (no hole, no other negative value, no id twice in a step). `num_blocks` 0: not known yet.
void check_block_table(const h5::Group& ig, const Tensor& table, int num_blocks) {
  const std::int64_t R = table.shape[0], W = table.shape[1];
  std::vector<std::int64_t> owner(static_cast<std::size_t>(num_blocks > 0 ? num_blocks : 0), -1);
  for (std::int64_t r = 0; r < R; ++r) {
    std::int64_t pad = -1;  // first -1 of the row
    for (std::int64_t k = 0; k < W; ++k) {
      const double v = table.data[r * W + k];
      const auto at = [&] {
        return ig.where("block_table") + ": entry (" + std::to_string(r) + ", " +
               std::to_string(k) + ") = " + std::to_string(static_cast<long long>(v));
      };
      if (v == -1) {
        if (pad < 0) pad = k;
        continue;
      }
      if (v < 0)
        throw h5::GoldenError(at() + ": a block id is >= 0, or -1 past the request's blocks");
      if (pad >= 0)
        throw h5::GoldenError(at() + " follows -1 at (" + std::to_string(r) + ", " +
                              std::to_string(pad) + "): a block table has no holes");
      if (num_blocks > 0) {
        if (v >= num_blocks)
          throw h5::GoldenError(at() + ": outside the cache's " + std::to_string(num_blocks) +
                                " blocks");
        std::int64_t& o = owner[static_cast<std::size_t>(v)];
        if (o >= 0)
          throw h5::GoldenError(at() + ": block already named by request " + std::to_string(o) +
                                " in this step");
        o = r;
      }
    }
  }
}

/// The widest block table a reader takes: every block of the cache, or a table padded to a
/// fixed width (vLLM pads to max_model_len / B) up to 2^16 entries.
std::int64_t max_table_width(int num_blocks) {
  return std::max<std::int64_t>(num_blocks, 1 << 16);
}

/// The block table of a step's inputs, R rows, checked.
Tensor read_block_table(const h5::Group& ig, std::int64_t R, int num_blocks, int max_num_blocks) {
  // Bounded before the values are read: a declared width is not its storage.
  const Tensor table = ig.read(
      "block_table", DType::int32, std::nullopt,
      std::max<std::int64_t>(R, 1) * max_table_width(num_blocks > 0 ? num_blocks : max_num_blocks));
  if (table.shape.size() != 2 || table.shape[0] != R)
    throw h5::GoldenError(ig.where("block_table") + ": shape " + table.shape_string() +
                          ", expected (" + std::to_string(R) + ", max_blocks)");
  check_block_table(ig, table, num_blocks);
  return table;
}

/// 1 + the largest physical block any step's block table names (at least 1), for a file
/// without our num_blocks attribute.
int blocks_named(const h5::Group& steps, int n_steps, const ReadLimits& limits) {
  double top = 0;
  for (int s = 0; s < n_steps; ++s) {
    const h5::Group ig = steps.child("step" + std::to_string(s), false).child("inputs", false);
    const Tensor ctx = ig.read("ctx_len", DType::int32, std::nullopt, limits.max_tokens);
    const Tensor table =
        read_block_table(ig, ctx.shape.empty() ? 0 : ctx.shape[0], 0, limits.max_num_blocks);
    for (const double b : table.data) top = std::max(top, b);
  }
  if (top + 1 > limits.max_num_blocks)
    throw h5::GoldenError(
        steps.where() + ": block id " + std::to_string(static_cast<long long>(top)) +
        " is past the reader's limit of " + std::to_string(limits.max_num_blocks) + " blocks");
  return static_cast<int>(top) + 1;
}

}  // namespace

namespace {

/// The bytes two oracles' caches take for `num_blocks` blocks (judging and --check run both).
double cache_bytes(const Config& cfg, int num_blocks) {
  return 2.0 * 8.0 * cfg.num_layers * static_cast<double>(num_blocks) * cfg.block_size *
         (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim + 1);
}

/// An integer attribute in [lo, hi], named when it is not.
std::int64_t attr_in(const h5::Group& g, const std::string& name, std::int64_t lo,
                     std::int64_t hi) {
  const std::int64_t v = g.attr_int(name);
  if (v < lo || v > hi)
    throw h5::GoldenError(g.where() + ": attribute " + name + " = " + std::to_string(v) +
                          " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

/// One step's inputs, every length checked against the cache and the limits before anything
/// of its size is allocated.
StepInput read_inputs(const h5::Group& ig, const Config& cfg, int num_blocks,
                      const ReadLimits& limits) {
  const Tensor ctx = ig.read("ctx_len", DType::int32, std::nullopt, limits.max_tokens);
  if (ctx.shape.size() != 1 || ctx.shape[0] < 1)
    throw h5::GoldenError(ig.where("ctx_len") + ": shape " + ctx.shape_string() +
                          ", expected (R) with R >= 1 requests");
  const std::int64_t R = ctx.shape[0];
  const Tensor q = ig.read("q_len", DType::int32, Shape{R});
  const Tensor table = read_block_table(ig, R, num_blocks, limits.max_num_blocks);
  // Our writer's extra: each request's id. Without it, a request is known by the first
  // physical block of its table, which it keeps while it lives (GOLDEN.md: its earlier
  // tokens stay in the blocks its table names).
  Tensor ids;
  if (ig.has("request_id")) {
    ids = ig.read("request_id", DType::int32, Shape{R});
  } else {
    ids.shape = {R};
    for (std::int64_t r = 0; r < R; ++r) {
      const double first = table.shape[1] > 0 ? table.data[r * table.shape[1]] : -1;
      if (first < 0)
        throw h5::GoldenError(ig.where("block_table") + ": request " + std::to_string(r) +
                              " has no block (needed to know it without request_id)");
      ids.data.push_back(first);
    }
  }
  const std::int64_t slots = static_cast<std::int64_t>(num_blocks) * cfg.block_size;
  std::int64_t Ta = 0;
  StepInput in;
  for (std::int64_t r = 0; r < R; ++r) {
    const std::int64_t c = static_cast<std::int64_t>(ctx.data[r]),
                       n = static_cast<std::int64_t>(q.data[r]);
    const std::string entry = " entry " + std::to_string(r) + " = ";
    if (n < 1 || n > limits.max_tokens)
      throw h5::GoldenError(ig.where("q_len") + ":" + entry + std::to_string(n) +
                            " (a request has 1 to " + std::to_string(limits.max_tokens) +
                            " new tokens)");
    if (c < 0 || c + n > slots)
      throw h5::GoldenError(ig.where("ctx_len") + ":" + entry + std::to_string(c) + " with q_len " +
                            std::to_string(n) + ": outside the cache's " + std::to_string(slots) +
                            " slots (num_blocks " + std::to_string(num_blocks) + " x block_size " +
                            std::to_string(cfg.block_size) + ")");
    Ta += n;
    RequestStep rs{static_cast<int>(ids.data[r]), static_cast<int>(c), static_cast<int>(n), {}};
    for (std::int64_t k = 0; k < table.shape[1]; ++k)
      if (const double blk = table.data[r * table.shape[1] + k]; blk >= 0)
        rs.block_table.push_back(static_cast<int>(blk));
    in.requests.push_back(std::move(rs));
  }
  in.capture_size = static_cast<int>(attr_in(ig, "capture_size", 0, limits.max_tokens));
  if (Ta > limits.max_tokens)
    throw h5::GoldenError(ig.where("q_len") + ": " + std::to_string(Ta) +
                          " tokens, over the reader's limit of " +
                          std::to_string(limits.max_tokens));
  if (in.capture_size < Ta)
    throw h5::GoldenError(ig.where() + ": capture_size " + std::to_string(in.capture_size) + " < " +
                          std::to_string(Ta) + " tokens");
  const Tensor hidden =
      read_finite(ig, "hidden", cfg.precision == Precision::bf16 ? DType::bfloat16 : DType::float32,
                  Shape{Ta, cfg.hidden_size});
  if (Budget* b = ig.budget())
    b->take(8.0 * in.capture_size * cfg.hidden_size, 0.0, ig.where("hidden") + " (padded)");
  in.hidden =
      Mat::Constant(in.capture_size, cfg.hidden_size, std::nan(""));  // padded rows poisoned
  in.hidden.topRows(Ta) = to_mat(hidden);
  try {
    in.derive(cfg, num_blocks);
  } catch (const ScenarioError& e) {
    throw h5::GoldenError(ig.where() + ": " + e.what());
  }
  const auto check_same = [&](const char* name, const auto& derived) {
    const Tensor t = ig.read(name, DType::int32, Shape{Ta});
    for (std::int64_t i = 0; i < Ta; ++i)
      if (t.data[i] != static_cast<double>(derived[i]))
        throw h5::GoldenError(ig.where(name) + ": entry " + std::to_string(i) +
                              " disagrees with ctx_len/q_len/block_table");
  };
  check_same("positions", in.positions);
  check_same("slots", in.slots);
  check_same("request_of_token", in.request_of_token);
  return in;
}

}  // namespace

namespace {

GoldenCase read_here(const std::string& path, const ReadLimits& limits) {
  h5::File f = h5::File::open(path, limits.max_bytes);
  const h5::Group root = f.root();
  GoldenCase c;
  const std::string schema = root.attr_string("schema");
  if (schema == "dsv32-candidate")
    throw h5::GoldenError(path +
                          ": a candidate file (schema 'dsv32-candidate'), not a golden: "
                          "judge it with `dsv32 judge " +
                          path + " --golden GOLDEN.h5`");
  if (schema != kSchema)
    throw h5::GoldenError(path + ": schema '" + schema + "', expected '" + kSchema + "'");
  const std::int64_t version = root.attr_int("schema_version");
  if (version != kSchemaVersion && version != kSchemaVersionPrefix)
    throw h5::GoldenError(path + ": schema_version " + std::to_string(version) +
                          " is not supported (this reader knows " + std::to_string(kSchemaVersion) +
                          " and " + std::to_string(kSchemaVersionPrefix) + ")");
  if (version == kSchemaVersion && root.has("prefix"))
    throw h5::GoldenError(root.where("prefix") + ": a given prefix needs schema_version " +
                          std::to_string(kSchemaVersionPrefix) + " (this file says " +
                          std::to_string(version) + ")");
  c.generator = root.attr_string("generator");
  c.case_id = root.attr_string("case_id");
  c.seed = static_cast<std::uint64_t>(root.attr_int("seed"));
  c.tolerance_profile = root.attr_string("tolerance_profile");
  try {
    c.cfg = config_from_json(root.attr_string("config"));
  } catch (const h5::GoldenError& e) {
    throw h5::GoldenError(path + ": " + e.what());
  }
  const Config& cfg = c.cfg;
  const h5::Group sg = root.child("steps", false);
  const int n_steps = count_steps(sg, limits.max_steps);
  // Our writer's extra: the cache size. Without it, the smallest cache that holds every block
  // the steps name.
  c.num_blocks = root.has_attr("num_blocks")
                     ? static_cast<int>(attr_in(root, "num_blocks", 1, limits.max_num_blocks))
                     : blocks_named(sg, n_steps, limits);
  if (Budget* b = root.budget())
    b->take(cache_bytes(cfg, c.num_blocks), 0.0,
            root.where() + " (the oracles' caches for num_blocks " + std::to_string(c.num_blocks) +
                ")");
  const std::int64_t D = cfg.hidden_size, H = cfg.num_heads, Rq = cfg.q_lora_rank,
                     L = cfg.kv_lora_rank, dq = cfg.qk_head_dim(),
                     dkv = cfg.qk_nope_head_dim + cfg.v_head_dim, dv = cfg.v_head_dim,
                     HI = cfg.index_n_heads, dI = cfg.index_head_dim;
  const DType b = DType::bfloat16;
  const h5::Group wg = root.child("weights", false);
  for (int l = 0; l < cfg.num_layers; ++l) {
    const h5::Group lg = wg.child("layer" + std::to_string(l), false);
    LayerWeights w;
    w.w_qkv_a = read_finite_mat(lg, "w_qkv_a", b, Shape{cfg.qkv_a_rows(), D});
    w.g_q = to_vec(read_finite(lg, "g_q", b, Shape{Rq}));
    w.g_kv = to_vec(read_finite(lg, "g_kv", b, Shape{L}));
    w.w_q_b = read_finite_mat(lg, "w_q_b", b, Shape{H * dq, Rq});
    w.w_kv_b = read_finite_mat(lg, "w_kv_b", b, Shape{H * dkv, L});
    w.w_o = read_finite_mat(lg, "w_o", b, Shape{D, H * dv});
    w.g_in = to_vec(read_finite(lg, "g_in", b, Shape{D}));
    if (cfg.is_full_layer(l)) {
      const h5::Group ig = lg.child("indexer", false);
      IndexerWeights iw;
      iw.w_q_b = read_finite_mat(ig, "w_q_b", b, Shape{HI * dI, Rq});
      iw.w_k = read_finite_mat(ig, "w_k", b, Shape{dI, D});
      iw.w_w = read_finite_mat(ig, "w_w", b, Shape{HI, D});
      iw.g_k = to_vec(read_finite(ig, "g_k", b, Shape{dI}));
      iw.b_k = to_vec(read_finite(ig, "b_k", b, Shape{dI}));
      w.indexer = std::move(iw);
    }
    c.weights.layers.push_back(std::move(w));
  }

  for (int s = 0; s < n_steps; ++s) {
    const h5::Group st = sg.child("step" + std::to_string(s), false);
    StepInput in = read_inputs(st.child("inputs", false), cfg, c.num_blocks, limits);
    const std::int64_t Ta = in.num_tokens;
    c.expected.push_back(read_trace(st.child("expected", false), cfg, Ta, true));
    c.emulated.push_back(read_trace(st.child("emulated", false), cfg, Ta, false));
    if (cfg.dcp_size > 1) {
      detail::read_dcp_tables(st.child("inputs", false), cfg, in, c.num_blocks);
      for (const auto& [trace, exact] :
           {std::pair{&c.expected.back(), true}, std::pair{&c.emulated.back(), false}})
        for (int l = 0; l < cfg.num_layers; ++l)
          trace->layers[l].dcp =
              detail::read_dcp_layer(st.child(exact ? "expected" : "emulated", false)
                                         .child("layer" + std::to_string(l), false),
                                     cfg, Ta, exact);
    }
    c.steps.push_back(std::move(in));
  }
  detail::read_prefixes(root, cfg, c.steps, c.num_blocks);
  return c;
}

std::vector<StepTrace> read_candidate_here(const std::string& path, const GoldenCase& golden,
                                           const ReadLimits& limits) {
  h5::File f = h5::File::open(path, limits.max_bytes);
  const h5::Group root = f.root();
  const Config& cfg = golden.cfg;
  if (!root.has("steps")) throw h5::GoldenError(root.where("steps") + ": missing group");
  const h5::Group sg = root.child("steps", false);
  std::string known;
  for (const std::string& n : layer_stage_names()) known += (known.empty() ? "" : ", ") + n;
  const int n_steps = count_steps(sg, limits.max_steps);
  if (n_steps > static_cast<int>(golden.steps.size()))
    throw h5::GoldenError(sg.where("step" + std::to_string(golden.steps.size())) +
                          ": the golden has only " + std::to_string(golden.steps.size()) +
                          " steps");
  std::vector<StepTrace> out;
  for (int s = 0; s < n_steps; ++s) try {
      const h5::Group st = sg.child("step" + std::to_string(s), false);
      if (!st.has("expected")) throw h5::GoldenError(st.where("expected") + ": missing group");
      const h5::Group eg = st.child("expected", false);
      const std::int64_t Ta = golden.steps[s].num_tokens;
      StepTrace tr;
      for (const std::string& member : eg.names()) {
        if (find_stage(member) == Stage::output) continue;
        if (const int l = numbered(member, "layer"); l < 0 || l >= cfg.num_layers)
          throw h5::GoldenError(eg.where(member) + ": not a member of a candidate step (layer0.." +
                                "layer" + std::to_string(cfg.num_layers - 1) + ", output)");
      }
      for (int l = 0; l < cfg.num_layers; ++l) {
        LayerTrace lt;
        const std::string ln = "layer" + std::to_string(l);
        if (eg.has(ln)) {
          const h5::Group lg = eg.child(ln, false);
          for (const std::string& member : lg.names()) {
            if (const int r = numbered(member, "rank");
                r >= 0 && r < cfg.dcp_size && cfg.dcp_size > 1)
              continue;  // a DCP rank's stages
            const std::optional<Stage> stage = find_stage(member);
            if (!stage || stage == Stage::output)
              throw h5::GoldenError(lg.where(member) + ": unknown stage (the stages: " + known +
                                    ")");
            if (stage_info(*stage).indexer && !cfg.is_full_layer(l))
              throw h5::GoldenError(lg.where(member) + ": an indexer stage in an S layer");
          }
          for (const Stage stage : layer_stages()) {
            const std::string& name = stage_name(stage);
            if (!lg.has(name)) continue;
            const DType dt =
                stage_info(stage).storage == Storage::int32 ? DType::int32 : lg.dtype(name);
            lt.tensors.push_back(lg.read(name, dt, stage_shape(cfg, stage, Ta)));
          }
          if (cfg.dcp_size > 1) lt.dcp = detail::read_candidate_dcp_layer(lg, cfg, Ta);
          // A stage the judge could not judge with what else is given is refused, not skipped.
          if (const std::string why = unjudgeable_stage(lt); !why.empty())
            throw h5::GoldenError(lg.where() + "/" + why);
        }
        tr.layers.push_back(std::move(lt));
      }
      if (!eg.has("output"))
        throw h5::GoldenError(eg.where("output") +
                              ": missing dataset (a candidate must provide "
                              "the output)");
      tr.output = eg.read("output", eg.dtype("output"), stage_shape(cfg, Stage::output, Ta));
      out.push_back(std::move(tr));
    } catch (const h5::ShapeError& e) {
      // A shape that does not fit the golden's step most often means another case's candidate.
      throw h5::GoldenError(std::string(e.what()) + " (step" + std::to_string(s) + " of case " +
                            golden.case_id + " has " + std::to_string(golden.steps[s].num_tokens) +
                            " tokens: is this a candidate for another case?)");
    }
  return out;
}

}  // namespace

LseBase read_candidate_lse_base(const std::string& path, const ReadLimits& limits) {
  h5::File f = h5::File::open(path, limits.max_bytes);
  return detail::read_lse_base(f.root());
}

GoldenCase read(const std::string& path, const ReadLimits& limits) {
  // The child only walks the file through libhdf5 (h5::scan): what could crash or hang the
  // library there happens in the child; the strict checks run once, here.
  if (limits.contain)
    h5::contain(
        path, [&] { h5::scan(path, limits.max_bytes); }, limits.max_bytes);
  return read_here(path, limits);
}

std::string describe(const std::string& path, const ReadLimits& limits) {
  const auto line = [&] {
    const GoldenCase gc = read_here(path, limits);
    return "case " + gc.case_id + ", " + std::to_string(gc.cfg.num_layers) + " layers, " +
           std::to_string(gc.steps.size()) + " steps, " + std::to_string(gc.num_blocks) +
           " cache blocks";
  };
  return limits.contain ? h5::contain_report(path, line, limits.max_bytes) : line();
}

std::vector<StepTrace> read_candidate(const std::string& path, const GoldenCase& golden,
                                      const ReadLimits& limits) {
  if (limits.contain)
    h5::contain(
        path, [&] { read_candidate_here(path, golden, limits); }, limits.max_bytes);
  return read_candidate_here(path, golden, limits);
}

}  // namespace dsv32::golden

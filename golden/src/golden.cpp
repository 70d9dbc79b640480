#include "dsv32/golden/golden.hpp"

#include <functional>
#include <string>

#include "layout.hpp"

namespace dsv32::golden {
namespace {

using detail::Shape;
using detail::stage_shape;
using detail::trace_dtype;

Tensor as(const Tensor& t, DType dt) {
  Tensor o = t;
  o.dtype = dt;
  return o;
}

Tensor ints(const char* name, const std::vector<int>& v, Shape shape) {
  return Tensor::from(name, std::move(shape), std::vector<double>(v.begin(), v.end()),
                      DType::int32);
}

Tensor mat_tensor(const char* name, const Mat& m, DType dt) {
  return Tensor::from(name, m, dt);
}
Tensor vec_tensor(const char* name, const Vec& v, DType dt) {
  return Tensor::from(name, {v.size()}, std::vector<double>(v.data(), v.data() + v.size()), dt);
}

void write_trace(const h5::Group& g, const Config& cfg, const StepTrace& tr, bool exact,
                 const std::function<void()>& tick) {
  for (int l = 0; l < cfg.num_layers; ++l) {
    const h5::Group lg = g.child("layer" + std::to_string(l), true);
    for (const Tensor& t : tr.layers[l].tensors) {
      lg.write(as(t, trace_dtype(cfg, stage_info(t.name).stage, exact)));
      if (tick) tick();
    }
    // A golden has every rank's stages (generate makes them; read refuses one without them); a
    // candidate written in its layout may give its merge alone.
    if (cfg.dcp_size > 1 && tr.layers[l].dcp)
      detail::write_dcp_layer(lg, cfg, *tr.layers[l].dcp, exact);
  }
  g.write(as(tr.output, trace_dtype(cfg, Stage::output, exact)));
  if (tick) tick();
}

}  // namespace

namespace {

/// `c` as a golden file built in memory (for `path`'s messages); nothing is written yet.
h5::File build(const std::string& path, const GoldenCase& c, const std::function<void()>& tick) {
  h5::File f = h5::File::create(path);
  const h5::Group root = f.root();
  root.set_attr("schema", std::string(kSchema));
  // A file that gives a prefix is version 2 (GOLDEN.md); one without is byte for byte version 1.
  root.set_attr("schema_version", detail::has_prefixes(c) ? kSchemaVersionPrefix : kSchemaVersion);
  root.set_attr("generator", c.generator);
  root.set_attr("case_id", c.case_id);
  root.set_attr("seed", static_cast<std::int64_t>(c.seed));
  root.set_attr("config", config_to_json(c.cfg));
  root.set_attr("tolerance_profile", c.tolerance_profile);
  root.set_attr("num_blocks", static_cast<std::int64_t>(c.num_blocks));

  const h5::Group wg = root.child("weights", true);
  for (int l = 0; l < c.cfg.num_layers; ++l) {
    const LayerWeights& w = c.weights.layers[l];
    const h5::Group lg = wg.child("layer" + std::to_string(l), true);
    const DType b = DType::bfloat16;
    lg.write(mat_tensor("w_qkv_a", w.w_qkv_a, b));
    lg.write(vec_tensor("g_q", w.g_q, b));
    lg.write(vec_tensor("g_kv", w.g_kv, b));
    lg.write(mat_tensor("w_q_b", w.w_q_b, b));
    lg.write(mat_tensor("w_kv_b", w.w_kv_b, b));
    lg.write(mat_tensor("w_o", w.w_o, b));
    lg.write(vec_tensor("g_in", w.g_in, b));
    if (w.indexer) {
      const h5::Group ig = lg.child("indexer", true);
      ig.write(mat_tensor("w_q_b", w.indexer->w_q_b, b));
      ig.write(mat_tensor("w_k", w.indexer->w_k, b));
      ig.write(mat_tensor("w_w", w.indexer->w_w, b));
      ig.write(vec_tensor("g_k", w.indexer->g_k, b));
      ig.write(vec_tensor("b_k", w.indexer->b_k, b));
    }
    if (tick) tick();
  }

  const h5::Group sg = root.child("steps", true);
  const DType hidden_dt = c.cfg.precision == Precision::bf16 ? DType::bfloat16 : DType::float32;
  for (std::size_t s = 0; s < c.steps.size(); ++s) {
    const StepInput& in = c.steps[s];
    const h5::Group st = sg.child("step" + std::to_string(s), true);
    const h5::Group ig = st.child("inputs", true);
    const int Ta = in.num_tokens, R = static_cast<int>(in.requests.size());
    ig.set_attr("capture_size", static_cast<std::int64_t>(in.capture_size));
    ig.write(mat_tensor("hidden", in.hidden.topRows(Ta), hidden_dt));
    ig.write(
        ints("positions", std::vector<int>(in.positions.begin(), in.positions.begin() + Ta), {Ta}));
    ig.write(ints("slots", std::vector<int>(in.slots.begin(), in.slots.begin() + Ta), {Ta}));
    ig.write(ints("request_of_token", in.request_of_token, {Ta}));
    std::vector<int> ctx, q, ids;
    std::size_t max_blocks = 0;
    for (const RequestStep& r : in.requests) {
      ctx.push_back(r.ctx);
      q.push_back(r.q);
      ids.push_back(r.id);
      max_blocks = std::max(max_blocks, r.block_table.size());
    }
    std::vector<int> table(R * max_blocks, -1);
    for (int r = 0; r < R; ++r)
      std::copy(in.requests[r].block_table.begin(), in.requests[r].block_table.end(),
                table.begin() + static_cast<std::ptrdiff_t>(r * max_blocks));
    ig.write(ints("ctx_len", ctx, {R}));
    ig.write(ints("q_len", q, {R}));
    ig.write(ints("request_id", ids, {R}));
    ig.write(ints("block_table", table, {R, static_cast<std::int64_t>(max_blocks)}));
    if (c.cfg.dcp_size > 1) detail::write_dcp_tables(ig, in);
    write_trace(st.child("expected", true), c.cfg, c.expected[s], true, tick);
    write_trace(st.child("emulated", true), c.cfg, c.emulated[s], false, tick);
  }
  detail::write_prefixes(root, c);
  if (tick) tick();
  return f;
}

}  // namespace

std::string image(const std::string& path, const GoldenCase& c) {
  return build(path, c, {}).image();
}

namespace {

/// The check of a golden written to `tmp` before it takes the name `path`: its own reader.
std::function<void(const std::string&)> read_back(const std::string& path) {
  return [path](const std::string& tmp) {
    try {
      describe(tmp);  // read() whole, in a child process (one parse: nothing is kept)
    } catch (const h5::GoldenError& e) {
      throw h5::GoldenError(path + ": not written: its own reader refuses it: " + e.what());
    }
  };
}

}  // namespace

void write(const std::string& path, const GoldenCase& c, const std::function<void()>& tick,
           bool verify) {
  h5::File f = build(path, c, tick);
  if (!verify) return f.commit();
  f.commit(read_back(path));
}

files::StagedFiles::File stage(files::StagedFiles& out, const std::string& path,
                               const GoldenCase& c, const std::function<void()>& on_dataset,
                               bool verify) {
  return out.add(path, build(path, c, on_dataset).release_image(), {},
                 verify ? read_back(path) : nullptr);
}

}  // namespace dsv32::golden

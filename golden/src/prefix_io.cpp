// Given prefixes in a golden file (GOLDEN.md, "Given prefix"): /prefix/request{id}/layer{l}/
// in the cache's own format, written after the steps and attached, on reading, to the step where
// their request first appears.
#include <map>
#include <memory>
#include <set>
#include <string>

#include "dsv32/golden/golden.hpp"
#include "layout.hpp"

namespace dsv32::golden::detail {
namespace {

DType activation(const Config& cfg) {
  return cfg.precision == Precision::bf16 ? DType::bfloat16 : DType::float32;
}

/// The request id of a member named request{id} (plain decimal, at most 10 digits), else -1.
long long request_number(const std::string& name) {
  const std::string k = "request";
  if (name.size() <= k.size() || name.size() > k.size() + 10 || name.compare(0, k.size(), k) != 0 ||
      (name[k.size()] == '0' && name.size() > k.size() + 1))
    return -1;
  for (std::size_t i = k.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  const long long v = std::stoll(name.substr(k.size()));
  return v < (1ll << 31) ? v : -1;
}

/// Dataset `name` of `shape` (rank 1 or 2) read straight into a matrix.
Mat read_mat(const h5::Group& g, const std::string& name, DType dt, const Shape& shape) {
  Mat m;
  g.read_into(name, dt, shape, [&](std::size_t) {
    m.resize(shape.at(0), shape.size() > 1 ? shape[1] : 1);
    return m.data();
  });
  return m;
}

}  // namespace

bool has_prefixes(const GoldenCase& c) {
  for (const StepInput& in : c.steps)
    if (!in.given.empty()) return true;
  return false;
}

void write_prefixes(const h5::Group& root, const GoldenCase& c) {
  if (!has_prefixes(c)) return;
  const Config& cfg = c.cfg;
  const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
  const h5::Group pg = root.child("prefix", true);
  for (const StepInput& in : c.steps)
    for (const auto& g : in.given) {
      const h5::Group rg = pg.child("request" + std::to_string(g->request_id), true);
      rg.set_attr("length", static_cast<std::int64_t>(g->length));
      for (int l = 0; l < cfg.num_layers; ++l) {
        const PrefixLayer& pl = g->layers.at(l);
        const h5::Group lg = rg.child("layer" + std::to_string(l), true);
        lg.write(Tensor::from("latent", pl.latent, fp8 ? DType::float8_e4m3fn : activation(cfg)));
        if (fp8) lg.write(Tensor::from("latent_scale", pl.latent_scale, DType::float32));
        lg.write(Tensor::from("k_rope", pl.k_rope, activation(cfg)));
        if (!cfg.is_full_layer(l)) continue;
        lg.write(Tensor::from("index_k", pl.index_k, DType::float8_e4m3fn));
        lg.write(Tensor::from("index_scale", {pl.index_scale.size()},
                              std::vector<double>(pl.index_scale.data(),
                                                  pl.index_scale.data() + pl.index_scale.size()),
                              DType::float32));
      }
    }
}

namespace {

/// The members of /prefix, each checked (shapes, dtypes, values on their format's grid).
std::map<int, std::shared_ptr<const GivenPrefix>> read_given(const h5::Group& pg, const Config& cfg,
                                                             int num_blocks) {
  std::map<int, std::shared_ptr<const GivenPrefix>> given;
  const bool fp8 = cfg.kv_cache == KvCache::fp8_ds_mla;
  const std::int64_t L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, dI = cfg.index_head_dim;
  const std::int64_t slots = static_cast<std::int64_t>(num_blocks) * cfg.block_size;
  for (const std::string& name : pg.names()) {
    const long long id = request_number(name);
    if (id < 0)
      throw h5::GoldenError(pg.where(name) +
                            ": not a request (the members of /prefix are request{id})");
    const h5::Group rg = pg.child(name, false);
    const std::int64_t P = rg.attr_int("length");
    if (P < 1 || P > slots)
      throw h5::GoldenError(rg.where() + ": attribute length = " + std::to_string(P) +
                            " is outside [1, " + std::to_string(slots) + "] (the cache's slots)");
    auto g = std::make_shared<GivenPrefix>();
    g->request_id = static_cast<int>(id);
    g->length = static_cast<int>(P);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const h5::Group lg = rg.child("layer" + std::to_string(l), false);
      PrefixLayer pl;
      pl.latent = read_mat(lg, "latent", fp8 ? DType::float8_e4m3fn : activation(cfg), Shape{P, L});
      if (fp8)
        pl.latent_scale = read_mat(lg, "latent_scale", DType::float32,
                                   Shape{P, (L + kDsMlaTile - 1) / kDsMlaTile});
      pl.k_rope = read_mat(lg, "k_rope", activation(cfg), Shape{P, dr});
      if (cfg.is_full_layer(l)) {
        pl.index_k = read_mat(lg, "index_k", DType::float8_e4m3fn, Shape{P, dI});
        pl.index_scale = read_mat(lg, "index_scale", DType::float32, Shape{P}).col(0);
      }
      g->layers.push_back(std::move(pl));
    }
    try {
      g->check(cfg);
    } catch (const ScenarioError& e) {
      throw h5::GoldenError(rg.where() + ": " + e.what());
    }
    given[g->request_id] = std::move(g);
  }
  return given;
}

}  // namespace

void read_prefixes(const h5::Group& root, const Config& cfg, std::vector<StepInput>& steps,
                   int num_blocks) {
  const std::map<int, std::shared_ptr<const GivenPrefix>> given =
      root.has("prefix") ? read_given(root.child("prefix", false), cfg, num_blocks)
                         : std::map<int, std::shared_ptr<const GivenPrefix>>{};
  // Each request's first step: a context there must be its given prefix (caches start empty).
  std::set<int> seen, used;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    StepInput& in = steps[s];
    for (const RequestStep& r : in.requests) {
      if (!seen.insert(r.id).second || r.ctx == 0) continue;
      const auto it = given.find(r.id);
      const std::string where = root.where("steps/step" + std::to_string(s) + "/inputs");
      if (it == given.end())
        throw h5::GoldenError(where + ": request id " + std::to_string(r.id) +
                              " first appears with ctx_len " + std::to_string(r.ctx) +
                              " and the file gives no /prefix/request" + std::to_string(r.id) +
                              " (caches start empty; GOLDEN.md, \"Given prefix\")");
      if (it->second->length != r.ctx)
        throw h5::GoldenError(where + ": request id " + std::to_string(r.id) +
                              " first appears with ctx_len " + std::to_string(r.ctx) +
                              ", its given prefix has " + std::to_string(it->second->length) +
                              " positions");
      in.given.push_back(it->second);
      used.insert(r.id);
    }
  }
  for (const auto& [id, g] : given)
    if (!used.count(id))
      throw h5::GoldenError(root.where("prefix/request" + std::to_string(id)) +
                            ": no step starts request id " + std::to_string(id) +
                            " with a context (a prefix nothing reads)");
}

}  // namespace dsv32::golden::detail

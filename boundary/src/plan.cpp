#include "dsv32/boundary/plan.hpp"

#include <algorithm>

namespace dsv32::boundary {
namespace {

bool indexer_op(std::string_view op) {
  return op == "indexer_wk_proj" || op == "indexer_wq_b" || op == "indexer_topk";
}

}  // namespace

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> n;
    for (const OpInfo& o : kOpTable) n.emplace_back(o.name);
    return n;
  }();
  return ops;
}

bool is_host_op(std::string_view op) {
  const std::optional<Op> o = find_op(op);
  return o && is_host_op(*o);
}

Op op_of(std::string_view name) {
  if (const std::optional<Op> op = find_op(name)) return *op;
  throw PlanError("unknown op '" + std::string(name) + "'");
}

bool uniform_decode(const StepInput& in) {
  if (in.requests.empty()) return false;
  const int q = in.requests.front().q;
  if (q > kMaxUniformDecodeTokens) return false;
  for (const RequestStep& r : in.requests)
    if (r.q != q || (q > 1 && r.ctx == 0)) return false;
  return true;
}

std::vector<std::string> Plan::ops(const Config& cfg, int layer) const {
  std::vector<std::string> out;
  for (const std::string& op : op_names()) {
    if (indexer_op(op) && !cfg.is_full_layer(layer)) continue;
    if (copy_form ? op == "uv_proj" : (op == "latent_copy" || op == "uv_proj_static")) continue;
    out.push_back(op);
  }
  return out;
}

Placement Plan::at(int layer, const std::string& op) const {
  if (!capture) return Placement::eager;
  const auto& m = placement.at(layer);
  const auto it = m.find(op);
  return it == m.end() ? Placement::graph : it->second;
}

std::string Plan::signature() const {
  return mixed ? record_signature() + " mixed {" + mixed->signature() + "}" : record_signature();
}

const Plan& Plan::serving(const StepInput& in) const {
  if (!device_driven || !mixed || uniform_decode(in)) return *this;
  return *mixed;
}

std::string Plan::record_signature() const {
  std::string s = std::string(capture ? "capture" : "eager") + (copy_form ? " copy" : " no-copy") +
                  (allow_host_capture ? " host-capture" : "") +
                  (device_driven ? " device-driven" : "");
  for (std::size_t l = 0; l < placement.size(); ++l) {
    s += " |";
    for (const std::string& op : op_names())
      s += at(static_cast<int>(l), op) == Placement::graph ? 'G' : 'E';
  }
  return s;
}

std::vector<std::string> plan_names() {
  return {"eager", "breakable-eager",   "wide", "narrow", "narrow-copy",
          "full",  "full-and-piecewise"};
}

Plan plan_preset(std::string_view name, const Config& cfg) {
  if (name == "full-and-piecewise") return full_and_piecewise(cfg, "narrow");
  if (constexpr std::string_view fp = "full-and-piecewise:"; name.substr(0, fp.size()) == fp)
    return full_and_piecewise(cfg, name.substr(fp.size()));
  Plan p;
  p.name = std::string(name);
  std::vector<std::string> eager_ops;
  if (name == "eager") {
    p.capture = false;
  } else if (name == "breakable-eager") {
    eager_ops = op_names();
  } else if (name == "wide") {
    eager_ops = {"norm_rope_cache", "q_b_proj",     "uk_absorb",  "indexer_wq_b",
                 "fused_q",         "indexer_topk", "sparse_mqa", "uv_proj"};
  } else if (name == "narrow") {
    eager_ops = {"indexer_topk", "sparse_mqa", "uv_proj"};
  } else if (name == "narrow-copy") {
    p.copy_form = true;
    eager_ops = {"indexer_topk", "sparse_mqa", "latent_copy"};
  } else if (name == "full") {
    p.device_driven = true;
    p.mixed = std::make_shared<const Plan>(plan_preset("eager", cfg));
  } else {
    std::string known;
    for (const std::string& n : plan_names()) known += (known.empty() ? "" : ", ") + n;
    throw PlanError("unknown plan '" + std::string(name) + "' (known: " + known + ")");
  }
  p.placement.resize(cfg.num_layers);
  for (auto& layer : p.placement) {
    for (const std::string& op : op_names()) layer[op] = Placement::graph;
    for (const std::string& op : eager_ops) layer[op] = Placement::eager;
  }
  return p;
}

Plan full_and_piecewise(const Config& cfg, std::string_view piecewise) {
  Plan piece = plan_preset(piecewise, cfg);
  if (piece.device_driven)
    throw PlanError("full-and-piecewise: the piecewise plan '" + std::string(piecewise) +
                    "' is device-driven; it must serve steps that are not a uniform decode");
  Plan p = plan_preset("full", cfg);
  p.name =
      piecewise == "narrow" ? "full-and-piecewise" : "full-and-piecewise:" + std::string(piecewise);
  p.mixed = std::make_shared<const Plan>(std::move(piece));
  return p;
}

const std::vector<std::string>& mutant_names() {
  static const std::vector<std::string> names{
      "fresh-output",        "capture-host-op", "baked-short-prefill", "uv-captured-nocopy",
      "shared-layer-clears", "no-topk-clear",   "double-rope",         "padded-cache-write",
      "stale-positions",     "unjoined-stream", "full-for-mixed",      "stale-full-metadata",
      "stale-short-prefill", "verify-stride",   "topk-bin-overflow",   "topk-edge",
      "reused-block-skip",   "int32-offset"};
  return names;
}

std::string mutant_bait(std::string_view mutant) {
  if (mutant == "verify-stride") return "spec-verify";
  if (mutant == "topk-bin-overflow") return "topk-stress";
  if (mutant == "topk-edge") return "chunk-edges";
  if (mutant == "reused-block-skip") return "block-reuse";
  if (mutant == "int32-offset") return "spec-verify";  // any case: it runs on far blocks
  return "mutant-bait";
}

bool is_full_graph_mutant(std::string_view mutant) {
  return mutant == "full-for-mixed" || mutant == "stale-full-metadata" ||
         mutant == "stale-short-prefill" || mutant == "verify-stride";
}

std::string mutant_plan(std::string_view mutant) {
  return is_full_graph_mutant(mutant) ? "full-and-piecewise" : "narrow";
}

bool is_plan_mutant(std::string_view mutant) {
  return mutant == "capture-host-op" || mutant == "uv-captured-nocopy";
}

std::string stack_switch(std::string_view mutant) {
  return is_plan_mutant(mutant) ? std::string() : std::string(mutant);
}

StackMutant stack_mutant(std::string_view name) {
  static const std::pair<const char*, StackMutant> kStack[] = {
      {"fresh-output", StackMutant::fresh_output},
      {"baked-short-prefill", StackMutant::baked_short_prefill},
      {"shared-layer-clears", StackMutant::shared_layer_clears},
      {"no-topk-clear", StackMutant::no_topk_clear},
      {"double-rope", StackMutant::double_rope},
      {"padded-cache-write", StackMutant::padded_cache_write},
      {"stale-positions", StackMutant::stale_positions},
      {"unjoined-stream", StackMutant::unjoined_stream},
      {"full-for-mixed", StackMutant::full_for_mixed},
      {"stale-full-metadata", StackMutant::stale_full_metadata},
      {"stale-short-prefill", StackMutant::stale_short_prefill},
      {"verify-stride", StackMutant::verify_stride},
      {"topk-bin-overflow", StackMutant::topk_bin_overflow},
      {"topk-edge", StackMutant::topk_edge},
      {"reused-block-skip", StackMutant::reused_block_skip},
      {"int32-offset", StackMutant::int32_offset}};
  if (name.empty()) return StackMutant::none;
  for (const auto& [n, m] : kStack)
    if (name == n) return m;
  throw PlanError("'" + std::string(name) +
                  "' is not a stack mutant (plan mutants go through boundary::mutate_plan)");
}

Plan mutate_plan(const Plan& plan, std::string_view mutant) {
  const auto& names = mutant_names();
  if (std::find(names.begin(), names.end(), mutant) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    throw PlanError("unknown mutant '" + std::string(mutant) + "' (known: " + known + ")");
  }
  if (is_full_graph_mutant(mutant) && !plan.device_driven)
    throw PlanError("mutant '" + std::string(mutant) + "' is a bug of the full graphs: plan '" +
                    plan.name + "' has none (use full or full-and-piecewise)");
  if (!is_plan_mutant(mutant)) return plan;
  if (!plan.capture) throw PlanError("mutant '" + std::string(mutant) + "' needs a captured plan");
  Plan p = plan;
  p.name += "+" + std::string(mutant);
  p.allow_host_capture = true;
  for (auto& layer : p.placement) {
    if (mutant == "capture-host-op") layer["sparse_mqa"] = Placement::graph;
    if (mutant == "uv-captured-nocopy") {
      p.copy_form = false;
      layer["uv_proj"] = Placement::graph;
    }
  }
  return p;
}

std::vector<int> capture_sizes(int max_size) {
  if (max_size < 1) throw std::invalid_argument("capture sizes: max_size must be >= 1");
  std::vector<int> out;
  for (int s : {1, 2, 4})
    if (s <= max_size) out.push_back(s);
  for (int s = 8; s <= std::min(max_size, 256); s += 8) out.push_back(s);
  for (int s = 272; s <= max_size; s += 16) out.push_back(s);
  if (out.back() != max_size) out.push_back(max_size);
  return out;
}

int capture_size_for(const std::vector<int>& sizes, int num_tokens) {
  if (num_tokens < 1)
    throw std::invalid_argument("capture size: a step has at least one real token, got " +
                                std::to_string(num_tokens));
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), num_tokens);
  return it == sizes.end() ? 0 : *it;
}

void validate(const Plan& plan, const Config& cfg, bool allow_host_capture) {
  if (!plan.capture) return;
  allow_host_capture = allow_host_capture || plan.allow_host_capture;
  if (plan.device_driven) {
    if (plan.copy_form)
      throw PlanError("plan '" + plan.name +
                      "' is device-driven and uses the copy form: latent_copy has no "
                      "device-driven variant");
    if (!plan.mixed)
      throw PlanError(
          "plan '" + plan.name +
          "' is device-driven but names no plan for steps that are not a uniform decode");
    if (plan.mixed->device_driven)
      throw PlanError("plan '" + plan.name + "': its plan for mixed steps, '" + plan.mixed->name +
                      "', is device-driven itself");
    validate(*plan.mixed, cfg, allow_host_capture);
  }
  if (static_cast<int>(plan.placement.size()) != cfg.num_layers)
    throw PlanError("plan '" + plan.name + "' covers " + std::to_string(plan.placement.size()) +
                    " layers, the config has " + std::to_string(cfg.num_layers));
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (const auto& [op, where] : plan.placement[l])
      if (std::find(op_names().begin(), op_names().end(), op) == op_names().end())
        throw PlanError("plan '" + plan.name + "' layer " + std::to_string(l) + ": unknown op '" +
                        op + "'");
    if (allow_host_capture) continue;
    for (const std::string& op : plan.ops(cfg, l))
      if (is_host_op(op) && plan.at(l, op) == Placement::graph && !plan.device_driven)
        throw PlanError("plan '" + plan.name + "' layer " + std::to_string(l) + ": op '" + op +
                        "' depends on host metadata or a backend-owned buffer and has no "
                        "device-driven variant: it cannot be captured");
  }
}

}  // namespace dsv32::boundary

#include "dsv32/boundary/plan.hpp"

#include <algorithm>
#include <cstdint>

namespace dsv32::boundary {
namespace {

/// A set of ops as bits (1 << index(op)).
constexpr std::uint32_t ops_of(std::initializer_list<Op> ops) {
  std::uint32_t bits = 0;
  for (const Op op : ops) bits |= 1u << index(op);
  return bits;
}

struct PresetInfo {
  PlanPreset preset;
  std::string_view name;
  std::uint32_t eager_ops;  // ops_of: the ops that run eagerly between the segments
};

// The presets of BOUNDARIES.md section 2; `eager` (no capture), `full` (device-driven, `eager`
// for the other steps) and `full-and-piecewise` (built from `full` and `narrow`) are set in
// plan_preset.
constexpr std::array<PresetInfo, 7> kPresets{{
    {PlanPreset::eager, "eager", 0},
    {PlanPreset::breakable_eager, "breakable-eager", (1u << kNumOps) - 1},
    {PlanPreset::wide, "wide",
     ops_of({Op::norm_rope_cache, Op::q_b_proj, Op::uk_absorb, Op::indexer_wq_b, Op::fused_q,
             Op::indexer_topk, Op::sparse_mqa, Op::uv_proj})},
    {PlanPreset::narrow, "narrow", ops_of({Op::indexer_topk, Op::sparse_mqa, Op::uv_proj})},
    {PlanPreset::narrow_copy, "narrow-copy",
     ops_of({Op::indexer_topk, Op::sparse_mqa, Op::latent_copy})},
    {PlanPreset::full, "full", 0},
    {PlanPreset::full_and_piecewise, "full-and-piecewise", 0},
}};

/// The dispatch plan over `piece` (named `given` in messages; `narrow`: the default name).
Plan dispatch_over(const Config& cfg, Plan piece, std::string_view given, bool narrow) {
  if (piece.device_driven)
    throw PlanError("full-and-piecewise: the piecewise plan '" + std::string(given) +
                    "' is device-driven; it must serve steps that are not a uniform decode");
  Plan p = plan_preset(PlanPreset::full, cfg);
  p.name = narrow ? "full-and-piecewise" : "full-and-piecewise:" + std::string(given);
  p.mixed = std::make_shared<const Plan>(std::move(piece));
  return p;
}

}  // namespace

bool uniform_decode(const StepInput& in) {
  if (in.requests.empty()) return false;
  const int q = in.requests.front().q;
  if (q > kMaxUniformDecodeTokens) return false;
  for (const RequestStep& r : in.requests)
    if (r.q != q || (q > 1 && r.ctx == 0)) return false;
  return true;
}

OpList Plan::layer_ops(const Config& cfg, int layer) const {
  return dsv32::layer_ops(cfg, layer, copy_form);
}

Placement Plan::at(int layer, Op op) const {
  return capture ? placement.at(layer)[op] : Placement::eager;
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
    for (const OpInfo& op : kOpTable)
      s += at(static_cast<int>(l), op.op) == Placement::graph ? 'G' : 'E';
  }
  return s;
}

const std::string& plan_preset_name(PlanPreset p) {
  static const std::vector<std::string> names = plan_names();
  return names.at(static_cast<std::size_t>(p));
}

std::optional<PlanPreset> find_plan_preset(std::string_view name) {
  for (const PresetInfo& p : kPresets)
    if (p.name == name) return p.preset;
  return std::nullopt;
}

std::vector<std::string> plan_names() {
  std::vector<std::string> names;
  for (const PresetInfo& p : kPresets) names.emplace_back(p.name);
  return names;
}

Plan plan_preset(PlanPreset preset, const Config& cfg) {
  if (preset == PlanPreset::full_and_piecewise) return full_and_piecewise(cfg, PlanPreset::narrow);
  const PresetInfo& info = kPresets.at(static_cast<std::size_t>(preset));
  Plan p;
  p.name = std::string(info.name);
  p.capture = preset != PlanPreset::eager;
  p.copy_form = preset == PlanPreset::narrow_copy;
  if (preset == PlanPreset::full) {
    p.device_driven = true;
    p.mixed = std::make_shared<const Plan>(plan_preset(PlanPreset::eager, cfg));
  }
  p.placement.resize(cfg.num_layers);
  for (LayerPlacement& layer : p.placement)
    for (auto& [op, where] : layer)
      where = info.eager_ops & (1u << index(op)) ? Placement::eager : Placement::graph;
  return p;
}

Plan full_and_piecewise(const Config& cfg, PlanPreset piecewise) {
  return dispatch_over(cfg, plan_preset(piecewise, cfg), plan_preset_name(piecewise),
                       piecewise == PlanPreset::narrow);
}

Plan plan_preset(std::string_view name, const Config& cfg) {
  if (const std::optional<PlanPreset> p = find_plan_preset(name)) return plan_preset(*p, cfg);
  if (name.starts_with("full-and-piecewise:"))
    return full_and_piecewise(cfg, name.substr(name.find(':') + 1));
  std::string known;
  for (const PresetInfo& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw PlanError("unknown plan '" + std::string(name) + "' (known: " + known + ")");
}

Plan full_and_piecewise(const Config& cfg, std::string_view piecewise) {
  if (const std::optional<PlanPreset> p = find_plan_preset(piecewise))
    return full_and_piecewise(cfg, *p);
  // Not a preset: unknown (plan_preset throws), or "full-and-piecewise:P", device-driven.
  return dispatch_over(cfg, plan_preset(piecewise, cfg), piecewise, false);
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
  if (allow_host_capture || plan.device_driven) return;
  for (int l = 0; l < cfg.num_layers; ++l)
    for (const Op op : plan.layer_ops(cfg, l))
      if (is_host_op(op) && plan.at(l, op) == Placement::graph)
        throw PlanError("plan '" + plan.name + "' layer " + std::to_string(l) + ": op '" +
                        op_name(op) +
                        "' depends on host metadata or a backend-owned buffer and has no "
                        "device-driven variant: it cannot be captured");
}

}  // namespace dsv32::boundary

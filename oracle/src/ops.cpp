#include "dsv32/oracle/ops.hpp"

namespace dsv32 {

const std::string& op_name(Op op) {
  static const std::array<std::string, kNumOps> names = [] {
    std::array<std::string, kNumOps> n;
    for (const OpInfo& o : kOpTable) n[index(o.op)] = std::string(o.name);
    return n;
  }();
  return names[index(op)];
}

std::optional<Op> find_op(std::string_view name) {
  for (const OpInfo& o : kOpTable)
    if (o.name == name) return o.op;
  return std::nullopt;
}

OpList layer_ops(const Config& cfg, int layer, bool copy_form) {
  OpList out;
  const bool full = cfg.is_full_layer(layer);
  for (const OpInfo& o : kOpTable)
    if ((full || !o.f_only) && in_form(o.op, copy_form)) out.push_back(o.op);
  return out;
}

}  // namespace dsv32

// The ops of one layer (BOUNDARIES.md section 1) as a type, and the op table: one row per op,
// in execution order, with its name, its class (G: graph-safe; H: host metadata or a
// backend-owned output decides its launch), whether only F layers run it, and which form of the
// up-projection it belongs to. The oracle's step, the plans and the GPU's dispatch all walk it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dsv32/oracle/config.hpp"

namespace dsv32 {

enum class Op : std::uint8_t {
  input_norm,
  qkv_a_proj,
  indexer_wk_proj,
  norm_rope_cache,
  q_b_proj,
  uk_absorb,
  indexer_wq_b,
  fused_q,
  indexer_topk,
  sparse_mqa,
  uv_proj,
  latent_copy,
  uv_proj_static,
  o_proj,
  residual_add,
};
inline constexpr std::size_t kNumOps = 15;

/// G: capturable as it is. H: host metadata or a backend-owned buffer decide its launch; it is
/// captured only through a device-driven variant.
enum class OpClass : std::uint8_t { G, H };
/// Which form of the up-projection runs an op: both, the no-copy form (`uv_proj` on the
/// backend's output) or the copy form (`latent_copy` + `uv_proj_static`).
enum class OpForm : std::uint8_t { both, no_copy, copy };

struct OpInfo {
  Op op;
  std::string_view name;  // BOUNDARIES.md's, verbatim
  OpClass cls;
  bool f_only;  // the indexer's ops: F layers only
  OpForm form;
};

inline constexpr std::array<OpInfo, kNumOps> kOpTable{{
    {Op::input_norm, "input_norm", OpClass::G, false, OpForm::both},
    {Op::qkv_a_proj, "qkv_a_proj", OpClass::G, false, OpForm::both},
    {Op::indexer_wk_proj, "indexer_wk_proj", OpClass::G, true, OpForm::both},
    {Op::norm_rope_cache, "norm_rope_cache", OpClass::G, false, OpForm::both},
    {Op::q_b_proj, "q_b_proj", OpClass::G, false, OpForm::both},
    {Op::uk_absorb, "uk_absorb", OpClass::G, false, OpForm::both},
    {Op::indexer_wq_b, "indexer_wq_b", OpClass::G, true, OpForm::both},
    {Op::fused_q, "fused_q", OpClass::G, false, OpForm::both},
    {Op::indexer_topk, "indexer_topk", OpClass::H, true, OpForm::both},
    {Op::sparse_mqa, "sparse_mqa", OpClass::H, false, OpForm::both},
    {Op::uv_proj, "uv_proj", OpClass::H, false, OpForm::no_copy},
    {Op::latent_copy, "latent_copy", OpClass::H, false, OpForm::copy},
    {Op::uv_proj_static, "uv_proj_static", OpClass::G, false, OpForm::copy},
    {Op::o_proj, "o_proj", OpClass::G, false, OpForm::both},
    {Op::residual_add, "residual_add", OpClass::G, false, OpForm::both},
}};

constexpr std::size_t index(Op op) {
  return static_cast<std::size_t>(op);
}
constexpr const OpInfo& op_info(Op op) {
  return kOpTable[index(op)];
}
static_assert(
    [] {
      for (std::size_t i = 0; i < kNumOps; ++i)
        if (index(kOpTable[i].op) != i) return false;
      return true;
    }(),
    "the op table is in Op's order");

/// BOUNDARIES.md's name of `op` (a std::string, for messages built with +).
const std::string& op_name(Op op);
/// The op named `name`, or nullopt (the parse point of op names).
std::optional<Op> find_op(std::string_view name);
/// Class H: host metadata or a backend-owned output decide the op's launch.
constexpr bool is_host_op(Op op) {
  return op_info(op).cls == OpClass::H;
}
/// The indexer's ops, which only F layers run.
constexpr bool is_indexer_op(Op op) {
  return op_info(op).f_only;
}
/// Whether `op` runs in the copy form (`copy_form`) or the no-copy form of the up-projection.
constexpr bool in_form(Op op, bool copy_form) {
  const OpForm f = op_info(op).form;
  return f == OpForm::both || (f == OpForm::copy) == copy_form;
}

/// A value per op, indexed by Op.
template <class T>
struct OpArray {
  std::array<T, kNumOps> v{};
  constexpr T& operator[](Op op) { return v[index(op)]; }
  constexpr const T& operator[](Op op) const { return v[index(op)]; }
  constexpr auto begin() { return v.begin(); }
  constexpr auto end() { return v.end(); }
  constexpr auto begin() const { return v.begin(); }
  constexpr auto end() const { return v.end(); }
  friend constexpr bool operator==(const OpArray&, const OpArray&) = default;
};

/// Some ops in table order, without allocating (a layer's ops).
class OpList {
 public:
  constexpr void push_back(Op op) { ops_[n_++] = op; }
  constexpr const Op* begin() const { return ops_.data(); }
  constexpr const Op* end() const { return ops_.data() + n_; }
  constexpr std::size_t size() const { return n_; }
  constexpr Op operator[](std::size_t i) const { return ops_[i]; }

 private:
  std::array<Op, kNumOps> ops_{};
  std::size_t n_ = 0;
};

/// The ops layer `layer` runs, in order: the F-only ops only on F layers, and either form of the
/// up-projection (the oracle runs the no-copy form).
OpList layer_ops(const Config& cfg, int layer, bool copy_form = false);

}  // namespace dsv32

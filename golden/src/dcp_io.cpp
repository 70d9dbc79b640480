// A golden's decode-context-parallel parts (GOLDEN.md): each rank's block tables of a step, and
// each rank's stages of a layer under `layer{l}/rank{r}/`.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "dsv32/oracle/dcp.hpp"
#include "dsv32/oracle/trace_diff.hpp"
#include "layout.hpp"

namespace dsv32::golden::detail {
namespace {

std::string rank_name(int r) {
  return "rank" + std::to_string(r);
}

Tensor index_tensor(const char* name, const IndexRows& m) {
  return Tensor::from(name, {m.rows(), m.cols()},
                      std::vector<double>(m.data(), m.data() + m.size()), DType::int32);
}

Tensor real_tensor(const char* name, const Mat& m, Shape shape, DType dt) {
  return Tensor::from(name, std::move(shape), std::vector<double>(m.data(), m.data() + m.size()),
                      dt);
}

IndexRows index_rows(const Tensor& t) {
  IndexRows m(t.shape.at(0), t.shape.at(1));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<std::int64_t>(t.data[i]);
  return m;
}

/// Rank `rank`'s group of `layer`, refused by name when missing (`why` says what needs it).
h5::Group rank_group(const h5::Group& layer, int rank, const std::string& why) {
  if (!layer.has(rank_name(rank)))
    throw h5::GoldenError(layer.where(rank_name(rank)) + ": missing group (" + why + ")");
  return layer.child(rank_name(rank), false);
}

/// A rank's `topk` and `share` (T_a, K) into d, and its `olat` and `lse` read as `olat_dt` and
/// `lse_dt` (nullopt: the file's own dtype), returned to be checked and then kept (keep_rank).
std::pair<Tensor, Tensor> read_rank(const h5::Group& g, const Config& cfg, std::int64_t Ta,
                                    std::optional<DType> olat_dt, std::optional<DType> lse_dt,
                                    DcpLayerTrace& d) {
  const Shape rows{Ta, cfg.index_topk};
  d.rows.push_back(index_rows(g.read("topk", DType::int32, rows)));
  d.share.push_back(index_rows(g.read("share", DType::int32, rows)));
  // (The file's dtype is asked only where none is given: a golden's missing dataset is named
  // by its read.)
  Tensor olat =
      g.read("olat", olat_dt ? *olat_dt : g.dtype("olat"), stage_shape(cfg, Stage::olat, Ta));
  Tensor lse = g.read("lse", lse_dt ? *lse_dt : g.dtype("lse"), stage_shape(cfg, Stage::lse, Ta));
  return {std::move(olat), std::move(lse)};
}

/// A rank's olat (T_a, H Lkv) and lse (T_a, H) into d.
void keep_rank(const Config& cfg, std::int64_t Ta, const Tensor& olat, const Tensor& lse,
               DcpLayerTrace& d) {
  d.olat.emplace_back(
      Eigen::Map<const Mat>(olat.data.data(), Ta, std::int64_t{cfg.num_heads} * cfg.kv_lora_rank));
  d.lse.emplace_back(Eigen::Map<const Mat>(lse.data.data(), Ta, cfg.num_heads));
}

}  // namespace

void write_dcp_tables(const h5::Group& inputs, const StepInput& in) {
  for (std::size_t rank = 0; rank < in.dcp_tables.size(); ++rank) {
    const auto& tables = in.dcp_tables[rank];
    std::size_t width = 0;
    for (const auto& t : tables) width = std::max(width, t.size());
    std::vector<double> flat(tables.size() * width, -1.0);
    for (std::size_t r = 0; r < tables.size(); ++r)
      std::copy(tables[r].begin(), tables[r].end(), flat.begin() + r * width);
    inputs.child(rank_name(static_cast<int>(rank)), true)
        .write(Tensor::from(
            "block_table",
            {static_cast<std::int64_t>(tables.size()), static_cast<std::int64_t>(width)},
            std::move(flat), DType::int32));
  }
}

void read_dcp_tables(const h5::Group& inputs, const Config& cfg, StepInput& in, int num_blocks) {
  const std::int64_t R = static_cast<std::int64_t>(in.requests.size());
  in.dcp_tables.assign(cfg.dcp_size, {});
  for (int rank = 0; rank < cfg.dcp_size; ++rank) {
    if (!inputs.has(rank_name(rank)))
      throw h5::GoldenError(inputs.where(rank_name(rank)) + ": missing group (dcp_size " +
                            std::to_string(cfg.dcp_size) + " needs each rank's block tables)");
    const h5::Group g = inputs.child(rank_name(rank), false);
    const Tensor t = g.read("block_table", DType::int32, std::nullopt,
                            std::max<std::int64_t>(R, 1) * std::max(num_blocks, 1));
    if (t.shape.size() != 2 || t.shape[0] != R)
      throw h5::GoldenError(g.where("block_table") + ": shape " + t.shape_string() +
                            ", expected (" + std::to_string(R) + ", max_blocks)");
    for (std::int64_t r = 0; r < R; ++r) {
      std::vector<int>& table = in.dcp_tables[rank].emplace_back();
      for (std::int64_t b = 0; b < t.shape[1]; ++b) {
        const double id = t.data[r * t.shape[1] + b];
        if (id < 0) break;  // -1 pads a shorter table
        table.push_back(static_cast<int>(id));
      }
    }
  }
  try {
    check_dcp_tables(in, cfg, in.dcp_tables, num_blocks);
  } catch (const ScenarioError& e) {
    throw h5::GoldenError(inputs.where() + ": " + e.what());
  }
}

void write_dcp_layer(const h5::Group& layer, const Config& cfg, const DcpLayerTrace& d,
                     bool exact) {
  for (std::size_t rank = 0; rank < d.rows.size(); ++rank) {
    const h5::Group g = layer.child(rank_name(static_cast<int>(rank)), true);
    const std::int64_t Ta = d.rows[rank].rows();
    g.write(index_tensor("topk", d.rows[rank]));
    g.write(index_tensor("share", d.share[rank]));
    g.write(real_tensor("olat", d.olat[rank], stage_shape(cfg, Stage::olat, Ta),
                        trace_dtype(cfg, Stage::olat, exact)));
    g.write(real_tensor("lse", d.lse[rank], stage_shape(cfg, Stage::lse, Ta),
                        trace_dtype(cfg, Stage::lse, exact)));
  }
}

DcpLayerTrace read_dcp_layer(const h5::Group& layer, const Config& cfg, std::int64_t Ta,
                             bool exact) {
  DcpLayerTrace d;
  for (int rank = 0; rank < cfg.dcp_size; ++rank) {
    const h5::Group g = rank_group(layer, rank, "dcp_size " + std::to_string(cfg.dcp_size));
    const auto [olat, lse] = read_rank(g, cfg, Ta, trace_dtype(cfg, Stage::olat, exact),
                                       trace_dtype(cfg, Stage::lse, exact), d);
    const std::int64_t H = cfg.num_heads, L = cfg.kv_lora_rank;
    // Finite everywhere, but for an empty share's lse: -inf (no key, MATH.md).
    for (std::int64_t t = 0; t < Ta; ++t) {
      const bool empty = d.share.back()(t, 0) < 0;
      for (std::int64_t h = 0; h < H; ++h) {
        const double v = lse.data[t * H + h];
        if (!(std::isfinite(v) || (empty && v == -INFINITY)))
          throw h5::GoldenError(g.where("lse") + ": " + std::to_string(v) + " at " +
                                lse.index_string(t * H + h) +
                                (empty ? "" : " (the rank's share of the row is not empty)"));
      }
      for (std::int64_t e = t * H * L; e < (t + 1) * H * L; ++e)
        if (!std::isfinite(olat.data[e]))
          throw h5::GoldenError(g.where("olat") + ": " + std::to_string(olat.data[e]) + " at " +
                                olat.index_string(e));
    }
    keep_rank(cfg, Ta, olat, lse, d);
  }
  return d;
}

std::optional<DcpLayerTrace> read_candidate_dcp_layer(const h5::Group& layer, const Config& cfg,
                                                      std::int64_t Ta) {
  int present = 0;
  for (int rank = 0; rank < cfg.dcp_size; ++rank) present += layer.has(rank_name(rank)) ? 1 : 0;
  if (present == 0) return std::nullopt;  // the merge alone
  DcpLayerTrace d;
  for (int rank = 0; rank < cfg.dcp_size; ++rank) {
    const h5::Group g = rank_group(layer, rank, "a candidate gives every rank's stages or none");
    for (const std::string& member : g.names())
      if (member != "topk" && member != "share" && member != "olat" && member != "lse")
        throw h5::GoldenError(g.where(member) +
                              ": unknown member of a rank (topk, share, olat, lse)");
    // Any float dtype; NaN and infinities are the judge's to name (an empty rank's lse).
    const auto [olat, lse] = read_rank(g, cfg, Ta, std::nullopt, std::nullopt, d);
    keep_rank(cfg, Ta, olat, lse, d);
  }
  return d;
}

LseBase read_lse_base(const h5::Group& root) {
  if (!root.has_attr("lse_base")) return LseBase::e;
  const std::string b = root.attr_string("lse_base");
  if (b == "e") return LseBase::e;
  if (b == "2") return LseBase::two;
  throw h5::GoldenError(root.where() + ": attribute lse_base = '" + b +
                        "': expected 'e' (natural log, the default) or '2'");
}

}  // namespace dsv32::golden::detail

#include "dsv32/oracle/scenario.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>

#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32 {
namespace {
std::string req_name(const RequestStep& r, std::size_t i) {
  return "request " + std::to_string(i) + " (id " + std::to_string(r.id) + ")";
}
}  // namespace

void StepInput::derive(const Config& cfg, int num_blocks) {
  const int B = cfg.block_size;
  if (requests.empty()) throw ScenarioError("step has no requests");
  std::set<int> ids, used_blocks;
  int Ta = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const RequestStep& r = requests[i];
    if (!ids.insert(r.id).second) throw ScenarioError(req_name(r, i) + ": duplicate request id");
    if (r.q < 1) throw ScenarioError(req_name(r, i) + ": q_len must be >= 1");
    if (r.ctx < 0) throw ScenarioError(req_name(r, i) + ": ctx_len must be >= 0");
    const std::int64_t cache_slots = static_cast<std::int64_t>(num_blocks) * B;
    if (static_cast<std::int64_t>(r.ctx) + r.q > cache_slots)
      throw ScenarioError(req_name(r, i) + ": ctx_len " + std::to_string(r.ctx) + " + q_len " +
                          std::to_string(r.q) + " exceeds the cache's " +
                          std::to_string(cache_slots) + " slots");
    const int need = static_cast<int>((static_cast<std::int64_t>(r.seq_len()) + B - 1) / B);
    if (static_cast<int>(r.block_table.size()) < need)
      throw ScenarioError(req_name(r, i) + ": block table has " +
                          std::to_string(r.block_table.size()) + " blocks, needs " +
                          std::to_string(need));
    for (int b = 0; b < need; ++b) {
      const int blk = r.block_table[b];
      if (blk < 0 || blk >= num_blocks)
        throw ScenarioError(req_name(r, i) + ": block id " + std::to_string(blk) +
                            " outside the cache's " + std::to_string(num_blocks) + " blocks");
      if (!used_blocks.insert(blk).second)
        throw ScenarioError(req_name(r, i) + ": block " + std::to_string(blk) +
                            " is used twice in this step");
    }
    Ta += r.q;
  }
  std::set<int> given_ids;
  for (const auto& g : given) {
    if (!g) throw ScenarioError("step has an empty given prefix");
    const auto it = std::find_if(requests.begin(), requests.end(),
                                 [&](const RequestStep& r) { return r.id == g->request_id; });
    if (it == requests.end())
      throw ScenarioError("given prefix of request id " + std::to_string(g->request_id) +
                          ": no such request in this step");
    if (!given_ids.insert(g->request_id).second)
      throw ScenarioError("request id " + std::to_string(g->request_id) +
                          ": two given prefixes in one step");
    if (it->ctx != g->length)
      throw ScenarioError(req_name(*it, static_cast<std::size_t>(it - requests.begin())) +
                          ": ctx_len " + std::to_string(it->ctx) + " but a given prefix of " +
                          std::to_string(g->length) + " positions");
    if (static_cast<int>(g->layers.size()) != cfg.num_layers)
      throw ScenarioError("given prefix of request id " + std::to_string(g->request_id) + ": " +
                          std::to_string(g->layers.size()) + " layers, the config has " +
                          std::to_string(cfg.num_layers));
  }
  if (capture_size == 0) capture_size = Ta;
  if (capture_size < Ta)
    throw ScenarioError("capture_size " + std::to_string(capture_size) + " < " +
                        std::to_string(Ta) + " real tokens");
  if (hidden.rows() != capture_size || hidden.cols() != cfg.hidden_size)
    throw ScenarioError("hidden has shape (" + std::to_string(hidden.rows()) + ", " +
                        std::to_string(hidden.cols()) + "), expected (" +
                        std::to_string(capture_size) + ", " + std::to_string(cfg.hidden_size) +
                        ")");
  num_tokens = Ta;
  positions.assign(capture_size, 0);
  slots.assign(capture_size, -1);
  request_of_token.assign(Ta, 0);
  token_start.assign(requests.size() + 1, 0);
  int t = 0;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    token_start[r] = t;
    for (int i = 0; i < requests[r].q; ++i, ++t) {
      positions[t] = requests[r].ctx + i;
      slots[t] = slot_of(static_cast<int>(r), positions[t], B);
      request_of_token[t] = static_cast<int>(r);
      if (!hidden.row(t).allFinite())
        throw ScenarioError("hidden row " + std::to_string(t) + " (a real token of " +
                            req_name(requests[r], r) + ") has NaN or Inf");
    }
  }
  token_start[requests.size()] = t;
}

std::int64_t StepInput::slot_of(int r, int position, int block_size) const {
  const RequestStep& q = requests.at(r);
  return static_cast<std::int64_t>(q.block_table.at(position / block_size)) * block_size +
         position % block_size;
}

int max_capture_size(const std::vector<StepInput>& steps) {
  int T = 1;
  for (const StepInput& in : steps) T = std::max(T, in.capture_size);
  return T;
}

ScenarioBuilder::ScenarioBuilder(const Config& cfg, std::uint64_t seed, int num_blocks)
    : cfg_(cfg), seed_(seed), num_blocks_(num_blocks) {
  cfg_.validate();
  // Fisher-Yates with the counter RNG: physical blocks are handed out in a permuted order.
  free_.resize(num_blocks);
  for (int i = 0; i < num_blocks; ++i) free_[i] = i;
  const rng::Stream s(seed, "blocks");
  for (int i = num_blocks - 1; i > 0; --i)
    std::swap(free_[i], free_[s.below(i, static_cast<std::uint64_t>(i) + 1)]);
}

HiddenShape ScenarioBuilder::shape_of(int id) const {
  const auto it = shapes_.find(id);
  return it == shapes_.end() ? HiddenShape{} : it->second;
}

std::vector<double> ScenarioBuilder::hidden_row(int id, int position) const {
  std::string key = "hidden/request" + std::to_string(id);
  if (const auto it = shapes_.find(id); it != shapes_.end()) {
    const HiddenShape& h = it->second;
    if (std::find(h.distinct.begin(), h.distinct.end(), position) != h.distinct.end())
      key += "/distinct";  // the position's own row, drawn apart from the repeated ones
    else if (h.repeat > 0)
      position %= h.repeat;
  }
  const rng::Stream s(seed_, key);
  const int D = cfg_.hidden_size;
  std::vector<double> row(D);
  for (int d = 0; d < D; ++d) {
    const double v = std::sqrt(3.0) * s.symmetric(static_cast<std::uint64_t>(position) * D + d);
    row[d] = cfg_.precision == Precision::bf16 ? round_bf16(v) : static_cast<float>(v);
  }
  return row;
}

StepInput ScenarioBuilder::step(const std::vector<StepRequest>& reqs, int capture_size,
                                Poison pad) {
  StepInput in;
  int Ta = 0;
  for (const StepRequest& sr : reqs) {
    if (std::find(finished_.begin(), finished_.end(), sr.id) != finished_.end())
      throw ScenarioError("request id " + std::to_string(sr.id) + " was finished");
    if (sr.given_prefix < 0)
      throw ScenarioError("request id " + std::to_string(sr.id) + ": given prefix " +
                          std::to_string(sr.given_prefix) + " < 0");
    if (sr.given_prefix > 0 && live_.count(sr.id))
      throw ScenarioError("request id " + std::to_string(sr.id) +
                          ": a given prefix only on a request's first step");
    Live& lv = live_[sr.id];
    if (sr.given_prefix > 0) {
      lv.ctx = sr.given_prefix;
      in.given.push_back(std::make_shared<const GivenPrefix>(
          draw_prefix(cfg_, seed_, sr.id, sr.given_prefix, shape_of(sr.id))));
    }
    const int need = (lv.ctx + sr.q + cfg_.block_size - 1) / cfg_.block_size;
    while (static_cast<int>(lv.blocks.size()) < need) {
      if (free_.empty())
        throw ScenarioError("out of cache blocks (" + std::to_string(num_blocks_) + ")");
      lv.blocks.push_back(free_.back());
      free_.pop_back();
    }
    in.requests.push_back(RequestStep{sr.id, lv.ctx, sr.q, lv.blocks});
    Ta += sr.q;
  }
  const int T = capture_size ? capture_size : Ta;
  in.capture_size = T;
  const double fill = pad == Poison::nan    ? std::numeric_limits<double>::quiet_NaN()
                      : pad == Poison::huge ? 1e30
                                            : 0.0;
  in.hidden = Mat::Constant(T, cfg_.hidden_size, fill);
  int t = 0;
  for (const RequestStep& r : in.requests)
    for (int i = 0; i < r.q; ++i, ++t) {
      const std::vector<double> row = hidden_row(r.id, r.ctx + i);
      in.hidden.row(t) = Eigen::Map<const Eigen::RowVectorXd>(row.data(), cfg_.hidden_size);
    }
  in.derive(cfg_, num_blocks_);
  for (const StepRequest& sr : reqs) live_[sr.id].ctx += sr.q;
  return in;
}

void ScenarioBuilder::finish(int id) {
  auto it = live_.find(id);
  if (it == live_.end()) throw ScenarioError("finish: unknown request id " + std::to_string(id));
  for (int b : it->second.blocks) free_.push_back(b);
  live_.erase(it);
  finished_.push_back(id);
}

int ScenarioBuilder::ctx(int id) const {
  auto it = live_.find(id);
  return it == live_.end() ? 0 : it->second.ctx;
}

}  // namespace dsv32

// RapidCheck generators for configs, request batches and tie-stress score rows. Values shrink
// towards the small tiny-config corner, so minimal counterexamples read easily.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/scenario.hpp"

namespace dsv32 {

/// One line per config, every switch named (RapidCheck prints it for counterexamples).
inline void showValue(const Config& c, std::ostream& os) {
  os << "Config{D=" << c.hidden_size << " H=" << c.num_heads << " Rq=" << c.q_lora_rank
     << " Lkv=" << c.kv_lora_rank << " dn=" << c.qk_nope_head_dim << " dr=" << c.qk_rope_head_dim
     << " dv=" << c.v_head_dim << " HI=" << c.index_n_heads << " K=" << c.index_topk
     << " B=" << c.block_size << " pattern=" << c.index_topk_pattern
     << " indexer_rope=" << to_string(c.indexer_rope) << " hadamard=" << to_string(c.hadamard)
     << " kv_cache=" << to_string(c.kv_cache) << " rope_table=" << to_string(c.rope_table)
     << " precision=" << to_string(c.precision) << (c.rope_scaling ? " yarn" : " plain-rope")
     << "}";
}

inline void showValue(Poison p, std::ostream& os) {
  os << (p == Poison::nan ? "Poison::nan" : p == Poison::huge ? "Poison::huge" : "Poison::zeros");
}

namespace gen {

/// Small configs with every switch of MATH.md drawn at random; `layers` fixes the depth (0: 1..3).
inline rc::Gen<Config> config(int layers = 0) {
  return rc::gen::exec([layers] {
    Config c = preset("tiny");
    c.name = "generated";
    c.hidden_size = *rc::gen::inRange(16, 97);
    c.num_heads = *rc::gen::inRange(1, 5);
    c.q_lora_rank = *rc::gen::inRange(8, 49);
    c.kv_lora_rank = *rc::gen::inRange(8, 49);
    c.qk_nope_head_dim = *rc::gen::inRange(2, 17);
    c.qk_rope_head_dim = 2 * *rc::gen::inRange(1, 5);
    c.v_head_dim = *rc::gen::inRange(2, 17);
    c.index_n_heads = *rc::gen::inRange(1, 5);
    c.index_topk = *rc::gen::inRange(1, 17);
    c.block_size = *rc::gen::inRange(1, 8);
    c.num_layers = layers ? layers : *rc::gen::inRange(1, 4);
    c.index_topk_pattern = "F";
    for (int l = 1; l < c.num_layers; ++l) c.index_topk_pattern += *rc::gen::element('F', 'S');
    c.indexer_rope = *rc::gen::element(IndexerRope::neox, IndexerRope::interleaved);
    c.hadamard = *rc::gen::element(Hadamard::off, Hadamard::on);
    c.kv_cache = *rc::gen::element(KvCache::bf16, KvCache::fp8_ds_mla);
    c.rope_table = *rc::gen::element(RopeTable::fp32, RopeTable::bf16);
    c.precision = *rc::gen::element(Precision::bf16, Precision::fp32);
    if (*rc::gen::element(true, false)) c.rope_scaling.reset();
    c.validate();
    return c;
  });
}

/// A request of a batch: `prefill` tokens cached by earlier steps (0: new), `q` new tokens now.
struct Req {
  int prefill = 0;
  int q = 1;
};

inline void showValue(const Req& r, std::ostream& os) {
  os << "{prefill " << r.prefill << ", q " << r.q << "}";
}

/// 1..4 requests; contexts mostly short, sometimes long (up to 300, far beyond K); q of 1
/// (decode) or more (prefill/extend), up to 64 new tokens.
inline rc::Gen<std::vector<Req>> batch() {
  return rc::gen::exec([] {
    const int n = *rc::gen::inRange(1, 5);
    std::vector<Req> reqs(n);
    for (Req& r : reqs) {
      r.prefill = *rc::gen::weightedOneOf<int>(
          {{4, rc::gen::inRange(0, 24)}, {1, rc::gen::inRange(24, 301)}});
      r.q = *rc::gen::weightedOneOf<int>(
          {{2, rc::gen::just(1)}, {2, rc::gen::inRange(1, 9)}, {1, rc::gen::inRange(9, 65)}});
    }
    return reqs;
  });
}

/// A permutation of 0..n-1 (shrinks towards the identity).
inline rc::Gen<std::vector<int>> permutation(int n) {
  return rc::gen::exec([n] {
    std::vector<int> p(n);
    for (int i = 0; i < n; ++i) p[i] = i;
    for (int i = n - 1; i > 0; --i) std::swap(p[i], p[*rc::gen::inRange(0, i + 1)]);
    return p;
  });
}

/// Score rows with heavy ties: values share all but their lowest bits, or are exactly equal.
inline rc::Gen<std::vector<double>> tie_stress_scores() {
  return rc::gen::exec([] {
    const int n = *rc::gen::inRange(1, 200);
    const int levels = *rc::gen::inRange(1, 6);
    std::vector<double> s(n);
    for (double& v : s) v = 1.0 + *rc::gen::inRange(0, levels) * 0x1p-50;
    return s;
  });
}

}  // namespace gen
}  // namespace dsv32

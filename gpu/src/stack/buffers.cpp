// The stack's buffers: allocation, the weights' and the step's uploads, the kernels' geometry.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "../kernels/cache.cuh"
#include "../kernels/index_scores.cuh"
#include "../kernels/topk_select.cuh"
#include "../kernels/uk_absorb.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {

using detail::download;
using detail::from_storage;
using detail::to_storage;
using detail::upload;
using detail::zeros;

template <class S>
StackImpl<S>::StackImpl(const Config& c, const Weights& w, int num_blocks, int max_tokens, int dev,
                        RankGather* gather, const StackOptions& opt)
    : num_blocks_(num_blocks),
      max_tokens_(max_tokens),
      rope_(c),
      gather_(gather),
      faults_(c, std::max(max_tokens, 1)) {
  cfg = c;
  options = opt;
  device = dev;
  cfg.validate();
  w.check_shapes(cfg);
  if (max_tokens < 1) throw std::invalid_argument("gpu stack: max_tokens must be >= 1");
  if (cfg.dcp_size > 1 && cfg.dcp_indexer_mode != DcpIndexerMode::exact)
    throw std::invalid_argument(
        "gpu stack: dcp_indexer_mode union is not built on the GPU (exact only)");
  if (opt.block_offset < 0 || opt.block_offset > INT32_MAX - static_cast<long long>(num_blocks))
    throw std::invalid_argument("gpu stack: block_offset " + std::to_string(opt.block_offset) +
                                " puts block ids past 2^31 - 1");
  const long long slots = (num_blocks + opt.block_offset) * cfg.block_size;
  for (int l = 0; l < cfg.num_layers; ++l) buf_.layers.push_back(make_layer(w.layers[l], l, slots));
  const std::size_t T = static_cast<std::size_t>(max_tokens);
  buf_.h = zeros<S>(T * cfg.hidden_size);
  buf_.topk = zeros<int>(T * cfg.index_topk, 0xFF);
  buf_.topk_paths = zeros<int>(k::kTopkRowPaths);
  for (auto& r : buf_.ring) r = zeros<S>(T * cfg.num_heads * cfg.kv_lora_rank);
  step_.positions = zeros<int>(T);
  step_.live = zeros<int>(T + 3);
  for (auto& ld : buf_.layers) o_ptr_.push_back(ld.o->get());
  step_.slots = zeros<long long>(T);
  step_.request_of_token = zeros<int>(T);
  step_.max_blocks = num_blocks;  // a request can own at most every block
  step_.block_table = zeros<int>(T * static_cast<std::size_t>(step_.max_blocks), 0xFF);
  step_.max_len = num_blocks * cfg.block_size;  // no context can exceed the cache
  buf_.scores = zeros<float>(T * static_cast<std::size_t>(step_.max_len));
  grow_rope(step_.max_len);
  // sparse_mqa: the gathered keys, scores, P (S), P.V in fp32, each row's max and sum.
  const std::size_t HK = static_cast<std::size_t>(cfg.num_heads) * cfg.index_topk;
  buf_.mqa_keys = zeros<S>(T * cfg.index_topk *
                           static_cast<std::size_t>(cfg.kv_lora_rank + cfg.qk_rope_head_dim));
  buf_.mqa_z = zeros<float>(T * HK);
  buf_.mqa_p = zeros<S>(T * HK);
  buf_.mqa_acc = zeros<float>(T * cfg.num_heads * static_cast<std::size_t>(cfg.kv_lora_rank));
  buf_.mqa_ml = zeros<float>(T * cfg.num_heads * 2);
  buf_.uv_rows = zeros<S>(T * cfg.num_heads * static_cast<std::size_t>(cfg.v_head_dim));
  if (cfg.dcp_size > 1) {  // the ranks emulated here, one after the other (attention.cu)
    const std::size_t W = static_cast<std::size_t>(cfg.dcp_size);
    buf_.dcp_share = zeros<int>(T * cfg.index_topk);
    buf_.dcp_sets = zeros<int>(T * cfg.index_topk);
    buf_.dcp_olat = zeros<S>(W * T * cfg.num_heads * static_cast<std::size_t>(cfg.kv_lora_rank));
    buf_.dcp_lse = zeros<float>(W * T * cfg.num_heads);
  }
  if (gather_) {  // o_proj's partial rows and every rank's, gathered
    buf_.ypart = zeros<S>(T * cfg.hidden_size);
    buf_.parts = zeros<S>(T * cfg.hidden_size * static_cast<std::size_t>(gather_->ranks()));
  }
  step_.T = 1;
  check(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  k::allow_index_scores_smem(dims());
  k::allow_uk_small_smem<S>();
  check(cudaDeviceSynchronize(), "stack setup");
}

template <class S>
StackImpl<S>::~StackImpl() {
  captures_.clear();  // before the streams they were captured on
}

template <class S>
void StackImpl<S>::synthesize_context(const StepInput& in) {
  if (options.block_offset != 0)
    throw std::invalid_argument("gpu stack: synthesize_context does not place far blocks");
  const k::Dims d = dims();
  for (const RequestStep& r : in.requests) {
    if (r.ctx == 0) continue;
    const auto table = upload(r.block_table, "synthesize");
    for (int l = 0; l < cfg.num_layers; ++l)
      k::launch_synthesize<S>({streams_.main(), "synthesize"}, d, table->get(), r.ctx,
                              buf_.layers[l].kv, buf_.layers[l].index, cfg.is_full_layer(l));
    check(cudaStreamSynchronize(streams_.main()), "synthesize");
  }
}

template <class S>
std::vector<double> StackImpl<S>::residual(int T) {
  const std::vector<S> host =
      download(buf_.h->get(), static_cast<std::size_t>(T) * cfg.hidden_size);
  std::vector<double> out(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) out[i] = from_storage(host[i]);
  return out;
}

template <class S>
std::vector<long> StackImpl<S>::topk_row_paths() {
  streams_.synchronize("top-k path counts");
  const std::vector<int> n = download(buf_.topk_paths->get(), k::kTopkRowPaths);
  return {n.begin(), n.end()};
}

template <class S>
LayerDev<S> StackImpl<S>::make_layer(const LayerWeights& w, int l, long long slots) {
  LayerDev<S> ld;
  const auto up = [](const auto& m) {
    return upload<S>(m.data(), static_cast<std::size_t>(m.size()));
  };
  ld.w_qkv_a = up(w.w_qkv_a);
  ld.g_q = up(w.g_q);
  ld.g_kv = up(w.g_kv);
  ld.w_q_b = up(w.w_q_b);
  ld.w_kv_b = up(w.w_kv_b);
  ld.w_o = up(w.w_o);
  ld.g_in = up(w.g_in);
  const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim, H = cfg.num_heads;
  const int HI = cfg.index_n_heads, dI = cfg.index_head_dim;
  if (cfg.kv_cache == KvCache::fp8_ds_mla) {
    ld.owned_bytes.push_back(zeros<std::uint8_t>(slots * L));
    ld.kv.codes = ld.owned_bytes.back()->get();
    ld.owned_floats.push_back(zeros<float>(slots * tiles()));
    ld.kv.scales = ld.owned_floats.back()->get();
  } else {
    ld.owned_s.push_back(zeros<S>(slots * L, 0xFF));  // NaN-poisoned: a wrong read shows up
    ld.kv.latent = ld.owned_s.back()->get();
  }
  ld.owned_s.push_back(zeros<S>(slots * dr, 0xFF));
  ld.kv.rope = ld.owned_s.back()->get();
  if (cfg.is_full_layer(l)) {
    const IndexerWeights& iw = *w.indexer;
    ld.iw_q_b = up(iw.w_q_b);
    Mat kw(iw.w_k.rows() + iw.w_w.rows(), iw.w_k.cols());
    kw << iw.w_k, iw.w_w;
    ld.iw_kw = up(kw);
    ld.ig_k = up(iw.g_k);
    ld.ib_k = up(iw.b_k);
    ld.owned_bytes.push_back(zeros<std::uint8_t>(slots * dI, 0x7F));
    ld.index.codes = ld.owned_bytes.back()->get();
    ld.owned_floats.push_back(zeros<float>(slots, 0xFF));
    ld.index.scales = ld.owned_floats.back()->get();
  }
  const std::size_t T = static_cast<std::size_t>(max_tokens_);
  ld.x = zeros<S>(T * cfg.hidden_size);
  ld.qkv = zeros<S>(T * cfg.qkv_a_rows());
  ld.q_c = zeros<S>(T * cfg.q_lora_rank);
  ld.q = zeros<S>(T * H * cfg.qk_head_dim());
  ld.qpack = zeros<S>(T * H * (L + dr));
  ld.kR = zeros<S>(T * dr);
  ld.c_read = zeros<S>(T * L);
  ld.kw = zeros<S>(T * (dI + HI));
  ld.qI = zeros<S>(T * HI * dI);
  ld.o = zeros<S>(T * H * cfg.v_head_dim);
  ld.y = zeros<S>(T * cfg.hidden_size);
  ld.olat_static = zeros<S>(T * H * L);
  ld.olat_trace = zeros<S>(T * H * L);
  ld.q8 = zeros<std::uint8_t>(T * HI * dI);
  ld.k8 = zeros<std::uint8_t>(T * dI);
  ld.qscale = zeros<float>(T * HI);
  ld.omega = zeros<float>(T * HI);
  ld.kscale = zeros<float>(T);
  ld.lse = zeros<float>(T * H);
  ld.topk_trace = zeros<int>(T * cfg.index_topk);
  return ld;
}

template <class S>
k::Dims StackImpl<S>::dims() const {
  k::Dims d{};
  d.T = step_.T;
  d.D = cfg.hidden_size;
  d.H = cfg.num_heads;
  d.Rq = cfg.q_lora_rank;
  d.L = cfg.kv_lora_rank;
  d.dn = cfg.qk_nope_head_dim;
  d.dr = cfg.qk_rope_head_dim;
  d.dv = cfg.v_head_dim;
  d.HI = cfg.index_n_heads;
  d.dI = cfg.index_head_dim;
  d.K = cfg.index_topk;
  d.B = cfg.block_size;
  d.max_blocks = step_.max_blocks;
  d.eps = static_cast<float>(cfg.rms_norm_eps);
  d.ieps = static_cast<float>(cfg.indexer_norm_eps);
  d.sigma = static_cast<float>(cfg.softmax_scale());
  d.head_norm = static_cast<float>(
      1.0 / std::sqrt(static_cast<double>(cfg.index_head_dim) * cfg.index_n_heads));
  d.neox = cfg.indexer_rope == IndexerRope::neox;
  d.hadamard = cfg.hadamard == Hadamard::on;
  d.fp8_kv = cfg.kv_cache == KvCache::fp8_ds_mla;
  d.tiles = tiles();
  return d;
}

template <class S>
k::Meta StackImpl<S>::meta(const LaunchState& st) const {
  k::Meta m{step_.positions->get(),   step_.slots->get(),   step_.request_of_token->get(),
            step_.block_table->get(), buf_.rope_cos->get(), buf_.rope_sin->get()};
  if (st.device_driven) {
    m.live = step_.live->get();
    m.short_prefill = step_.live->get() + 1;
  }
  faults_.edit_meta(m, st);
  return m;
}

template <class S>
void StackImpl<S>::upload_step(const StepInput& in) {
  const cudaStream_t stream = streams_.main();
  const int T = in.capture_size;
  step_.T = T;
  step_.Ta = in.num_tokens;
  std::vector<S> hid(static_cast<std::size_t>(T) * cfg.hidden_size);
  for (std::size_t i = 0; i < hid.size(); ++i) hid[i] = to_storage<S>(in.hidden.data()[i]);
  check(cudaMemcpyAsync(buf_.h->get(), hid.data(), hid.size() * sizeof(S), cudaMemcpyHostToDevice,
                        stream),
        "upload hidden");
  std::vector<long long> slots(in.slots.begin(), in.slots.end());
  faults_.edit_slots(in, slots);
  place_far(slots);
  check(cudaMemcpyAsync(step_.positions->get(), in.positions.data(), T * sizeof(int),
                        cudaMemcpyHostToDevice, stream),
        "upload positions");
  check(cudaMemcpyAsync(step_.slots->get(), slots.data(), T * sizeof(long long),
                        cudaMemcpyHostToDevice, stream),
        "upload slots");
  if (step_.Ta > 0)
    check(cudaMemcpyAsync(step_.request_of_token->get(), in.request_of_token.data(),
                          step_.Ta * sizeof(int), cudaMemcpyHostToDevice, stream),
          "upload request_of_token");
  std::vector<int> table(in.requests.size() * step_.max_blocks, -1);
  int longest = 1;
  for (std::size_t r = 0; r < in.requests.size(); ++r) {
    if (in.requests[r].block_table.size() > static_cast<std::size_t>(step_.max_blocks))
      throw ScenarioError("gpu stack: a block table is longer than the cache");
    std::transform(in.requests[r].block_table.begin(), in.requests[r].block_table.end(),
                   table.begin() + r * step_.max_blocks,
                   [&](int b) { return b < 0 ? b : static_cast<int>(b + options.block_offset); });
    longest = std::max(longest, in.requests[r].seq_len());
  }
  if (!table.empty())
    check(cudaMemcpyAsync(step_.block_table->get(), table.data(), table.size() * sizeof(int),
                          cudaMemcpyHostToDevice, stream),
          "upload block table");
  step_.longest = longest;
  // The device-driven H ops' metadata: the rows, the short-prefill decision, the new tokens a
  // request (a step that is no uniform decode is never served by them: one each, as a full
  // graph would wrongly read it, mutant full-for-mixed), the lengths.
  const int R = static_cast<int>(in.requests.size());
  const int q = boundary::uniform_decode(in) ? in.requests.front().q : 1;
  const int rows = R * q;
  std::vector<int> live{rows, longest <= cfg.index_topk ? 1 : 0, faults_.live_stride(q)};
  for (const RequestStep& r : in.requests) live.push_back(r.seq_len());
  check(cudaMemcpyAsync(step_.live->get(), live.data(), live.size() * sizeof(int),
                        cudaMemcpyHostToDevice, stream),
        "upload device metadata");
  check(cudaStreamSynchronize(stream), "upload step");  // host vectors die here
}

/// Far blocks: the step's slots moved up by StackOptions::block_offset blocks (the block table
/// likewise, in upload_step).
template <class S>
void StackImpl<S>::place_far(std::vector<long long>& slots) const {
  const long long shift = options.block_offset * cfg.block_size;
  const long long row = widest_cache_row(cfg);
  for (long long& s : slots) {
    if (s < 0) continue;
    s = faults_.placed_slot(s + shift, row);
  }
}

template <class S>
void StackImpl<S>::grow_rope(int positions) {
  const int half = cfg.qk_rope_head_dim / 2;
  std::vector<float> c(static_cast<std::size_t>(positions) * half), s(c.size());
  for (int p = 0; p < positions; ++p)
    for (int i = 0; i < half; ++i) {
      c[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.cos(p, i));
      s[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.sin(p, i));
    }
  buf_.rope_cos = upload(c, "rope table");
  buf_.rope_sin = upload(s, "rope table");
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

#include "dsv32/gpu/stack.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>

#include "check.cuh"
#include "dsv32/oracle/numerics.hpp"
#include "dsv32/oracle/rope.hpp"
#include "ops.cuh"

namespace dsv32::gpu {
namespace {

using detail::check;
using detail::DeviceBuffer;

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

template <class S>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<S, float> ? CUDA_R_32F : CUDA_R_16BF;
}
template <class S>
constexpr cublasComputeType_t compute_type() {
  return std::is_same_v<S, float> ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
}

template <class S>
S to_storage(double v) {
  if constexpr (std::is_same_v<S, float>)
    return static_cast<float>(v);
  else
    return __float2bfloat16_rn(static_cast<float>(v));
}
template <class S>
double from_storage(S v) {
  if constexpr (std::is_same_v<S, float>)
    return v;
  else
    return static_cast<double>(__bfloat162float(v));
}

/// A device array of S initialised from a host matrix/vector of doubles (exact bf16 values).
template <class S>
std::unique_ptr<DeviceBuffer<S>> upload(const double* data, std::size_t n) {
  std::vector<S> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = to_storage<S>(data[i]);
  auto buf = std::make_unique<DeviceBuffer<S>>(n);
  check(cudaMemcpy(buf->get(), host.data(), n * sizeof(S), cudaMemcpyHostToDevice),
        "upload weights");
  return buf;
}

template <class T>
std::unique_ptr<DeviceBuffer<T>> zeros(std::size_t n, int byte = 0) {
  auto buf = std::make_unique<DeviceBuffer<T>>(std::max<std::size_t>(n, 1));
  check(cudaMemset(buf->get(), byte, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMemset");
  return buf;
}

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> out(n);
  if (n) check(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download trace");
  return out;
}

}  // namespace

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> ops{
      "input_norm", "qkv_a_proj",   "indexer_wk_proj", "norm_rope_cache", "q_b_proj",
      "uk_absorb",  "indexer_wq_b", "fused_q",         "indexer_topk",    "sparse_mqa",
      "uv_proj",    "latent_copy",  "uv_proj_static",  "o_proj",          "residual_add"};
  return ops;
}

struct Stack::Impl {
  virtual ~Impl() = default;
  virtual StepTrace step(const StepInput& in) = 0;
  Config cfg;
};

namespace {

template <class S>
struct LayerDev {
  std::unique_ptr<DeviceBuffer<S>> w_qkv_a, g_q, g_kv, w_q_b, w_kv_b, w_o, g_in;
  std::unique_ptr<DeviceBuffer<S>> iw_q_b, iw_kw, ig_k, ib_k;  // iw_kw = [w_k; w_w]
  k::KvCache<S> kv{};
  k::IndexCache index{};
  std::vector<std::unique_ptr<DeviceBuffer<std::uint8_t>>> owned_bytes;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> owned_floats;
  std::vector<std::unique_ptr<DeviceBuffer<S>>> owned_s;
};

template <class S>
class StackImpl final : public Stack::Impl {
 public:
  StackImpl(const Config& c, const Weights& w, int num_blocks, int max_tokens)
      : num_blocks_(num_blocks), max_tokens_(max_tokens), rope_(c) {
    cfg = c;
    cfg.validate();
    w.check_shapes(cfg);
    if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    check_blas(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    const long long slots = static_cast<long long>(num_blocks) * cfg.block_size;
    for (int l = 0; l < cfg.num_layers; ++l) layers_.push_back(make_layer(w.layers[l], l, slots));
    const int T = max_tokens, H = cfg.num_heads, L = cfg.kv_lora_rank;
    h_ = zeros<S>(static_cast<std::size_t>(T) * cfg.hidden_size);
    x_ = zeros<S>(static_cast<std::size_t>(T) * cfg.hidden_size);
    qkv_ = zeros<S>(static_cast<std::size_t>(T) * cfg.qkv_a_rows());
    q_c_ = zeros<S>(static_cast<std::size_t>(T) * cfg.q_lora_rank);
    q_ = zeros<S>(static_cast<std::size_t>(T) * H * cfg.qk_head_dim());
    ql_ = zeros<S>(static_cast<std::size_t>(T) * H * L);
    qR_ = zeros<S>(static_cast<std::size_t>(T) * H * cfg.qk_rope_head_dim);
    kR_ = zeros<S>(static_cast<std::size_t>(T) * cfg.qk_rope_head_dim);
    c_read_ = zeros<S>(static_cast<std::size_t>(T) * L);
    kw_ = zeros<S>(static_cast<std::size_t>(T) * (cfg.index_head_dim + cfg.index_n_heads));
    qI_ = zeros<S>(static_cast<std::size_t>(T) * cfg.index_n_heads * cfg.index_head_dim);
    q8_ = zeros<std::uint8_t>(static_cast<std::size_t>(T) * cfg.index_n_heads * cfg.index_head_dim);
    qscale_ = zeros<float>(static_cast<std::size_t>(T) * cfg.index_n_heads);
    omega_ = zeros<float>(static_cast<std::size_t>(T) * cfg.index_n_heads);
    k8_ = zeros<std::uint8_t>(static_cast<std::size_t>(T) * cfg.index_head_dim);
    kscale_ = zeros<float>(T);
    topk_ = zeros<int>(static_cast<std::size_t>(T) * cfg.index_topk, 0xFF);
    for (auto& r : ring_) r = zeros<S>(static_cast<std::size_t>(T) * H * L);
    lse_ = zeros<float>(static_cast<std::size_t>(T) * H);
    o_ = zeros<S>(static_cast<std::size_t>(T) * H * cfg.v_head_dim);
    y_ = zeros<S>(static_cast<std::size_t>(T) * cfg.hidden_size);
    positions_ = zeros<int>(T);
    slots_ = zeros<long long>(T);
    request_of_token_ = zeros<int>(T);
    check(cudaDeviceSynchronize(), "stack setup");
  }

  ~StackImpl() override {
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  StepTrace step(const StepInput& in) override {
    const int T = in.capture_size, Ta = in.num_tokens;
    if (T > max_tokens_)
      throw std::invalid_argument("gpu stack: capture size " + std::to_string(T) +
                                  " exceeds max_tokens " + std::to_string(max_tokens_));
    if (in.hidden.rows() != T || static_cast<int>(in.positions.size()) != T)
      throw ScenarioError("gpu stack: step input is not derived");
    upload_metadata(in);
    // The residual stream enters in the storage dtype; padded rows keep whatever they hold.
    std::vector<S> hid(static_cast<std::size_t>(T) * cfg.hidden_size);
    for (std::size_t i = 0; i < hid.size(); ++i) hid[i] = to_storage<S>(in.hidden.data()[i]);
    check(cudaMemcpyAsync(h_->get(), hid.data(), hid.size() * sizeof(S), cudaMemcpyHostToDevice,
                          stream_),
          "upload hidden");
    StepTrace trace;
    const k::Dims d = dims(T);
    const k::Meta m = meta();
    for (int l = 0; l < cfg.num_layers; ++l) {
      run_layer(l, d, m, T, Ta);
      trace.layers.push_back(layer_trace(l, Ta));
    }
    trace.output = tensor_of("output", h_->get(), Ta, {cfg.hidden_size});
    check(cudaStreamSynchronize(stream_), "step");
    return trace;
  }

 private:
  LayerDev<S> make_layer(const LayerWeights& w, int l, long long slots) {
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
    const int L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim;
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
      ld.owned_bytes.push_back(zeros<std::uint8_t>(slots * cfg.index_head_dim, 0x7F));
      ld.index.codes = ld.owned_bytes.back()->get();
      ld.owned_floats.push_back(zeros<float>(slots, 0xFF));
      ld.index.scales = ld.owned_floats.back()->get();
    }
    return ld;
  }

  int tiles() const { return (cfg.kv_lora_rank + kDsMlaTile - 1) / kDsMlaTile; }

  k::Dims dims(int T) const {
    k::Dims d{};
    d.T = T;
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
    d.max_blocks = max_blocks_;
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

  k::Meta meta() const {
    return {positions_->get(),   slots_->get(),    request_of_token_->get(),
            block_table_->get(), rope_cos_->get(), rope_sin_->get()};
  }

  /// Host metadata of the step, and the model's cos/sin table grown to its largest position.
  void upload_metadata(const StepInput& in) {
    const int T = in.capture_size;
    std::vector<long long> slots(in.slots.begin(), in.slots.end());
    check(cudaMemcpyAsync(positions_->get(), in.positions.data(), T * sizeof(int),
                          cudaMemcpyHostToDevice, stream_),
          "upload positions");
    check(cudaMemcpyAsync(slots_->get(), slots.data(), T * sizeof(long long),
                          cudaMemcpyHostToDevice, stream_),
          "upload slots");
    check(cudaMemcpyAsync(request_of_token_->get(), in.request_of_token.data(),
                          in.num_tokens * sizeof(int), cudaMemcpyHostToDevice, stream_),
          "upload request_of_token");
    int mb = 1, max_len = 1;
    for (const RequestStep& r : in.requests) {
      mb = std::max<int>(mb, static_cast<int>(r.block_table.size()));
      max_len = std::max(max_len, r.seq_len());
    }
    std::vector<int> table(in.requests.size() * mb, -1);
    for (std::size_t r = 0; r < in.requests.size(); ++r)
      std::copy(in.requests[r].block_table.begin(), in.requests[r].block_table.end(),
                table.begin() + r * mb);
    max_blocks_ = mb;
    block_table_ = zeros<int>(table.size());
    check(cudaMemcpyAsync(block_table_->get(), table.data(), table.size() * sizeof(int),
                          cudaMemcpyHostToDevice, stream_),
          "upload block table");
    max_len_ = max_len;
    if (!scores_ || scores_->size() < static_cast<std::size_t>(max_tokens_) * max_len)
      scores_ = zeros<float>(static_cast<std::size_t>(max_tokens_) * max_len);
    grow_rope(std::max(max_len, 1));
    check(cudaStreamSynchronize(stream_), "upload metadata");  // host vectors die here
  }

  void grow_rope(int positions) {
    if (positions <= rope_positions_) return;
    int n = std::max(64, rope_positions_);
    while (n < positions) n *= 2;
    const int half = cfg.qk_rope_head_dim / 2;
    std::vector<float> c(static_cast<std::size_t>(n) * half), s(c.size());
    for (int p = 0; p < n; ++p)
      for (int i = 0; i < half; ++i) {
        c[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.cos(p, i));
        s[static_cast<std::size_t>(p) * half + i] = static_cast<float>(rope_.sin(p, i));
      }
    rope_cos_ = zeros<float>(c.size());
    rope_sin_ = zeros<float>(s.size());
    check(cudaMemcpy(rope_cos_->get(), c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice),
          "rope table");
    check(cudaMemcpy(rope_sin_->get(), s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice),
          "rope table");
    rope_positions_ = n;
  }

  /// Y (rows x n) = X (rows x k, row stride ldx) * W^T, W (n x k) row-major.
  void gemm(const S* x, int ldx, const S* w, S* y, int ldy, int rows, int n, int kdim,
            const char* op) {
    const float one = 1.f, zero = 0.f;
    check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, kdim, &one, w, cuda_type<S>(),
                            kdim, x, cuda_type<S>(), ldx, &zero, y, cuda_type<S>(), ldy,
                            compute_type<S>(), CUBLAS_GEMM_DEFAULT),
               op);
  }

  void run_layer(int l, const k::Dims& d, const k::Meta& m, int T, int Ta) {
    LayerDev<S>& w = layers_[l];
    const bool full = cfg.is_full_layer(l);
    const int H = d.H, L = d.L, dq = d.dn + d.dr, dkv = d.dn + d.dv;
    const float one = 1.f, zero = 0.f;
    // input_norm
    k::rmsnorm<S>
        <<<T, 256, 0, stream_>>>(h_->get(), d.D, w.g_in->get(), x_->get(), d.D, d.D, d.eps);
    check(cudaGetLastError(), "input_norm");
    // qkv_a_proj
    gemm(x_->get(), d.D, w.w_qkv_a->get(), qkv_->get(), d.Rq + L + d.dr, T, d.Rq + L + d.dr, d.D,
         "qkv_a_proj");
    // indexer_wk_proj
    if (full)
      gemm(x_->get(), d.D, w.iw_kw->get(), kw_->get(), d.dI + d.HI, T, d.dI + d.HI, d.D,
           "indexer_wk_proj");
    // norm_rope_cache
    k::rmsnorm<S><<<T, 256, 0, stream_>>>(qkv_->get(), d.Rq + L + d.dr, w.g_q->get(), q_c_->get(),
                                          d.Rq, d.Rq, d.eps);
    k::kv_insert<S><<<T, 256, (L + 32) * sizeof(float), stream_>>>(d, m, qkv_->get(), w.g_kv->get(),
                                                                   w.kv, kR_->get());
    if (full) {
      k::index_k_insert<S><<<T, 128, 0, stream_>>>(d, m, kw_->get(), w.ig_k->get(), w.ib_k->get(),
                                                   w.index, k8_->get(), kscale_->get());
      const long long n = static_cast<long long>(T) * d.K;
      k::topk_clear<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream_>>>(topk_->get(), n);
    }
    check(cudaGetLastError(), "norm_rope_cache");
    // q_b_proj
    gemm(q_c_->get(), d.Rq, w.w_q_b->get(), q_->get(), H * dq, T, H * dq, d.Rq, "q_b_proj");
    // uk_absorb: ql_h (T x L) = qN_h (T x dn) W_UK[h] (dn x L), batched over heads
    check_blas(
        cublasGemmStridedBatchedEx(
            blas_, CUBLAS_OP_N, CUBLAS_OP_N, L, T, d.dn, &one, w.w_kv_b->get(), cuda_type<S>(), L,
            static_cast<long long>(dkv) * L, q_->get(), cuda_type<S>(), H * dq, dq, &zero,
            ql_->get(), cuda_type<S>(), H * L, L, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
        "uk_absorb");
    // indexer_wq_b
    if (full)
      gemm(q_c_->get(), d.Rq, w.iw_q_b->get(), qI_->get(), d.HI * d.dI, T, d.HI * d.dI, d.Rq,
           "indexer_wq_b");
    // fused_q
    k::q_rope<S><<<T, 128, 0, stream_>>>(d, m, q_->get(), qR_->get());
    if (full)
      k::index_q<S><<<dim3(T, d.HI), 128, 0, stream_>>>(d, m, qI_->get(), kw_->get(), q8_->get(),
                                                        qscale_->get(), omega_->get());
    check(cudaGetLastError(), "fused_q");
    // indexer_topk (rows [0, T_a))
    if (full && Ta > 0) {
      const dim3 grid(Ta, (max_len_ + 127) / 128);
      k::index_scores<<<grid, 128, (d.HI * 128 + d.HI) * sizeof(float), stream_>>>(
          d, m, q8_->get(), omega_->get(), w.index, scores_->get(), max_len_);
      k::topk_select<<<Ta, 1024, 0, stream_>>>(d, m, scores_->get(), max_len_, topk_->get());
      check(cudaGetLastError(), "indexer_topk");
    }
    // sparse_mqa into the backend-owned ring (its address changes call to call)
    S* olat = ring_[ring_next_]->get();
    ring_next_ = (ring_next_ + 1) % ring_.size();
    if (Ta > 0) {
      const std::size_t shm = d.K * sizeof(long long) + (L + d.dr + d.K + 32) * sizeof(float);
      k::sparse_mqa<S><<<dim3(Ta, H), 128, shm, stream_>>>(d, m, ql_->get(), qR_->get(), w.kv,
                                                           topk_->get(), olat, lse_->get());
      check(cudaGetLastError(), "sparse_mqa");
      // uv_proj (no-copy form): o_h (T_a x dv) = olat_h (T_a x L) W_UV[h]^T
      check_blas(
          cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, d.dv, Ta, L, &one,
                                     w.w_kv_b->get() + static_cast<long long>(d.dn) * L,
                                     cuda_type<S>(), L, static_cast<long long>(dkv) * L, olat,
                                     cuda_type<S>(), H * L, L, &zero, o_->get(), cuda_type<S>(),
                                     H * d.dv, d.dv, H, compute_type<S>(), CUBLAS_GEMM_DEFAULT),
          "uv_proj");
    }
    last_olat_ = olat;
    // o_proj over all T rows, residual_add
    gemm(o_->get(), H * d.dv, w.w_o->get(), y_->get(), d.D, T, d.D, H * d.dv, "o_proj");
    const long long n = static_cast<long long>(T) * d.D;
    k::residual_add<S>
        <<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream_>>>(h_->get(), y_->get(), n);
    check(cudaGetLastError(), "residual_add");
    if (Ta > 0) {
      k::read_latent<S><<<Ta, 128, 0, stream_>>>(d, m, w.kv, c_read_->get());
      check(cudaGetLastError(), "read_latent");
    }
  }

  Tensor tensor_of(const char* name, const S* p, int rows, std::vector<std::int64_t> tail) {
    std::int64_t per = 1;
    for (auto v : tail) per *= v;
    const std::vector<S> host = download(p, static_cast<std::size_t>(rows * per));
    std::vector<double> data(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) data[i] = from_storage(host[i]);
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), tail.begin(), tail.end());
    return Tensor::from(name, std::move(shape), std::move(data), storage_dtype(cfg, name));
  }

  Tensor floats_of(const char* name, const float* p, int rows, std::vector<std::int64_t> tail) {
    std::int64_t per = 1;
    for (auto v : tail) per *= v;
    const std::vector<float> host = download(p, static_cast<std::size_t>(rows * per));
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), tail.begin(), tail.end());
    return Tensor::from(name, std::move(shape), std::vector<double>(host.begin(), host.end()),
                        storage_dtype(cfg, name));
  }

  Tensor codes_of(const char* name, const std::uint8_t* p, int rows,
                  std::vector<std::int64_t> tail) {
    std::int64_t per = 1;
    for (auto v : tail) per *= v;
    const std::vector<std::uint8_t> host = download(p, static_cast<std::size_t>(rows * per));
    std::vector<double> data(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) data[i] = e4m3_value(host[i]);
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), tail.begin(), tail.end());
    return Tensor::from(name, std::move(shape), std::move(data), DType::float8_e4m3fn);
  }

  LayerTrace layer_trace(int l, int Ta) {
    check(cudaStreamSynchronize(stream_), "layer");
    const int H = cfg.num_heads, L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim,
              HI = cfg.index_n_heads;
    LayerTrace lt;
    lt.tensors.push_back(tensor_of("q_c", q_c_->get(), Ta, {cfg.q_lora_rank}));
    lt.tensors.push_back(tensor_of("c", c_read_->get(), Ta, {L}));
    lt.tensors.push_back(tensor_of("kR", kR_->get(), Ta, {dr}));
    lt.tensors.push_back(tensor_of("ql", ql_->get(), Ta, {H, L}));
    lt.tensors.push_back(tensor_of("qR", qR_->get(), Ta, {H, dr}));
    if (cfg.is_full_layer(l)) {
      lt.tensors.push_back(codes_of("qI8", q8_->get(), Ta, {HI, cfg.index_head_dim}));
      lt.tensors.push_back(floats_of("qI_scale", qscale_->get(), Ta, {HI}));
      lt.tensors.push_back(codes_of("kI8", k8_->get(), Ta, {cfg.index_head_dim}));
      lt.tensors.push_back(floats_of("kI_scale", kscale_->get(), Ta, {}));
      lt.tensors.push_back(floats_of("omega", omega_->get(), Ta, {HI}));
    }
    const std::vector<int> tk =
        download(topk_->get(), static_cast<std::size_t>(Ta) * cfg.index_topk);
    lt.tensors.push_back(Tensor::from("topk", {Ta, cfg.index_topk},
                                      std::vector<double>(tk.begin(), tk.end()), DType::int32));
    lt.tensors.push_back(tensor_of("olat", last_olat_, Ta, {H, L}));
    lt.tensors.push_back(floats_of("lse", lse_->get(), Ta, {H}));
    lt.tensors.push_back(
        tensor_of("o", o_->get(), Ta, {static_cast<std::int64_t>(H) * cfg.v_head_dim}));
    lt.tensors.push_back(tensor_of("y", y_->get(), Ta, {cfg.hidden_size}));
    return lt;
  }

  int num_blocks_, max_tokens_;
  Rope rope_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<LayerDev<S>> layers_;
  std::unique_ptr<DeviceBuffer<S>> h_, x_, qkv_, q_c_, q_, ql_, qR_, kR_, c_read_, kw_, qI_, o_, y_;
  std::unique_ptr<DeviceBuffer<std::uint8_t>> q8_, k8_;
  std::unique_ptr<DeviceBuffer<float>> qscale_, omega_, kscale_, lse_, scores_, rope_cos_,
      rope_sin_;
  std::unique_ptr<DeviceBuffer<int>> topk_, positions_, request_of_token_, block_table_;
  std::unique_ptr<DeviceBuffer<long long>> slots_;
  std::array<std::unique_ptr<DeviceBuffer<S>>, 2> ring_;
  std::size_t ring_next_ = 0;
  S* last_olat_ = nullptr;
  int max_blocks_ = 1, max_len_ = 1, rope_positions_ = 0;
};

}  // namespace

Stack::Stack(const Config& cfg, const Weights& weights, int num_blocks, int max_tokens) {
  if (cfg.precision == Precision::bf16)
    impl_ = std::make_unique<StackImpl<__nv_bfloat16>>(cfg, weights, num_blocks, max_tokens);
  else
    impl_ = std::make_unique<StackImpl<float>>(cfg, weights, num_blocks, max_tokens);
}

Stack::~Stack() = default;

StepTrace Stack::step(const StepInput& in) {
  return impl_->step(in);
}

const Config& Stack::config() const {
  return impl_->cfg;
}

}  // namespace dsv32::gpu

// The step's trace: every stage of rows [0, T_a) of every layer, read back after the step with
// the oracle's names, shapes and storage dtypes.
#include "../kernels/cache.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {

using detail::download;
using detail::from_storage;

namespace {

/// A trace Tensor of `shape` from downloaded elements; `value` maps a stored element to its
/// value.
template <class T, class Value>
Tensor host_tensor(const char* name, std::vector<std::int64_t> shape, const std::vector<T>& host,
                   DType dtype, Value value) {
  std::vector<double> data(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) data[i] = value(host[i]);
  return Tensor::from(name, std::move(shape), std::move(data), dtype);
}

}  // namespace

/// Rows [0, rows) of a device tensor; `value` maps a stored element to its value (storage
/// types, fp32 scales, e4m3 codes).
template <class S>
template <class T, class Value>
Tensor StackImpl<S>::tensor_of(const char* name, const T* p, int rows,
                               std::vector<std::int64_t> tail, DType dtype, Value value) {
  std::int64_t per = 1;
  for (auto v : tail) per *= v;
  std::vector<std::int64_t> shape{rows};
  shape.insert(shape.end(), tail.begin(), tail.end());
  return host_tensor(name, std::move(shape), download(p, static_cast<std::size_t>(rows * per)),
                     dtype, value);
}

template <class S>
Tensor StackImpl<S>::tensor_of(const char* name, const S* p, int rows,
                               std::vector<std::int64_t> tail) {
  return tensor_of(name, p, rows, std::move(tail), storage_dtype(cfg, name), from_storage<S>);
}

/// Columns [off, off + n) of each (row, head) of a (rows, H, stride) device tensor, as a
/// (rows, H, n) trace Tensor.
template <class S>
Tensor StackImpl<S>::packed_of(const char* name, const S* p, int rows, int H, int stride, int off,
                               int n) {
  std::vector<S> host(static_cast<std::size_t>(rows) * H * n);
  if (!host.empty())
    check(cudaMemcpy2D(host.data(), n * sizeof(S), p + off, stride * sizeof(S), n * sizeof(S),
                       static_cast<std::size_t>(rows) * H, cudaMemcpyDeviceToHost),
          "download trace");
  return host_tensor(name, {rows, H, n}, host, storage_dtype(cfg, name), from_storage<S>);
}

template <class S>
Tensor StackImpl<S>::floats_of(const char* name, const float* p, int rows,
                               std::vector<std::int64_t> tail) {
  return tensor_of(name, p, rows, std::move(tail), storage_dtype(cfg, name),
                   [](float v) { return static_cast<double>(v); });
}

template <class S>
Tensor StackImpl<S>::codes_of(const char* name, const std::uint8_t* p, int rows,
                              std::vector<std::int64_t> tail) {
  return tensor_of(name, p, rows, std::move(tail), DType::float8_e4m3fn,
                   [](std::uint8_t v) { return e4m3_value(v); });
}

template <class S>
StepTrace StackImpl<S>::trace() {
  const int Ta = Ta_;
  const k::Dims d = dims();
  const k::Meta m = meta();
  StepTrace tr;
  const int H = cfg.num_heads, L = cfg.kv_lora_rank, dr = cfg.qk_rope_head_dim,
            HI = cfg.index_n_heads;
  for (int l = 0; l < cfg.num_layers; ++l) {
    LayerDev<S>& w = layers_[l];
    if (Ta > 0) k::launch_read_latent<S>({stream_, "trace"}, Ta, d, m, w.kv, w.c_read->get());
    check(cudaStreamSynchronize(stream_), "trace");
    LayerTrace lt;
    lt.tensors.push_back(tensor_of("q_c", w.q_c->get(), Ta, {cfg.q_lora_rank}));
    lt.tensors.push_back(tensor_of("c", w.c_read->get(), Ta, {L}));
    lt.tensors.push_back(tensor_of("kR", w.kR->get(), Ta, {dr}));
    lt.tensors.push_back(packed_of("ql", w.qpack->get(), Ta, H, L + dr, 0, L));
    lt.tensors.push_back(packed_of("qR", w.qpack->get(), Ta, H, L + dr, L, dr));
    if (cfg.is_full_layer(l)) {
      lt.tensors.push_back(codes_of("qI8", w.q8->get(), Ta, {HI, cfg.index_head_dim}));
      lt.tensors.push_back(floats_of("qI_scale", w.qscale->get(), Ta, {HI}));
      lt.tensors.push_back(codes_of("kI8", w.k8->get(), Ta, {cfg.index_head_dim}));
      lt.tensors.push_back(floats_of("kI_scale", w.kscale->get(), Ta, {}));
      lt.tensors.push_back(floats_of("omega", w.omega->get(), Ta, {HI}));
    }
    lt.tensors.push_back(tensor_of("topk", w.topk_trace->get(), Ta, {cfg.index_topk}, DType::int32,
                                   [](int v) { return static_cast<double>(v); }));
    lt.tensors.push_back(tensor_of("olat", w.olat_trace->get(), Ta, {H, L}));
    lt.tensors.push_back(floats_of("lse", w.lse->get(), Ta, {H}));
    lt.tensors.push_back(  // what uv_proj wrote (a mutant may write elsewhere than `o`)
        tensor_of("o", o_ptr_[l], Ta, {static_cast<std::int64_t>(H) * cfg.v_head_dim}));
    lt.tensors.push_back(tensor_of("y", w.y->get(), Ta, {cfg.hidden_size}));
    tr.layers.push_back(std::move(lt));
  }
  tr.output = tensor_of("output", h_->get(), Ta, {cfg.hidden_size});
  return tr;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

// The step's trace: every stage of the stage table (oracle/stages.hpp) for rows [0, T_a) of
// every layer, read back after the step with the table's names, shapes and storage dtypes.
#include "../kernels/cache.cuh"
#include "impl.cuh"

namespace dsv32::gpu::stack {

using detail::download;
using detail::from_storage;

template <class S>
typename StackImpl<S>::Source StackImpl<S>::stage_source(Stage stage, int l) {
  if (stage == Stage::output) return {buf_.h->get()};
  LayerDev<S>& w = buf_.layers[l];
  const int L = cfg.kv_lora_rank, W = L + cfg.qk_rope_head_dim;
  switch (stage) {
    case Stage::q_c:
      return {w.q_c->get()};
    case Stage::c:
      return {w.c_read->get()};  // the latent as the cache reads it back
    case Stage::kR:
      return {w.kR->get()};
    case Stage::ql:
      return {w.qpack->get(), W, 0};
    case Stage::qR:
      return {w.qpack->get(), W, L};
    case Stage::qI8:
      return {w.q8->get()};
    case Stage::qI_scale:
      return {w.qscale->get()};
    case Stage::kI8:
      return {w.k8->get()};
    case Stage::kI_scale:
      return {w.kscale->get()};
    case Stage::omega:
      return {w.omega->get()};
    case Stage::topk:
      return {w.topk_trace->get()};  // this layer's sets (the buffer is shared)
    case Stage::olat:
      return {w.olat_trace->get()};  // the backend's buffer rotates
    case Stage::lse:
      return {w.lse->get()};
    case Stage::o:
      return {o_ptr_[l]};  // what uv_proj wrote (a mutant may write elsewhere)
    case Stage::y:
      return {w.y->get()};
    case Stage::output:
      break;
  }
  throw std::logic_error("gpu stack: no device buffer for trace stage '" + stage_name(stage) + "'");
}

template <class S>
Tensor StackImpl<S>::download_stage(const StageInfo& stage, const Source& src) {
  const std::vector<std::int64_t> tail = stage.tail(cfg);
  std::vector<std::int64_t> shape{step_.Ta};
  shape.insert(shape.end(), tail.begin(), tail.end());
  std::size_t n = static_cast<std::size_t>(step_.Ta);
  for (const std::int64_t v : tail) n *= static_cast<std::size_t>(v);
  const std::string name(stage.name);
  const auto make = [&](const auto& host, auto value) {
    std::vector<double> data(host.size());
    for (std::size_t i = 0; i < host.size(); ++i) data[i] = value(host[i]);
    return Tensor::from(name, shape, std::move(data), storage_dtype(cfg, stage.stage));
  };
  switch (stage.storage) {
    case Storage::activation: {
      const S* p = static_cast<const S*>(src.p);
      if (src.stride == 0) return make(download(p, n), from_storage<S>);
      // Columns [off, off + width) of each (row, head) of a (rows, heads, stride) tensor.
      const int width = static_cast<int>(tail.back());
      std::vector<S> host(n);
      if (n)
        check(cudaMemcpy2D(host.data(), width * sizeof(S), p + src.off, src.stride * sizeof(S),
                           width * sizeof(S), n / width, cudaMemcpyDeviceToHost),
              "download trace");
      return make(host, from_storage<S>);
    }
    case Storage::fp8:
      return make(download(static_cast<const std::uint8_t*>(src.p), n),
                  [](std::uint8_t v) { return e4m3_value(v); });
    case Storage::fp32:
      return make(download(static_cast<const float*>(src.p), n),
                  [](float v) { return static_cast<double>(v); });
    case Storage::int32:
      return make(download(static_cast<const int*>(src.p), n),
                  [](int v) { return static_cast<double>(v); });
  }
  throw std::logic_error("gpu stack: unknown storage of stage " + name);
}

template <class S>
StepTrace StackImpl<S>::trace() {
  const k::Dims d = dims();
  const k::Meta m = meta(LaunchState{});
  StepTrace tr;
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (step_.Ta > 0)
      k::launch_read_latent<S>({streams_.main(), "trace"}, step_.Ta, d, m, buf_.layers[l].kv,
                               buf_.layers[l].c_read->get());
    check(cudaStreamSynchronize(streams_.main()), "trace");
    LayerTrace lt;
    for (const Stage s : layer_stages()) {
      const StageInfo& stage = stage_info(s);
      if (stage.indexer && !cfg.is_full_layer(l)) continue;
      lt.tensors.push_back(download_stage(stage, stage_source(s, l)));
    }
    tr.layers.push_back(std::move(lt));
  }
  tr.output = download_stage(stage_info(Stage::output), stage_source(Stage::output, -1));
  return tr;
}

template class StackImpl<float>;
template class StackImpl<__nv_bfloat16>;

}  // namespace dsv32::gpu::stack

// Device buffers made from host data and read back: the stack's allocations and uploads, and
// the kernel probes' (tests/gpu/gpu_probes.cu).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "check.cuh"

namespace dsv32::gpu::detail {

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

/// n elements (at least one), every byte `byte`.
template <class T>
std::unique_ptr<DeviceBuffer<T>> zeros(std::size_t n, int byte = 0) {
  auto buf = std::make_unique<DeviceBuffer<T>>(std::max<std::size_t>(n, 1));
  check(cudaMemset(buf->get(), byte, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMemset");
  return buf;
}

/// A device array of S from a host array of doubles (rounded to S).
template <class S>
std::unique_ptr<DeviceBuffer<S>> upload(const double* data, std::size_t n) {
  std::vector<S> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = to_storage<S>(data[i]);
  auto buf = std::make_unique<DeviceBuffer<S>>(n);
  check(cudaMemcpy(buf->get(), host.data(), n * sizeof(S), cudaMemcpyHostToDevice),
        "upload weights");
  return buf;
}

/// A device copy of `host` (`what` names it in an error).
template <class T>
std::unique_ptr<DeviceBuffer<T>> upload(const std::vector<T>& host, const char* what) {
  auto buf = zeros<T>(host.size());
  check(cudaMemcpy(buf->get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return buf;
}

template <class T>
std::vector<T> download(const T* p, std::size_t n) {
  std::vector<T> out(n);
  if (n) check(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download trace");
  return out;
}

}  // namespace dsv32::gpu::detail

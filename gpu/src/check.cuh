// CUDA error checks that turn failures into CudaError naming the operation.
#pragma once

#include <cuda_runtime.h>

#include <new>
#include <string>

#include "dsv32/gpu/device.hpp"

namespace dsv32::gpu::detail {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// Makes `device` current for the guard's scope and restores the caller's device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  /// For destructors: never throws, and restores nothing when the current device is unknown.
  DeviceGuard(int device, std::nothrow_t) {
    restore_ = cudaGetDevice(&prev_) == cudaSuccess;
    cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool restore_ = true;
};

/// Device buffer owned by RAII.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T) + 1), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

}  // namespace dsv32::gpu::detail

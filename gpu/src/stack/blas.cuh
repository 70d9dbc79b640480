// cuBLAS's types for the storage type S.
#pragma once

#include <cublas_v2.h>

#include <type_traits>

namespace dsv32::gpu::stack {

template <class S>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<S, float> ? CUDA_R_32F : CUDA_R_16BF;
}
/// fp32 storage: the pedantic fp32 path (no TF32); bf16: fp32 accumulation.
template <class S>
constexpr cublasComputeType_t compute_type() {
  return std::is_same_v<S, float> ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
}

}  // namespace dsv32::gpu::stack

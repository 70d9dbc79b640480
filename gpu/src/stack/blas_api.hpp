// cuBLAS, loaded when the first stack is built rather than when the program starts.
//
// libcublasLt's start-up work costs a linked program about 0.3 s before main() (measured: 0.63 s
// for `dsv32 --help` against 0.05 s without cuBLAS), and every command of the tool, and every
// Python read of a golden (which runs `dsv32 validate`), paid it though only GPU commands use
// cuBLAS. The seven entry points the stack calls are looked up once, on first use.
#pragma once

#include <cublas_v2.h>

namespace dsv32::gpu::stack {

struct BlasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int m, int n, int k,
                         const void* alpha, const void* a, cudaDataType, int lda, const void* b,
                         cudaDataType, int ldb, const void* beta, void* c, cudaDataType, int ldc,
                         cublasComputeType_t, cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                         int m, int n, int k, const void* alpha, const void* a,
                                         cudaDataType, int lda, long long stride_a, const void* b,
                                         cudaDataType, int ldb, long long stride_b,
                                         const void* beta, void* c, cudaDataType, int ldc,
                                         long long stride_c, int batch, cublasComputeType_t,
                                         cublasGemmAlgo_t);
};

/// The loaded library's entry points; the first call loads it. Throws CudaError naming the
/// library and the loader's message when it (or one of the entry points) cannot be found.
const BlasApi& blas();

}  // namespace dsv32::gpu::stack

// Loads cuBLAS on first use (blas_api.hpp): by its soname, then by the path CMake found at
// configure time, so that the tool runs without LD_LIBRARY_PATH wherever it was built.
#include "blas_api.hpp"

#include <dlfcn.h>

#include <string>

#include "dsv32/gpu/device.hpp"

#ifndef DSV32_CUBLAS_PATH
#define DSV32_CUBLAS_PATH ""
#endif

namespace dsv32::gpu::stack {
namespace {

void* open_library() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  std::string why = dlerror();
  const std::string configured = DSV32_CUBLAS_PATH;
  if (!configured.empty()) {
    if (void* h = dlopen(configured.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    why += "; " + std::string(dlerror());
  }
  throw CudaError("cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) + " could not be loaded (" + soname +
                  (configured.empty() ? "" : ", then " + configured) + "): " + why);
}

template <class F>
void resolve(void* library, F& slot, const char* name) {
  dlerror();
  void* symbol = dlsym(library, name);
  if (symbol == nullptr)
    throw CudaError(std::string("cuBLAS has no entry point ") + name + " (a library older than " +
                    std::to_string(CUBLAS_VER_MAJOR) + ".x on the loader's path?)");
  slot = reinterpret_cast<F>(symbol);
}

BlasApi load() {
  void* library = open_library();  // kept open for the life of the process
  BlasApi api{};
  resolve(library, api.create, "cublasCreate_v2");
  resolve(library, api.destroy, "cublasDestroy_v2");
  resolve(library, api.set_stream, "cublasSetStream_v2");
  resolve(library, api.set_math_mode, "cublasSetMathMode");
  resolve(library, api.set_workspace, "cublasSetWorkspace_v2");
  resolve(library, api.gemm, "cublasGemmEx");
  resolve(library, api.gemm_strided_batched, "cublasGemmStridedBatchedEx");
  return api;
}

}  // namespace

const BlasApi& blas() {
  static const BlasApi api = load();  // a throw leaves it unset: the next call tries again
  return api;
}

}  // namespace dsv32::gpu::stack

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <dlfcn.h>

#include <string>

#include "check.cuh"

namespace dsv32::gpu {
namespace {

__global__ void bf16_kernel(const float* x, std::uint16_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

__global__ void e4m3_kernel(const float* x, std::uint8_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3));
}

template <class Out, class Kernel>
std::vector<Out> convert(const std::vector<float>& xs, Kernel kernel, const char* name) {
  using detail::check;
  const int n = static_cast<int>(xs.size());
  std::vector<Out> out(xs.size());
  if (n == 0) return out;
  detail::DeviceBuffer<float> dx(xs.size());
  detail::DeviceBuffer<Out> dy(xs.size());
  check(cudaMemcpy(dx.get(), xs.data(), xs.size() * sizeof(float), cudaMemcpyHostToDevice), name);
  kernel<<<(n + 255) / 256, 256>>>(dx.get(), dy.get(), n);
  check(cudaGetLastError(), name);
  check(cudaMemcpy(out.data(), dy.get(), out.size() * sizeof(Out), cudaMemcpyDeviceToHost), name);
  return out;
}

}  // namespace

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed probe
    // The runtime says "driver version is insufficient" both where no driver is installed (a
    // machine without a GPU) and where one is too old: the driver's library tells them apart.
    if (e == cudaErrorInsufficientDriver) {
      void* libcuda = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
      if (!libcuda)
        return "no NVIDIA driver on this machine (libcuda.so.1 not found): no GPU to run on";
      ::dlclose(libcuda);
      return "the NVIDIA driver is older than this build's CUDA " +
             std::to_string(CUDART_VERSION / 1000) + "." +
             std::to_string(CUDART_VERSION % 1000 / 10) +
             " runtime needs (cudaErrorInsufficientDriver): update the driver";
    }
    if (e == cudaErrorNoDevice) return "no CUDA device visible (the driver is installed)";
    return std::string("no usable CUDA device: ") + cudaGetErrorName(e) + ": " +
           cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device visible";
  return "";
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_summary() {
  if (const std::string why = no_device_reason(); !why.empty()) throw CudaError(why);
  cudaDeviceProp p{};
  detail::check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  const double gib = static_cast<double>(p.totalGlobalMem) / static_cast<double>(1ull << 30);
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " +
         std::to_string(static_cast<int>(gib * 10 + 0.5) / 10) + "." +
         std::to_string(static_cast<int>(gib * 10 + 0.5) % 10) + " GiB)";
}

std::size_t device_used_bytes() {
  std::size_t free = 0, total = 0;
  detail::check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total - free;
}

void release_device_memory() {
  detail::check(cudaDeviceReset(), "cudaDeviceReset");
}

double copy_bandwidth_gbs(std::size_t bytes, int repeats) {
  using detail::check;
  detail::DeviceBuffer<std::uint8_t> a(bytes), b(bytes);
  check(cudaMemset(a.get(), 1, bytes), "bandwidth probe");
  check(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice), "bandwidth probe");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "bandwidth probe");
  check(cudaEventCreate(&e1), "bandwidth probe");
  check(cudaEventRecord(e0), "bandwidth probe");
  for (int i = 0; i < repeats; ++i)
    check(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice), "bandwidth probe");
  check(cudaEventRecord(e1), "bandwidth probe");
  check(cudaEventSynchronize(e1), "bandwidth probe");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, e0, e1), "bandwidth probe");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) * repeats / (static_cast<double>(ms) * 1e-3) / 1e9;
}

std::vector<std::uint16_t> device_bf16_bits(const std::vector<float>& xs) {
  return convert<std::uint16_t>(xs, bf16_kernel, "bf16 conversion kernel");
}

std::vector<std::uint8_t> device_e4m3_bits(const std::vector<float>& xs) {
  return convert<std::uint8_t>(xs, e4m3_kernel, "e4m3 conversion kernel");
}

}  // namespace dsv32::gpu

// Device discovery and CUDA error handling. Host-only header: no CUDA headers leak out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsv32::gpu {

/// A failed CUDA or cuBLAS call: the message names the operation and CUDA's own text.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Empty when a usable CUDA device is present, else why not (for GTEST_SKIP and the CLI).
std::string no_device_reason();
/// CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies); 0 when none or no driver.
int device_count();
/// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for device 0; throws CudaError without a device.
std::string device_summary();

/// Bytes of device 0's memory in use now, by every process (cudaMemGetInfo: total - free). The
/// driver hands out memory in pages of 2 MiB, so a delta is a multiple of that.
std::size_t device_used_bytes();

/// Destroys this process's context on device 0 (cudaDeviceReset), returning every page it held:
/// a memory benchmark that measures by cudaMemGetInfo deltas calls it between runs, as the
/// driver keeps a freed graph's pages for the process's later graphs. Nothing of the process
/// may use the device across it (no Stack alive).
void release_device_memory();

/// Device-to-device copy bandwidth in GB/s (bytes read plus bytes written per second), from
/// `repeats` copies of `bytes` timed with CUDA events: the rate a bandwidth floor assumes.
double copy_bandwidth_gbs(std::size_t bytes = std::size_t(1) << 30, int repeats = 10);

/// bf16 bit patterns of xs as the device's __float2bfloat16_rn computes them.
std::vector<std::uint16_t> device_bf16_bits(const std::vector<float>& xs);
/// e4m3fn bit patterns of xs as the device's saturating conversion computes them.
std::vector<std::uint8_t> device_e4m3_bits(const std::vector<float>& xs);

}  // namespace dsv32::gpu

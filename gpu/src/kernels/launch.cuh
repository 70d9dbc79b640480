// How an op's kernels are launched: one Launch per op and stream, made by the stack.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "../check.cuh"

namespace dsv32::gpu::k {

/// Decides, per launch, whether to leave it out (timing ablation; StackLab::skip_launch) and
/// records its label (StackLab::launch_labels). The stack hands one to a Launch only while it
/// ablates or records, so a normal launch does not consult it.
class LaunchFilter {
 public:
  /// True to leave out the launch of `kernel` (a __global__ function) by op `op`.
  virtual bool skip_kernel(const char* op, const void* kernel) = 0;

 protected:
  ~LaunchFilter() = default;
};

/// Where and how one op launches its kernels: the stream, programmatic dependent launch
/// (`pdl`: programmatic stream serialization, so the kernel's blocks may become resident while
/// the kernel ahead finishes; every kernel waits in stream_order first), the op's name for
/// errors and labels, and the ablation filter (nullptr: launch everything).
struct Launch {
  cudaStream_t stream = nullptr;
  const char* op = "kernel";
  bool pdl = false;
  LaunchFilter* filter = nullptr;

  /// The same launch on stream s.
  Launch on(cudaStream_t s) const {
    Launch l = *this;
    l.stream = s;
    return l;
  }

  template <class... P, class... A>
  void operator()(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem,
                  A&&... args) const {
    if (filter && filter->skip_kernel(op, reinterpret_cast<const void*>(kernel))) return;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = stream;
    c.attrs = &attr;
    c.numAttrs = pdl ? 1 : 0;
    detail::check(cudaLaunchKernelEx(&c, kernel, std::forward<A>(args)...), op);
  }
};

}  // namespace dsv32::gpu::k

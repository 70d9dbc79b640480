#include <cuda/atomic>

#include "../check.cuh"
#include "exchange.cuh"

namespace dsv32::gpu::k {
namespace {

using Flag = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Spins until flags[j] >= want for every rank j. False (and `failed` set) when the host
/// aborted the group or the wait outlived its timeout; then every later wait returns at once,
/// so the ranks drain instead of each waiting out its own timeout.
__device__ bool wait_all(const ExchangeFlags& f, unsigned long long* flags,
                         unsigned long long want) {
  const unsigned long long t0 = now_ns();
  for (int j = 0; j < f.ranks; ++j) {
    while (Flag(flags[j]).load(cuda::memory_order_acquire) < want) {
      if (*f.abort) {
        atomicCAS(f.failed, 0, 1);
        return false;
      }
      if (*reinterpret_cast<volatile int*>(f.failed)) return false;
      if (now_ns() - t0 > f.timeout_ns) {
        atomicCAS(f.failed, 0, 2);
        return false;
      }
      __nanosleep(256);
    }
  }
  return true;
}

__global__ void exchange_enter(ExchangeFlags f, int rank) {
  if (threadIdx.x != 0) return;
  const unsigned long long e = f.epoch[rank] + 1;
  f.epoch[rank] = e;
  wait_all(f, f.done, e - 1);
}

__global__ void exchange_arrive(ExchangeFlags f, int rank) {
  if (threadIdx.x != 0) return;
  const unsigned long long e = f.epoch[rank];
  __threadfence();
  Flag(f.arrived[rank]).store(e, cuda::memory_order_release);
  wait_all(f, f.arrived, e);
  __threadfence();
}

__global__ void exchange_leave(ExchangeFlags f, int rank) {
  if (threadIdx.x != 0) return;
  __threadfence();
  Flag(f.done[rank]).store(f.epoch[rank], cuda::memory_order_release);
}

}  // namespace

void launch_exchange_enter(cudaStream_t s, const ExchangeFlags& f, int rank) {
  exchange_enter<<<1, 32, 0, s>>>(f, rank);
  detail::check(cudaGetLastError(), "exchange_enter");
}

void launch_exchange_arrive(cudaStream_t s, const ExchangeFlags& f, int rank) {
  exchange_arrive<<<1, 32, 0, s>>>(f, rank);
  detail::check(cudaGetLastError(), "exchange_arrive");
}

void launch_exchange_leave(cudaStream_t s, const ExchangeFlags& f, int rank) {
  exchange_leave<<<1, 32, 0, s>>>(f, rank);
  detail::check(cudaGetLastError(), "exchange_leave");
}

}  // namespace dsv32::gpu::k

// The device side of a collective among ranks emulated on one GPU (gpu/src/local_exchange.cpp):
// ranks are streams of one device, fed by their own host threads, and they meet through flags in
// device memory, as NCCL's kernels meet through theirs, so the exchange is capturable into each
// rank's CUDA graph and needs no host at replay.
#pragma once

#include <cuda_runtime.h>

namespace dsv32::gpu::k {

/// The flags of one group of ranks, in device memory unless said otherwise.
struct ExchangeFlags {
  unsigned long long* epoch = nullptr;    // [ranks]: exchanges each rank has entered
  unsigned long long* arrived = nullptr;  // [ranks]: the last exchange whose data a rank posted
  unsigned long long* done = nullptr;     // [ranks]: the last exchange a rank finished reading
  const volatile int* abort = nullptr;    // mapped host memory: nonzero releases every wait
  int* failed = nullptr;                  // [1]: 1 aborted, 2 a wait timed out (then no waits)
  int ranks = 1;
  unsigned long long timeout_ns = 0;  // how long one wait may spin
};

/// Enter exchange e = ++epoch[rank]: waits until every rank has finished reading exchange
/// e - 1 (its slot may then be overwritten).
void launch_exchange_enter(cudaStream_t s, const ExchangeFlags& f, int rank);
/// Posts this rank's data of its current exchange (written ahead on the stream) and waits
/// until every rank has posted it.
void launch_exchange_arrive(cudaStream_t s, const ExchangeFlags& f, int rank);
/// Marks this rank's reading of its current exchange finished.
void launch_exchange_leave(cudaStream_t s, const ExchangeFlags& f, int rank);

}  // namespace dsv32::gpu::k

#include "local_exchange.hpp"

#include <cuda_runtime.h>

#include <stdexcept>

#include "check.cuh"
#include "kernels/exchange.cuh"

namespace dsv32::gpu {

using detail::check;

namespace {

/// One rank's all-gather: post its bytes into its slot of the staging buffer, wait for every
/// rank's, copy the whole buffer out (rank r's bytes at r * bytes, as NCCL's all-gather lays
/// them out).
struct LocalGather final : RankGather {
  LocalExchange::State* s = nullptr;
  int rank = 0;
  bool rehearsing = false;
  int ranks() const override;
  void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override;
};

}  // namespace

struct LocalExchange::State {
  int ranks = 1;
  std::size_t capacity = 0;
  k::ExchangeFlags flags;
  unsigned char* staging = nullptr;
  unsigned long long* counters = nullptr;  // epoch, arrived, done: 3 x ranks
  int* failed = nullptr;
  int* abort_host = nullptr;  // pinned, mapped
  std::vector<LocalGather> gathers;
};

int LocalGather::ranks() const {
  return s->ranks;
}

void LocalGather::all_gather(const void* send, void* recv, std::size_t bytes, void* stream) {
  if (bytes > s->capacity)
    throw std::length_error("rank " + std::to_string(rank) + ": an all-gather of " +
                            std::to_string(bytes) + " bytes a rank; the group holds " +
                            std::to_string(s->capacity));
  auto* st = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(st, &status), "all-gather: cudaStreamIsCapturing");
  if (rehearsing && status == cudaStreamCaptureStatusNone) {
    for (int r = 0; r < s->ranks; ++r)
      check(cudaMemcpyAsync(static_cast<unsigned char*>(recv) + r * bytes, send, bytes,
                            cudaMemcpyDeviceToDevice, st),
            "all-gather: rehearsal");
    return;
  }
  k::launch_exchange_enter(st, s->flags, rank);
  check(cudaMemcpyAsync(s->staging + rank * bytes, send, bytes, cudaMemcpyDeviceToDevice, st),
        "all-gather: post");
  k::launch_exchange_arrive(st, s->flags, rank);
  check(cudaMemcpyAsync(recv, s->staging, bytes * static_cast<std::size_t>(s->ranks),
                        cudaMemcpyDeviceToDevice, st),
        "all-gather: collect");
  k::launch_exchange_leave(st, s->flags, rank);
}

LocalExchange::LocalExchange(int ranks, std::size_t capacity, double timeout_s)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.ranks = ranks;
  s.capacity = capacity;
  check(cudaMalloc(reinterpret_cast<void**>(&s.staging), capacity * ranks + 1),
        "one-GPU ranks: staging buffer");
  check(cudaMalloc(reinterpret_cast<void**>(&s.counters), 3 * ranks * sizeof(unsigned long long)),
        "one-GPU ranks: flags");
  check(cudaMemset(s.counters, 0, 3 * ranks * sizeof(unsigned long long)), "one-GPU ranks: flags");
  check(cudaMalloc(reinterpret_cast<void**>(&s.failed), sizeof(int)), "one-GPU ranks: flags");
  check(cudaMemset(s.failed, 0, sizeof(int)), "one-GPU ranks: flags");
  check(cudaHostAlloc(reinterpret_cast<void**>(&s.abort_host), sizeof(int), cudaHostAllocMapped),
        "one-GPU ranks: abort flag");
  *s.abort_host = 0;
  int* abort_dev = nullptr;
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&abort_dev), s.abort_host, 0),
        "one-GPU ranks: abort flag");
  check(cudaDeviceSynchronize(), "one-GPU ranks: setup");
  s.flags = {s.counters,
             s.counters + ranks,
             s.counters + 2 * ranks,
             abort_dev,
             s.failed,
             ranks,
             static_cast<unsigned long long>(timeout_s * 1e9)};
  s.gathers.resize(ranks);
  for (int r = 0; r < ranks; ++r) s.gathers[r].s = &s, s.gathers[r].rank = r;
}

LocalExchange::~LocalExchange() {
  cudaFree(s_->staging);
  cudaFree(s_->counters);
  cudaFree(s_->failed);
  cudaFreeHost(s_->abort_host);
}

void LocalExchange::set_rehearsal(int rank, bool on) {
  s_->gathers.at(rank).rehearsing = on;
}

RankGather* LocalExchange::gather(int rank) {
  return &s_->gathers.at(rank);
}

void LocalExchange::abort() {
  *reinterpret_cast<volatile int*>(s_->abort_host) = 1;
}

std::string LocalExchange::failure() const {
  int failed = 0;
  check(cudaMemcpy(&failed, s_->failed, sizeof(int), cudaMemcpyDeviceToHost),
        "one-GPU ranks: read the exchange's state");
  if (failed == 1) return "a rank failed; the others' all-gather was released";
  if (failed == 2)
    return "an all-gather waited past its timeout for a rank that never arrived (the ranks "
           "did not call their collectives in the same order, or a rank's thread blocked on "
           "the device)";
  return "";
}

}  // namespace dsv32::gpu

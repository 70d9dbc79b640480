// The stack's streams (streams.cu): the main stream and the indexer's (aux), each with its own
// cuBLAS handle and workspace, the fork and join between them, and how many forks were made.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "../buffers.cuh"
#include "launch_state.cuh"

namespace dsv32::gpu::stack {

class Streams {
 public:
  Streams();
  ~Streams();
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;

  cudaStream_t main() const { return main_; }
  cudaStream_t aux() const { return aux_; }
  /// The cuBLAS handle of stream s (main or aux).
  cublasHandle_t handle(cudaStream_t s) const { return s == aux_ ? blas_aux_ : blas_; }

  /// aux waits for the main stream's work so far (through st.graph while one records).
  void fork(const LaunchState& st);
  /// The main stream waits for aux's work so far, when forked.
  void join(const LaunchState& st);
  bool forked() const { return forked_; }
  /// A recording that failed has joined the side stream itself: no fork is open.
  void drop_fork() { forked_ = false; }
  /// Forks made so far, and a count to restore (a capture's warm-up forks are not the plan's).
  int forks() const { return forks_; }
  void set_forks(int n) { forks_ = n; }
  /// Both streams' work done.
  void synchronize(const char* what) const;

 private:
  void release() noexcept;
  cudaStream_t main_ = nullptr, aux_ = nullptr;
  cublasHandle_t blas_ = nullptr, blas_aux_ = nullptr;
  std::unique_ptr<detail::DeviceBuffer<std::uint8_t>> workspace_, workspace_aux_;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool forked_ = false;
  int forks_ = 0;
};

void check_blas(cublasStatus_t s, const char* what);

}  // namespace dsv32::gpu::stack

// The CUDA build of the DeepSeek-V3.2 attention stack (MATH.md), op by op as BOUNDARIES.md
// names them, over static device buffers sized for a capture size. Host-only header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dsv32/oracle/oracle.hpp"

namespace dsv32::gpu {

/// The ops of one layer, in order (BOUNDARIES.md section 1).
const std::vector<std::string>& op_names();

/// One stack on device 0: weights, paged caches, the shared top-k buffer and every inter-op
/// tensor, allocated once for capture sizes up to `max_tokens`.
class Stack {
 public:
  Stack(const Config& cfg, const Weights& weights, int num_blocks, int max_tokens);
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  /// Runs one step eagerly at its capture size (the `eager` plan) and returns every stage of
  /// rows [0, T_a) with the oracle's names, shapes and the storage dtypes.
  StepTrace step(const StepInput& in);

  const Config& config() const;

  struct Impl;  // defined in stack.cu, per storage type

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv32::gpu

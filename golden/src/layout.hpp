// Helpers the golden writer and reader share: a stage's shape and its dtype in each trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsv32/oracle/config.hpp"
#include "dsv32/oracle/stages.hpp"
#include "dsv32/oracle/tensor.hpp"

namespace dsv32::golden::detail {

using Shape = std::vector<std::int64_t>;

/// (T_a, the stage's tail).
inline Shape stage_shape(const Config& c, Stage s, std::int64_t Ta) {
  Shape shape{Ta};
  for (std::int64_t d : stage_tail(c, s)) shape.push_back(d);
  return shape;
}

/// A stage's dtype in `expected` (T0: float64, but int32 for an int32 stage, topk) or `emulated`
/// (T1: its storage dtype).
inline DType trace_dtype(const Config& c, Stage s, bool exact) {
  if (stage_info(s).storage == Storage::int32) return DType::int32;
  return exact ? DType::float64 : storage_dtype(c, s);
}

}  // namespace dsv32::golden::detail

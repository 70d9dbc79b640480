// The error of the boundary library: an invalid plan or a name that is no plan, op or mutant.
#pragma once

#include <stdexcept>

namespace dsv32::boundary {

/// Raised for an invalid plan; the message names the layer and op (or the unknown name).
struct PlanError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace dsv32::boundary

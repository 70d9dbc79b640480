// Dense row-major containers shared by the oracle, the golden files and the comparers.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv32 {

/// Row-major fp64 matrix: rows are tokens (or output features of a weight).
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXd;

/// Logical dtype of a stored tensor (GOLDEN.md names).
enum class DType { bfloat16, float8_e4m3fn, float32, float64, int32 };
std::string_view to_string(DType t);
DType parse_dtype(std::string_view s);  // throws std::invalid_argument

/// A named n-d tensor whose values are held as doubles (ints and fp8 codes' values are exact).
struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<double> data;  // row-major
  DType dtype = DType::float64;

  std::int64_t numel() const;
  /// "[3, 4, 5]"
  std::string shape_string() const;
  /// Flat index -> "(i, j, k)".
  std::string index_string(std::int64_t flat) const;
  static Tensor from(std::string name, const Mat& m, DType dtype);
  static Tensor from(std::string name, std::vector<std::int64_t> shape, std::vector<double> data,
                     DType dtype);
};

}  // namespace dsv32

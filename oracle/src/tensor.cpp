#include "dsv32/oracle/tensor.hpp"

#include <array>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace dsv32 {
namespace {
constexpr std::array<std::pair<DType, std::string_view>, 5> kNames{{
    {DType::bfloat16, "bfloat16"},
    {DType::float8_e4m3fn, "float8_e4m3fn"},
    {DType::float32, "float32"},
    {DType::float64, "float64"},
    {DType::int32, "int32"},
}};
}  // namespace

std::string_view to_string(DType t) {
  for (const auto& [d, s] : kNames)
    if (d == t) return s;
  return "?";
}

DType parse_dtype(std::string_view s) {
  for (const auto& [d, n] : kNames)
    if (n == s) return d;
  throw std::invalid_argument("unknown dtype '" + std::string(s) + "'");
}

std::int64_t Tensor::numel() const {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Tensor::index_string(std::int64_t flat) const {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::string s = "(";
  for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + ")";
}

Tensor Tensor::from(std::string name, const Mat& m, DType dtype) {
  Tensor t{std::move(name), {m.rows(), m.cols()}, {}, dtype};
  t.data.assign(m.data(), m.data() + m.size());
  return t;
}

Tensor Tensor::from(std::string name, std::vector<std::int64_t> shape, std::vector<double> data,
                    DType dtype) {
  Tensor t{std::move(name), std::move(shape), std::move(data), dtype};
  if (t.numel() != static_cast<std::int64_t>(t.data.size()))
    throw std::invalid_argument("tensor '" + t.name + "': shape " + t.shape_string() +
                                " does not match " + std::to_string(t.data.size()) + " values");
  return t;
}

}  // namespace dsv32

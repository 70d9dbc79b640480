// The oracle's products and reductions, each with a summation order fixed by this code alone, so
// that the oracle's bits are a function of its inputs: the same on any x86-64 CPU (whatever vector
// width the build targets), any thread count and any cache sizes (docs/DETERMINISM.md).
#pragma once

#include <Eigen/Core>
#include <string_view>

#include "dsv32/oracle/tensor.hpp"

namespace dsv32::fixed {

using MatRef = Eigen::Ref<Mat, 0, Eigen::OuterStride<>>;
using ConstMatRef = Eigen::Ref<const Mat, 0, Eigen::OuterStride<>>;

/// a . b over n terms: term i goes to lane i mod 8, each lane a chain of fused multiply-adds in
/// ascending i from +0, and the lanes are summed as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
double dot(const double* a, const double* b, Eigen::Index n);

/// C = A * B^T, every C(i, j) = dot(A.row(i), B.row(j)). Parallel over C's tiles when called
/// outside a parallel region.
void gemm_nt(MatRef C, const ConstMatRef& A, const ConstMatRef& B);

/// C = A * B, every C(i, j) one chain of fused multiply-adds over k ascending from +0.
void gemm_nn(MatRef C, const ConstMatRef& A, const ConstMatRef& B);

/// x[0] + x[1] + ... in ascending order.
double sum(const double* x, Eigen::Index n);

/// x[0]^2 + x[1]^2 + ... in ascending order (each square rounded, then added).
double sum_squares(const double* x, Eigen::Index n);

/// The instruction set this build's kernels run on ("avx512", "avx2", "scalar"); the bits are the
/// same for each.
std::string_view isa();

}  // namespace dsv32::fixed

// The oracle's products against scalar statements of their documented summation order
// (fixed_order.hpp): bitwise, over tile edges, depth tails and strided views, on any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>

#include "dsv32/oracle/fixed_order.hpp"
#include "dsv32/oracle/rng.hpp"

namespace dsv32 {
namespace {

using Index = Eigen::Index;

/// Values over twelve binades, so that a different summation order changes the last bits.
Mat spread(Index rows, Index cols, std::uint64_t seed) {
  const rng::Stream s(seed, "fixed-order");
  Mat m(rows, cols);
  for (Index i = 0; i < m.size(); ++i)
    m.data()[i] = s.symmetric(2 * i) * std::exp2(std::floor(12.0 * s.uniform(2 * i + 1)) - 6.0);
  return m;
}

double lane_dot(const double* a, const double* b, Index n) {
  double lane[8] = {};
  for (Index i = 0; i < n; ++i) lane[i % 8] = std::fma(a[i], b[i], lane[i % 8]);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

double chain(const double* a, Index sa, const double* b, Index sb, Index n) {
  double acc = 0.0;
  for (Index i = 0; i < n; ++i) acc = std::fma(a[i * sa], b[i * sb], acc);
  return acc;
}

std::string where(Index m, Index n, Index k, Index i, Index j) {
  return "m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k) + ", C(" +
         std::to_string(i) + ", " + std::to_string(j) + ")";
}

// Edges of the register tiles (up to 6 rows and 6 columns), of the blocks (64, 96, 256), of a lane
// group (k % 8) and of the in-register depth (2048) and its chunks (512).
const Index kRows[] = {1, 3, 6, 7, 65, 97};
const Index kCols[] = {1, 2, 5, 9, 17, 67, 257};
const Index kDepths[] = {0, 1, 7, 8, 13, 512, 517, 2049, 2053};

/// check(m, n, k, threads) for every shape of the edge lists, on 1 thread and on 2.
template <class F>
void over_shapes(F&& check) {
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (Index m : kRows)
      for (Index n : kCols)
        for (Index k : kDepths)
          if (m * n * k <= 4'000'000) check(m, n, k, threads);
  }
}

TEST(FixedOrder, GemmNtIsTheLaneDotOfEveryRowPair) {
  over_shapes([](Index m, Index n, Index k, int threads) {
    // Views with row strides wider than their rows, as the oracle passes head slices.
    const Mat A = spread(m, k + 3, 1), B = spread(n, k + 5, 2);
    Mat C = Mat::Constant(m, n + 2, std::nan(""));
    fixed::gemm_nt(C.leftCols(n), A.leftCols(k), B.leftCols(k));
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < n; ++j) {
        const double want = lane_dot(&A(i, 0), &B(j, 0), k);
        ASSERT_EQ(C(i, j), want) << where(m, n, k, i, j) << ", threads " << threads;
        ASSERT_EQ(fixed::dot(&A(i, 0), &B(j, 0), k), want) << where(m, n, k, i, j);
      }
    ASSERT_TRUE(std::isnan(C(0, n))) << "wrote outside C: " << where(m, n, k, 0, n);
  });
}

TEST(FixedOrder, GemmNnIsOneChainPerElement) {
  over_shapes([](Index m, Index n, Index k, int threads) {
    const Mat A = spread(m, k + 3, 3), B = spread(k, n + 5, 4);
    Mat C = Mat::Constant(m, n + 2, std::nan(""));
    fixed::gemm_nn(C.leftCols(n), A.leftCols(k), B.leftCols(n));
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < n; ++j)
        ASSERT_EQ(C(i, j), chain(&A(i, 0), 1, B.data() + j, B.outerStride(), k))
            << where(m, n, k, i, j) << ", threads " << threads;
    ASSERT_TRUE(std::isnan(C(0, n))) << "wrote outside C: " << where(m, n, k, 0, n);
  });
}

TEST(FixedOrder, TheDataIsSensitiveToTheOrder) {
  // Guards the two tests above against vacuous inputs: the lane order and a plain chain differ.
  const Mat a = spread(1, 2053, 5), b = spread(1, 2053, 6);
  EXPECT_NE(lane_dot(a.data(), b.data(), a.cols()), chain(a.data(), 1, b.data(), 1, a.cols()));
}

TEST(FixedOrder, SumsAreAscendingChains) {
  const Mat x = spread(1, 1001, 7);
  double s = 0.0, q = 0.0;
  for (Index i = 0; i < x.cols(); ++i) s += x(0, i), q += x(0, i) * x(0, i);
  EXPECT_EQ(fixed::sum(x.data(), x.cols()), s);
  EXPECT_EQ(fixed::sum_squares(x.data(), x.cols()), q);
}

TEST(FixedOrder, MismatchedShapesAreRefused) {
  Mat C(2, 3);
  const Mat A = Mat::Zero(2, 4), B = Mat::Zero(3, 5);
  EXPECT_THROW(fixed::gemm_nt(C, A, B), std::invalid_argument);
  EXPECT_THROW(fixed::gemm_nn(C, A, B), std::invalid_argument);
}

}  // namespace
}  // namespace dsv32

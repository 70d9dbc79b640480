#include "dsv32/oracle/fixed_order.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace dsv32::fixed {
namespace {

using Index = Eigen::Index;

// V8: eight double lanes, whatever the vector width. Every operation is lane-wise and exactly
// rounded (fma is one rounding), so the three implementations give the same bits.
#if defined(__AVX512F__)
constexpr std::string_view kIsa = "avx512";
struct V8 {
  __m512d v;
};
inline V8 zero8() {
  return {_mm512_setzero_pd()};
}
inline V8 load8(const double* p) {
  return {_mm512_loadu_pd(p)};
}
inline void store8(double* p, V8 x) {
  _mm512_storeu_pd(p, x.v);
}
inline V8 bcast8(double x) {
  return {_mm512_set1_pd(x)};
}
inline V8 fma8(V8 a, V8 b, V8 c) {
  return {_mm512_fmadd_pd(a.v, b.v, c.v)};
}
// Register tiles (they change which elements are computed together, never an element's order).
constexpr int kNtRows = 4, kNtCols = 6, kNnRows = 6, kNnVecs = 2;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr std::string_view kIsa = "avx2";
struct V8 {
  __m256d lo, hi;
};
inline V8 zero8() {
  return {_mm256_setzero_pd(), _mm256_setzero_pd()};
}
inline V8 load8(const double* p) {
  return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)};
}
inline void store8(double* p, V8 x) {
  _mm256_storeu_pd(p, x.lo);
  _mm256_storeu_pd(p + 4, x.hi);
}
inline V8 bcast8(double x) {
  return {_mm256_set1_pd(x), _mm256_set1_pd(x)};
}
inline V8 fma8(V8 a, V8 b, V8 c) {
  return {_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
constexpr int kNtRows = 2, kNtCols = 2, kNnRows = 4, kNnVecs = 1;
#else
constexpr std::string_view kIsa = "scalar";
struct V8 {
  double v[8];
};
inline V8 zero8() {
  return {};
}
inline V8 load8(const double* p) {
  V8 r;
  std::copy(p, p + 8, r.v);
  return r;
}
inline void store8(double* p, V8 x) {
  std::copy(x.v, x.v + 8, p);
}
inline V8 bcast8(double x) {
  V8 r;
  std::fill(r.v, r.v + 8, x);
  return r;
}
inline V8 fma8(V8 a, V8 b, V8 c) {
  V8 r;
  for (int l = 0; l < 8; ++l) r.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
  return r;
}
constexpr int kNtRows = 2, kNtCols = 2, kNnRows = 2, kNnVecs = 1;
#endif

/// The first n lanes of p, the others +0 (a +0 product leaves a chain's value unchanged: a chain
/// that starts at +0 never holds -0).
inline V8 load8(const double* p, int n) {
  alignas(64) double t[8] = {};
  std::copy(p, p + n, t);
  return load8(t);
}
inline void store8(double* p, V8 x, int n) {
  alignas(64) double t[8];
  store8(t, x);
  std::copy(t, t + n, p);
}
inline double reduce8(V8 x) {
  alignas(64) double t[8];
  store8(t, x);
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

/// Whether a product of this many multiply-adds is worth the threads (outside a parallel region).
bool go_parallel(Index m, Index n, Index k) {
  return !omp_in_parallel() && omp_get_max_threads() > 1 &&
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) > 1 << 18;
}

/// Rows [0, rows) x columns [0, len) of `a` (row stride lda) copied contiguous into `packed`
/// (64-byte aligned rows: a stride of a multiple of 8); a and lda then point at the copy. Rows a
/// block reuses for every tile then fall into no common cache sets (head slices have strides of
/// hundreds of KB).
void pack_rows(const double*& a, Index& lda, Index rows, Index len, Mat& packed) {
  packed.resize(rows, (len + 7) / 8 * 8);
  for (Index i = 0; i < rows; ++i) std::copy(a + i * lda, a + i * lda + len, &packed(i, 0));
  a = packed.data();
  lda = packed.cols();
}

/// Runs fn(b) for b in [0, blocks), across threads when `parallel`.
template <class Fn>
void for_blocks(Index blocks, bool parallel, Fn&& fn) {
  if (!parallel) {  // no OpenMP region at all: small products are called per cache block
    for (Index b = 0; b < blocks; ++b) fn(b);
    return;
  }
#pragma omp parallel for schedule(dynamic)
  for (Index b = 0; b < blocks; ++b) fn(b);
}

/// table[r - 1][c - 1] = make.operator()<r, c>() for r <= R, c <= Cols: a tile function for every
/// edge shape of a register tile.
template <int R, class Make, int... J>
constexpr auto tile_row(Make make, std::integer_sequence<int, J...>) {
  return std::array{make.template operator()<R, J + 1>()...};
}
template <int Cols, class Make, int... I>
constexpr auto tile_table(Make make, std::integer_sequence<int, I...>) {
  return std::array{tile_row<I + 1>(make, std::make_integer_sequence<int, Cols>{})...};
}

// ---- C = A * B^T: lanes along k ---------------------------------------------------------------

/// out[e] = reduce8(a[e]) for e < 8, the same additions in the same pairs, eight at once.
inline void reduce8x8(const V8* a, double* out) {
#if defined(__AVX512F__)
  __m512d s[4];  // s[q] = [a[2q] lanes l + l+4 | a[2q+1] lanes l + l+4]
  for (int q = 0; q < 4; ++q)
    s[q] = _mm512_add_pd(_mm512_shuffle_f64x2(a[2 * q].v, a[2 * q + 1].v, 0x44),
                         _mm512_shuffle_f64x2(a[2 * q].v, a[2 * q + 1].v, 0xEE));
  __m512d u[2];  // u[h] = [t0, t1] of a[4h .. 4h+3], t0 = s0 + s2, t1 = s1 + s3
  for (int h = 0; h < 2; ++h)
    u[h] = _mm512_add_pd(_mm512_shuffle_f64x2(s[2 * h], s[2 * h + 1], 0x88),
                         _mm512_shuffle_f64x2(s[2 * h], s[2 * h + 1], 0xDD));
  alignas(64) double r[8];  // a0 a4 a1 a5 a2 a6 a3 a7
  _mm512_store_pd(r, _mm512_add_pd(_mm512_unpacklo_pd(u[0], u[1]), _mm512_unpackhi_pd(u[0], u[1])));
  for (int e = 0; e < 4; ++e) out[e] = r[2 * e], out[e + 4] = r[2 * e + 1];
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d u[4];  // u[p] = [t0, t1] of a[2p], a[2p+1]
  for (int p = 0; p < 4; ++p) {
    const __m256d x = _mm256_add_pd(a[2 * p].lo, a[2 * p].hi);
    const __m256d y = _mm256_add_pd(a[2 * p + 1].lo, a[2 * p + 1].hi);
    u[p] = _mm256_add_pd(_mm256_permute2f128_pd(x, y, 0x20), _mm256_permute2f128_pd(x, y, 0x31));
  }
  alignas(32) double r[8];  // a0 a2 a1 a3, a4 a6 a5 a7
  _mm256_store_pd(r, _mm256_hadd_pd(u[0], u[1]));
  _mm256_store_pd(r + 4, _mm256_hadd_pd(u[2], u[3]));
  for (int h = 0; h < 2; ++h)
    out[4 * h] = r[4 * h], out[4 * h + 1] = r[4 * h + 2], out[4 * h + 2] = r[4 * h + 1],
            out[4 * h + 3] = r[4 * h + 3];
#else
  for (int e = 0; e < 8; ++e) out[e] = reduce8(a[e]);
#endif
}

/// Products whose depth is at most this keep their lane accumulators in registers for the whole
/// depth; deeper ones go through a block's accumulators in memory, kNtDepth of k at a time.
constexpr Index kNtDirectDepth = 2048, kNtDepth = 512;  // kNtDepth % 8 == 0
constexpr Index kNtBlockRows = 64, kNtBlockCols = 64;

/// One MR x NR tile of C over `len` terms of k (A and B point at the first) in lanes: its
/// accumulators start at +0 or from P (`resume`), and end in P or, reduced, in C (`finish`).
/// len is a multiple of 8 except at the end of k.
template <int MR, int NR>
void nt_tile(const double* A, Index lda, const double* B, Index ldb, Index len, V8* P, Index ldp,
             double* C, Index ldc, bool resume, bool finish) {
  V8 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = resume ? P[i * ldp + j] : zero8();
  Index k = 0;
  for (; k + 8 <= len; k += 8) {
    V8 a[MR], b[NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = load8(A + i * lda + k);
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) b[j] = load8(B + j * ldb + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = fma8(a[i], b[j], acc[i][j]);
  }
  if (k < len) {
    const int n = static_cast<int>(len - k);
    V8 a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = load8(A + i * lda + k, n);
    for (int j = 0; j < NR; ++j) b[j] = load8(B + j * ldb + k, n);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = fma8(a[i], b[j], acc[i][j]);
  }
  if (!finish) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) P[i * ldp + j] = acc[i][j];
    return;
  }
  constexpr int n = MR * NR;
  double out[n];
  int e = 0;
  for (; e + 8 <= n; e += 8) reduce8x8(&acc[0][0] + e, out + e);
  for (; e < n; ++e) out[e] = reduce8((&acc[0][0])[e]);
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) C[i * ldc + j] = out[i * NR + j];
}

/// kNtTiles[mr - 1][nr - 1]: the tile for the edges too.
constexpr auto kNtTiles = tile_table<kNtCols>([]<int R, int C>() { return &nt_tile<R, C>; },
                                              std::make_integer_sequence<int, kNtRows>{});

// ---- C = A * B: lanes along C's columns -------------------------------------------------------

constexpr Index kNnBlockRows = 96, kNnBlockCols = 256, kNnDepth = 256;

/// C[MR rows, cols <= 8 NV columns] continued over k in [k0, k1) (from +0 when `first`).
template <int MR, int NV>
void nn_tile(double* C, Index ldc, const double* A, Index lda, const double* B, Index ldb, Index k0,
             Index k1, int cols, bool first) {
  const int last = cols - 8 * (NV - 1);  // lanes of the last vector that are C's columns
  const auto ld = [last](const double* p, int j) {
    return j < NV - 1 || last == 8 ? load8(p + 8 * j) : load8(p + 8 * j, last);
  };
  V8 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = first ? zero8() : ld(C + i * ldc, j);
  if (last == 8) {
    for (Index k = k0; k < k1; ++k) {
      V8 b[NV];
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) b[j] = load8(B + k * ldb + 8 * j);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const V8 a = bcast8(A[i * lda + k]);
#pragma GCC unroll 8
        for (int j = 0; j < NV; ++j) acc[i][j] = fma8(a, b[j], acc[i][j]);
      }
    }
  } else {
    for (Index k = k0; k < k1; ++k) {
      V8 b[NV];
      for (int j = 0; j < NV; ++j) b[j] = ld(B + k * ldb, j);
      for (int i = 0; i < MR; ++i) {
        const V8 a = bcast8(A[i * lda + k]);
        for (int j = 0; j < NV; ++j) acc[i][j] = fma8(a, b[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      if (j < NV - 1 || last == 8)
        store8(C + i * ldc + 8 * j, acc[i][j]);
      else
        store8(C + i * ldc + 8 * j, acc[i][j], last);
    }
}

constexpr auto kNnTiles = tile_table<kNnVecs>([]<int R, int C>() { return &nn_tile<R, C>; },
                                              std::make_integer_sequence<int, kNnRows>{});

void check_shapes(const char* what, Index cr, Index cc, Index r, Index c, Index ka, Index kb) {
  if (cr != r || cc != c || ka != kb)
    throw std::invalid_argument(std::string(what) + ": shapes do not match (C " +
                                std::to_string(cr) + "x" + std::to_string(cc) + ", product " +
                                std::to_string(r) + "x" + std::to_string(c) + ", depth " +
                                std::to_string(ka) + " vs " + std::to_string(kb) + ")");
}

}  // namespace

double dot(const double* a, const double* b, Eigen::Index n) {
  V8 acc = zero8();
  Index k = 0;
  for (; k + 8 <= n; k += 8) acc = fma8(load8(a + k), load8(b + k), acc);
  if (k < n) {
    const int r = static_cast<int>(n - k);
    acc = fma8(load8(a + k, r), load8(b + k, r), acc);
  }
  return reduce8(acc);
}

void gemm_nt(MatRef C, const ConstMatRef& A, const ConstMatRef& B) {
  const Index m = A.rows(), n = B.rows(), k = A.cols();
  check_shapes("gemm_nt", C.rows(), C.cols(), m, n, k, B.cols());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    C.setZero();
    return;
  }
  const Index bi = (m + kNtBlockRows - 1) / kNtBlockRows;
  Index cols = kNtBlockCols;  // B rows a block: narrower when there would be too few blocks
  const bool parallel = go_parallel(m, n, k);
  if (parallel) {
    const Index want = 2 * omp_get_max_threads(), per_row = (want + bi - 1) / bi;
    const Index narrow = ((n + per_row - 1) / per_row + kNtCols - 1) / kNtCols * kNtCols;
    cols = std::clamp(narrow, Index{2 * kNtCols}, kNtBlockCols);
  }
  const Index bj = (n + cols - 1) / cols;
  const bool direct = k <= kNtDirectDepth;
  for_blocks(bi * bj, parallel && bi * bj > 1, [&](Index blk) {
    const Index i0 = (blk % bi) * kNtBlockRows, j0 = (blk / bi) * cols;
    const Index mb = std::min(kNtBlockRows, m - i0), nb = std::min(cols, n - j0);
    thread_local std::vector<V8> P;  // the block's lane accumulators (row stride nb)
    thread_local Mat packed;         // the block's rows of A, contiguous and 64-byte aligned
    if (!direct) P.resize(static_cast<std::size_t>(mb * nb));
    const Index depth = direct ? k : kNtDepth;
    for (Index k0 = 0; k0 < k; k0 += depth) {
      const Index len = std::min(k, k0 + depth) - k0;
      const double* a = A.data() + i0 * A.outerStride() + k0;
      Index lda = A.outerStride();
      if (mb > kNtRows) pack_rows(a, lda, mb, len, packed);
      for (Index j = 0; j < nb; j += kNtCols) {
        const Index nr = std::min<Index>(kNtCols, nb - j);
        for (Index i = 0; i < mb; i += kNtRows) {
          const Index mr = std::min<Index>(kNtRows, mb - i);
          kNtTiles[mr - 1][nr - 1](a + i * lda, lda, B.data() + (j0 + j) * B.outerStride() + k0,
                                   B.outerStride(), len, direct ? nullptr : P.data() + i * nb + j,
                                   nb, C.data() + (i0 + i) * C.outerStride() + j0 + j,
                                   C.outerStride(), k0 > 0, k0 + len == k);
        }
      }
    }
  });
}

void gemm_nn(MatRef C, const ConstMatRef& A, const ConstMatRef& B) {
  const Index m = A.rows(), n = B.cols(), k = A.cols();
  check_shapes("gemm_nn", C.rows(), C.cols(), m, n, k, B.rows());
  if (m == 0 || n == 0) return;
  if (k == 0) {
    C.setZero();
    return;
  }
  constexpr Index tile_cols = 8 * kNnVecs;
  const Index bi = (m + kNnBlockRows - 1) / kNnBlockRows;
  const Index bj = (n + kNnBlockCols - 1) / kNnBlockCols;
  for_blocks(bi * bj, go_parallel(m, n, k) && bi * bj > 1, [&](Index blk) {
    const Index i0 = (blk % bi) * kNnBlockRows, j0 = (blk / bi) * kNnBlockCols;
    const Index mb = std::min(kNnBlockRows, m - i0), nb = std::min(kNnBlockCols, n - j0);
    thread_local Mat packed;  // the block's rows of A, contiguous
    const double* a = A.data() + i0 * A.outerStride();
    Index lda = A.outerStride();
    if (mb > kNnRows && lda > k) pack_rows(a, lda, mb, k, packed);
    for (Index k0 = 0; k0 < k; k0 += kNnDepth) {
      const Index k1 = std::min(k, k0 + kNnDepth);
      for (Index j = 0; j < nb; j += tile_cols) {
        const int cols = static_cast<int>(std::min(tile_cols, nb - j));
        const int nv = (cols + 7) / 8;
        for (Index i = 0; i < mb; i += kNnRows) {
          const Index mr = std::min<Index>(kNnRows, mb - i);
          kNnTiles[mr - 1][nv - 1](C.data() + (i0 + i) * C.outerStride() + j0 + j, C.outerStride(),
                                   a + i * lda, lda, B.data() + j0 + j, B.outerStride(), k0, k1,
                                   cols, k0 == 0);
        }
      }
    }
  });
}

double sum(const double* x, Eigen::Index n) {
  double s = 0.0;
  for (Index i = 0; i < n; ++i) s += x[i];
  return s;
}

double sum_squares(const double* x, Eigen::Index n) {
  double s = 0.0;
  for (Index i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

std::string_view isa() {
  return kIsa;
}

}  // namespace dsv32::fixed

// Index-score rows computed in parallel and consumed in order: what the judge and the golden
// generator do with every (row, F layer) pair of a step, 16k-key rows included.
#pragma once

#include <algorithm>
#include <exception>
#include <vector>

#include "dsv32/oracle/oracle.hpp"

namespace dsv32 {

/// Rows [0, n) scored by `score(t)` (an IndexScores) across OpenMP threads, a chunk of rows at
/// a time (a chunk of 16k-key rows stays small in memory), each chunk handed to
/// `use(t, scores)` in row order on this thread: what `use` does cannot depend on the thread
/// count. The first error a `score` throws is rethrown.
template <class Score, class Use>
void scored_rows(int n, Score&& score, Use&& use) {
  constexpr int kChunk = 64;
  std::vector<IndexScores> chunk(kChunk);
  for (int t0 = 0; t0 < n; t0 += kChunk) {
    const int m = std::min(kChunk, n - t0);
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic) if (m > 1)
    for (int i = 0; i < m; ++i) {
      try {
        chunk[i] = score(t0 + i);
      } catch (...) {
#pragma omp critical
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (int i = 0; i < m; ++i) use(t0 + i, chunk[i]);
  }
}

}  // namespace dsv32

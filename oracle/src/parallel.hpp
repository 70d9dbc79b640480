// OpenMP loops that carry an exception out of the parallel region instead of terminating.
#pragma once

#include <exception>
#include <mutex>

namespace dsv32::detail {

/// Runs fn(i) for i in [0, n) across OpenMP threads (dynamic schedule); rethrows the first error.
template <class Fn>
void parallel_for(int n, Fn&& fn) {
  std::exception_ptr error;
  std::mutex m;
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (int i = 0; i < n; ++i) {
    try {
      fn(i);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(m);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace dsv32::detail

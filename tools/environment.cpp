#include "environment.hpp"

#include <fmt/core.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dsv32::tools {
namespace {

constexpr long kMaxThreads = 1024;
/// Address space kept for the work itself (the first allocations, libraries, the HDF5 image).
constexpr double kRoomForWork = 256.0 * (1 << 20);

std::string gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
}

std::string mib(double bytes) {
  return fmt::format("{:.0f} MiB", bytes / double(1 << 20));
}

/// The threads of the outermost parallel region (OMP_NUM_THREADS's first count), or 0 with
/// `why` set when the variable is malformed. Unset: one per CPU this process may run on.
long omp_threads(std::string& why) {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int n = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    return n > 0 ? n : std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  }
  const std::string text = v;
  long first = 0;
  std::size_t at = 0;
  while (true) {  // a comma-separated list of positive integers (one per nesting level)
    const std::size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    if (item.empty() || item.size() > 6 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      why = "OMP_NUM_THREADS='" + text + "' is not a list of thread counts (unset it or fix it)";
      return 0;
    }
    const long n = std::stol(item);
    if (n < 1 || n > kMaxThreads) {
      why = "OMP_NUM_THREADS='" + text + "': each thread count must be in [1, " +
            std::to_string(kMaxThreads) + "] (unset it or lower it)";
      return 0;
    }
    if (first == 0) first = n;
    if (end == text.size()) return first;
    at = end + 1;
  }
}

/// A size as libgomp reads OMP_STACKSIZE (a number, then B, K, M or G; K when none), or -1.
double parse_size(std::string text) {
  const auto trim = [&] {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
      text.erase(0, 1);
  };
  trim();
  double unit = 1024;
  if (!text.empty() && std::isalpha(static_cast<unsigned char>(text.back()))) {
    const char u = static_cast<char>(std::tolower(static_cast<unsigned char>(text.back())));
    unit = u == 'b' ? 1 : u == 'k' ? 1024 : u == 'm' ? 1 << 20 : u == 'g' ? 1 << 30 : 0;
    text.pop_back();
    trim();
  }
  if (unit == 0 || text.empty() || text.size() > 12 ||
      text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stod(text) * unit;
}

/// The stack of each thread libgomp starts and what sets it, or -1 with `why` set.
double thread_stack(std::string& source, std::string& why) {
  for (const char* name : {"OMP_STACKSIZE", "GOMP_STACKSIZE"})
    if (const char* v = std::getenv(name)) {
      const double bytes = parse_size(v);
      if (bytes <= 0) {
        why = std::string(name) + "='" + v + "' is not a size (a number, then B, K, M or G)";
        return -1;
      }
      source = name;
      return bytes;
    }
  // libgomp's threads take the default of new threads: the stack limit (ulimit -s).
  pthread_attr_t attr;
  std::size_t bytes = 0;
  if (::pthread_getattr_default_np(&attr) == 0) {
    ::pthread_attr_getstacksize(&attr, &bytes);
    ::pthread_attr_destroy(&attr);
  }
  source = "ulimit -s; OMP_STACKSIZE sets it";
  return static_cast<double>(bytes);
}

/// This process's address space now (bytes), from /proc/self/statm; 0 if unknown.
double address_space_used() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0;
  statm >> pages;
  return pages * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::string omp_environment_problem() {
  std::string why;
  const long threads = omp_threads(why);
  if (!why.empty()) return why;
  std::string source;
  const double stack = thread_stack(source, why);
  if (!why.empty()) return why;
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return "";
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double stacks = static_cast<double>(threads - 1) * (stack + page);  // + a guard page
  const double left = static_cast<double>(as.rlim_cur) - address_space_used() - kRoomForWork;
  if (stacks <= left) return "";
  const char* set = std::getenv("OMP_NUM_THREADS");
  return (set ? "OMP_NUM_THREADS=" + std::string(set)
              : "OMP_NUM_THREADS unset (one thread per CPU, " + std::to_string(threads) + ")") +
         ": " + std::to_string(threads) + " threads with a stack of " + mib(stack) + " each (" +
         source + ") need " + gib(stacks) + " of address space, over the " + gib(left) +
         " this process has left of its " + gib(static_cast<double>(as.rlim_cur)) +
         " limit (ulimit -v) with " + mib(kRoomForWork) +
         " kept for the work: lower OMP_NUM_THREADS or the stack size, or raise the limit";
}

}  // namespace dsv32::tools

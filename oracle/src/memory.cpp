#include "dsv32/oracle/memory.hpp"

#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dsv32 {

void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_MAX, 0);  // serve large blocks from the heap, which keeps its pages
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

}  // namespace dsv32

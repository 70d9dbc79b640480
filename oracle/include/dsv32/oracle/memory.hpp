// Process-wide allocator tuning for long oracle runs.
#pragma once

namespace dsv32 {

/// Keeps freed large blocks in the heap instead of returning them to the kernel (glibc mallopt).
/// The oracle allocates many large temporaries per step; on machines where page faults are
/// expensive (sandboxed VMs) fresh mmap'ed pages cost more than the arithmetic. Call once at
/// program start (the dsv32 tool and the benchmarks do); a no-op without glibc.
void keep_freed_memory();

}  // namespace dsv32

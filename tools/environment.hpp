// The environment the tool runs in, checked before anything runs (docs/BAD_INPUT.md, "Command-line
// values"): what libgomp reads at start-up and would otherwise fail on in its own words.
#pragma once

#include <string>

namespace dsv32::tools {

/// Why the OpenMP environment cannot be honoured, naming the variable ("OMP_NUM_THREADS='x' is
/// not a list of thread counts"), or "". Checks OMP_NUM_THREADS (a list of counts in [1, 1024]:
/// asked for 100000, libgomp crashed or asked for 350 GB), OMP_STACKSIZE and GOMP_STACKSIZE
/// (sizes as libgomp reads them), and that the threads' stacks fit the address space this
/// process may still take (RLIMIT_AS, `ulimit -v`), with room for the work: 1000 threads of 8
/// MiB under a 4 GiB bound ended in libgomp's "Thread creation failed".
std::string omp_environment_problem();

}  // namespace dsv32::tools

// The kernel thread pool: how many threads autograd_lite's kernels (matrix products,
// convolutions, large elementwise loops) may use.
//
// Contract
// - One process-wide pool. `numThreads()` threads work on a kernel: the calling thread plus
//   numThreads() - 1 workers, started lazily on the first kernel big enough to split.
// - The default is the number of CPUs this process may run on (sched_getaffinity), so a process
//   pinned to 2 cores uses 2 threads. Programs read LOOM_AUTOGRAD_THREADS through Loom's
//   settings registry and pass it to setNumThreads (autograd_lite itself reads no environment).
// - Results do not depend on the thread count, bit for bit, on any CPU and BLAS core type: every
//   kernel splits its output so each element is computed by exactly one thread, and the split
//   itself (which ranges parallelFor hands out, which blocks gemm gives each BLAS call) is a
//   function of the problem's shape only, never of the thread count. One thread runs the same
//   ranges and the same BLAS calls one after another. That matters because a range's bounds
//   can change an element's rounding: a BLAS kernel's result for C[i][j] depends on the shape
//   of the block it computes (edge micro-kernels, the blocking of k), and a vectorized loop
//   computes its scalar head and tail differently from its vector body (Eigen's exp, erf).
//   Tests: Ops.ResultsDoNotDependOnTheThreadCount, run under several OPENBLAS_CORETYPEs.
// - Thread-safety: setNumThreads may be called at any time from any thread except from inside a
//   parallelFor body (it waits for the running kernel to finish). Kernels called from two threads
//   at once are correct: one of them gets the pool, the other runs its kernel on its own thread. A
//   kernel never nests: a parallel region started from inside a worker runs inline. A process may
//   fork after kernels ran: the child starts its own workers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace loom::ag {

// The number of CPUs this process may run on (sched_getaffinity; at least 1).
int availableCpus();
// Threads a kernel uses (>= 1).
int numThreads();
// n >= 1 sets the count; n == 0 restores the default (availableCpus()). Negative n throws
// std::invalid_argument.
void setNumThreads(int n);

// What computes the matrix products (matmul, linear, conv2d), for logs: OpenBLAS's
// openblas_get_config() ("OpenBLAS <version> <build options>") and ", core <the kernel set it
// picked at load time>" (OPENBLAS_CORETYPE overrides the pick), or "Eigen <version>" in a build
// without OpenBLAS.
std::string matmulBackend();

// Runs fn(begin, end) over consecutive ranges covering [0, n) on up to numThreads() threads;
// returns when all are done. The ranges are L = max(grain, ceil(n / 256)) long (the last one
// shorter), whatever the thread count: with one thread fn runs on the same ranges in order. The
// first exception thrown by fn is rethrown here (after every range has finished or been skipped).
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace loom::ag

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
// openblas_get_config() ("OpenBLAS <version> <build options>") and ", core <the kernel set in
// use>" (picked at load time, or OPENBLAS_CORETYPE's; with "(OpenBLAS picked Prescott; switched:
// this CPU has AVX-512)" after an upgrade, see setGenericKernels), or "Eigen <version>" in a
// build without OpenBLAS. The first call fixes the kernel set, as the first product does.
std::string matmulBackend();

// What to do when OpenBLAS picked a generic kernel set (isGenericCoreType: Prescott, Core2,
// Nehalem...; Debian's 0.3.21 does so for CPU models it does not know) on a CPU with AVX2 and
// FMA or AVX-512, decided once, at the first product or matmulBackend() call:
enum class GenericKernels {
  // Keep it and say once on stderr what it costs and the fix (the default: autograd_lite reads
  // no environment, so it cannot tell whether OPENBLAS_CORETYPE chose the set on purpose).
  kWarn,
  // Switch OpenBLAS to the best set the CPU runs (SkylakeX with AVX-512, else Haswell), in this
  // process, through OpenBLAS's own start-up path (DYNAMIC_ARCH builds; otherwise: kWarn). For
  // when OPENBLAS_CORETYPE is unset: it is set during the switch and removed after. Programs
  // choose it when OPENBLAS_CORETYPE is unset (loom-train).
  kUpgrade,
  // Keep it silently (OPENBLAS_CORETYPE named it).
  kKeep,
};
// Takes effect only before the kernel set is fixed (above); thread-safe.
void setGenericKernels(GenericKernels policy);
// Whether OpenBLAS core type `core` (as openblas_get_corename spells it) is a generic one: an x86
// kernel set without AVX.
bool isGenericCoreType(const std::string& core);

// Runs fn(begin, end) over consecutive ranges covering [0, n) on up to numThreads() threads;
// returns when all are done. The ranges are L = max(grain, ceil(n / 256)) long (the last one
// shorter), whatever the thread count: with one thread fn runs on the same ranges in order. The
// first exception thrown by fn is rethrown here (after every range has finished or been skipped).
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace loom::ag

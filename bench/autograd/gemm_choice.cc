// Which threaded GEMM should autograd_lite use? Times the three float32 products of one
// training step of a 1024x1024 Linear layer at batch 64 (forward x W^T, input gradient g W,
// weight gradient g^T x) and a square 512^3 product, with:
//   pool:     autograd_lite's kernel as built (gemm.cc: blocks split over its thread pool, each
//             an OpenBLAS call, or Eigen's with LOOM_WITH_OPENBLAS=OFF);
//   eigen-omp: Eigen's own OpenMP-threaded GEMM (this file built with -fopenmp);
//   openblas: Debian's OpenBLAS (pthreads) cblas_sgemm.
// Built and run by gemm_choice.sh (not part of the CMake build: it needs -fopenmp and
// OpenBLAS, which the library does not use).
#include <cblas.h>
#include <omp.h>

#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "../../autograd_lite/src/gemm.h"
#include "loom/autograd/parallel.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Shape {
  const char* name;
  bool ta, tb;
  int m, n, k;
};

double processCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// GFLOP per wall-clock second and per process-CPU second (all threads' CPU time: on a loaded
// machine the steadier figure; with t threads it is at best the 1-thread rate, and any
// spinning or imbalance lowers it), the best of 5 runs of ~0.2 s wall each.
struct Rate {
  double wall = 0, cpu = 0;
};

template <class F>
Rate gflops(const Shape& s, F run) {
  run();
  Rate best;
  for (int r = 0; r < 5; ++r) {
    int iters = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = processCpuSeconds();
    double secs = 0;
    while (secs < 0.2) {
      run();
      ++iters;
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double flop = 2.0 * s.m * s.n * s.k * iters / 1e9;
    best.wall = std::max(best.wall, flop / secs);
    best.cpu = std::max(best.cpu, flop / (processCpuSeconds() - c0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const std::vector<Shape> shapes = {{"fwd x W^T 64x1024x1024", false, true, 64, 1024, 1024},
                                     {"dx g W 64x1024x1024", false, false, 64, 1024, 1024},
                                     {"dW g^T x 1024x1024x64", true, false, 1024, 1024, 64},
                                     {"square 512^3", false, false, 512, 512, 512}};
  loom::ag::setNumThreads(threads);
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
  Eigen::setNbThreads(threads);
  for (const Shape& s : shapes) {
    std::vector<float> a(size_t(s.m) * s.k, 0.5f), b(size_t(s.k) * s.n, 0.25f),
        c(size_t(s.m) * s.n);
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    const Rate pool = gflops(s, [&] {
      loom::ag::detail::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb,
                                    c.data(), s.n, false);
    });
    Eigen::Map<RowMat> am(a.data(), s.ta ? s.k : s.m, s.ta ? s.m : s.k);
    Eigen::Map<RowMat> bm(b.data(), s.tb ? s.n : s.k, s.tb ? s.k : s.n);
    Eigen::Map<RowMat> cm(c.data(), s.m, s.n);
    const Rate omp = gflops(s, [&] {
      if (s.ta) {
        cm.noalias() = am.transpose() * bm;
      } else if (s.tb) {
        cm.noalias() = am * bm.transpose();
      } else {
        cm.noalias() = am * bm;
      }
    });
    const Rate blas = gflops(s, [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
    });
    std::printf(
        "threads=%d %-24s GFLOP/s wall|cpu: pool %5.1f|%5.1f  eigen-omp %5.1f|%5.1f  "
        "openblas %5.1f|%5.1f\n",
        threads, s.name, pool.wall, pool.cpu, omp.wall, omp.cpu, blas.wall, blas.cpu);
  }
  return 0;
}

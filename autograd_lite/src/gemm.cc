// The threaded matrix-product kernel (gemm.h).
//
// How it works: Eigen maps the row-major operands in place (no copies) and runs its blocked,
// vectorized single-threaded GEMM. Products of kMinFlops or more are cut into tiles along C's
// longer dimension (rows of C are rows of op(A); columns of C are columns of op(B)) and
// parallelFor hands the tiles to the threads: a tile computes C[rows] = op(A)[rows] op(B) or
// C[:, cols] = op(A) op(B)[:, cols] with one single-threaded call. The tiles' bounds are a
// function of (m, n, k) alone (tileLen), never of the thread count, so the same calls with the
// same shapes and pointers happen on one thread or on many, and C is bitwise the same: a BLAS
// kernel's rounding of an element depends on the block shape it is given (its edge kernels and
// blocking of k; OpenBLAS's Haswell kernels, for one, round differently when a block's width
// changes), so blocks cut per thread made the result depend on the thread count. Tiles are
// about kTile long (a tile repacks the other operand, a cost amortized over the tile's length),
// of about equal length (so that threads sharing them stay balanced), a multiple of kAlign long
// (vector lanes stay full), at most kMaxTiles of them.
//
// With LOOM_AUTOGRAD_OPENBLAS (CMake's LOOM_WITH_OPENBLAS, on when Debian's OpenBLAS is
// installed) each tile is one cblas_?gemm call instead of Eigen's: on the AVX-512 dev VM
// OpenBLAS's kernels run 5-35% more GFLOP per CPU-second on the MLP's and transformer's shapes
// (bench/autograd/gemm_choice.sh, README there). OpenBLAS's own threads stay off
// (openblas_set_num_threads(1), before the first call): its threaded GEMM would cut each call
// into per-thread blocks again, by its own thread count (the CPUs it sees, or
// OPENBLAS_NUM_THREADS), bringing back the dependence this file removes, and would run its pool
// beside ours. Debian's pthread build is what is linked (libopenblas0-pthread; the serial build
// would do as well), so the count is set at run time rather than by the choice of library.
#include "gemm.h"

#include <Eigen/Core>
#include <algorithm>
#include <string>
#include <type_traits>

#include "loom/autograd/parallel.h"

#ifdef LOOM_AUTOGRAD_OPENBLAS
// The CBLAS entry points of libopenblas (declared here: Debian ships the library without a
// header unless libopenblas-dev is installed).
extern "C" {
enum LoomCblasOrder { kCblasRowMajor = 101 };
enum LoomCblasTranspose { kCblasNoTrans = 111, kCblasTrans = 112 };
void cblas_sgemm(LoomCblasOrder, LoomCblasTranspose, LoomCblasTranspose, int, int, int, float,
                 const float*, int, const float*, int, float, float*, int);
void cblas_dgemm(LoomCblasOrder, LoomCblasTranspose, LoomCblasTranspose, int, int, int, double,
                 const double*, int, const double*, int, double, double*, int);
}
#endif

namespace loom::ag::detail {

namespace {

constexpr int64_t kAlign = 16;
constexpr double kMinFlops = 2.0 * 64 * 64 * 64;
constexpr int64_t kTile = 256;
constexpr int64_t kMaxTiles = 64;

// The tile length along C's split dimension of length `len`: len cut into ceil(len / kTile)
// tiles (at most kMaxTiles) of about equal length, rounded up to a multiple of kAlign (the last
// tile takes the rest). Depends on the shape only.
int64_t tileLen(int64_t len) {
  const int64_t tiles = std::min(kMaxTiles, (len + kTile - 1) / kTile);
  const int64_t even = (len + tiles - 1) / tiles;
  return (even + kAlign - 1) / kAlign * kAlign;
}

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;

// C[r0:r1, c0:c1] (+)= op(A)[r0:r1, :] op(B)[:, c0:c1] on this thread.
template <class T>
void gemmBlock(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
               const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate, int64_t r0, int64_t r1,
               int64_t c0, int64_t c1) {
#ifdef LOOM_AUTOGRAD_OPENBLAS
  prepareKernels();  // once: OpenBLAS's threads off, its kernel set checked (blas_kernels.cc)
  const T* ab = transA ? a + r0 : a + r0 * lda;  // op(A)[r0:r1, :]
  const T* bb = transB ? b + c0 * ldb : b + c0;  // op(B)[:, c0:c1]
  const auto ta = transA ? kCblasTrans : kCblasNoTrans;
  const auto tb = transB ? kCblasTrans : kCblasNoTrans;
  const int rows = static_cast<int>(r1 - r0), cols = static_cast<int>(c1 - c0);
  const T beta = accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(kCblasRowMajor, ta, tb, rows, cols, static_cast<int>(k), 1.0f, ab,
                static_cast<int>(lda), bb, static_cast<int>(ldb), beta, c + r0 * ldc + c0,
                static_cast<int>(ldc));
  } else {
    cblas_dgemm(kCblasRowMajor, ta, tb, rows, cols, static_cast<int>(k), 1.0, ab,
                static_cast<int>(lda), bb, static_cast<int>(ldb), beta, c + r0 * ldc + c0,
                static_cast<int>(ldc));
  }
  (void)m;
  (void)n;
#else
  ConstMap<T> am(a, transA ? k : m, transA ? m : k, Eigen::OuterStride<>(lda));
  ConstMap<T> bm(b, transB ? n : k, transB ? k : n, Eigen::OuterStride<>(ldb));
  MutMap<T> cm(c + r0 * ldc + c0, r1 - r0, c1 - c0, Eigen::OuterStride<>(ldc));
  auto run = [&](const auto& lhs, const auto& rhs) {
    if (accumulate) {
      cm.noalias() += lhs * rhs;
    } else {
      cm.noalias() = lhs * rhs;
    }
  };
  const int64_t rows = r1 - r0, cols = c1 - c0;
  if (!transA && !transB) {
    run(am.middleRows(r0, rows), bm.middleCols(c0, cols));
  } else if (!transA && transB) {
    run(am.middleRows(r0, rows), bm.middleRows(c0, cols).transpose());
  } else if (transA && !transB) {
    run(am.middleCols(r0, rows).transpose(), bm.middleCols(c0, cols));
  } else {
    run(am.middleCols(r0, rows).transpose(), bm.middleRows(c0, cols).transpose());
  }
#endif
}

}  // namespace

template <class T>
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, T(0));
    }
    return;
  }
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
  const bool splitRows = m >= n;
  const int64_t len = splitRows ? m : n;
  const int64_t tile = tileLen(len);
  if (flops < kMinFlops || len <= tile) {
    gemmBlock(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate, 0, m, 0, n);
    return;
  }
  // One tile per range (grain = 1, and never more than 256 tiles: parallelFor's ranges are then
  // single tiles whatever the thread count).
  const int64_t tiles = (len + tile - 1) / tile;
  parallelFor(tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lo = t * tile;
      const int64_t hi = std::min(len, lo + tile);
      if (splitRows) {
        gemmBlock(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate, lo, hi, 0, n);
      } else {
        gemmBlock(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate, 0, m, lo, hi);
      }
    }
  });
}

template <class T>
void gemmBatched(int64_t batch, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                 const T* a, int64_t lda, int64_t strideA, const T* b, int64_t ldb, int64_t strideB,
                 T* c, int64_t ldc, int64_t strideC, bool accumulate) {
  auto one = [&](int64_t i) {
    gemm(transA, transB, m, n, k, a + i * strideA, lda, b + i * strideB, ldb, c + i * strideC, ldc,
         accumulate);
  };
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k * batch;
  // Batch entries may go to different threads only when they write different C's.
  if (strideC != 0 && batch > 1 && batch >= numThreads() && flops >= kMinFlops) {
    // Inside a region gemm runs inline, so each thread does whole products.
    parallelFor(batch, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) one(i);
    });
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                          const float*, int64_t, float*, int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, double*, int64_t, bool);
template void gemmBatched<float>(int64_t, bool, bool, int64_t, int64_t, int64_t, const float*,
                                 int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t,
                                 int64_t, bool);
template void gemmBatched<double>(int64_t, bool, bool, int64_t, int64_t, int64_t, const double*,
                                  int64_t, int64_t, const double*, int64_t, int64_t, double*,
                                  int64_t, int64_t, bool);

}  // namespace loom::ag::detail

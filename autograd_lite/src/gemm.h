// Private: the one matrix-product kernel every op uses (matmul, linear, conv2d), threaded.
#pragma once

#include <cstdint>

namespace loom::ag::detail {

// C (+)= op(A) op(B), all row-major with leading dimensions (elements between rows):
//   op(A): [m, k], stored as A [m, k] (lda >= k) or, with transA, as A [k, m] (lda >= m);
//   op(B): [k, n], stored as B [k, n] (ldb >= n) or, with transB, as B [n, k] (ldb >= k);
//   C: [m, n] (ldc >= n); accumulate adds into C, otherwise C is overwritten.
// Eigen or OpenBLAS does the arithmetic; C is cut into row or column tiles (whichever
// dimension is longer) whose bounds depend on m, n and k only, and numThreads() threads share
// the tiles: every element is computed by one thread, by the same call as on one thread.
template <class T>
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate);

// `batch` independent products, the i-th at a + i * strideA, b + i * strideB, c + i * strideC
// (a stride of 0 reuses one matrix for every batch entry). Threads split the batch when it
// has at least as many entries as there are threads, otherwise each product.
template <class T>
void gemmBatched(int64_t batch, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                 const T* a, int64_t lda, int64_t strideA, const T* b, int64_t ldb, int64_t strideB,
                 T* c, int64_t ldc, int64_t strideC, bool accumulate);

// Once per process, before the first product: OpenBLAS's own threads off (gemm.cc says why)
// and its kernel set checked against the CPU, upgraded or warned about (blas_kernels.cc).
void prepareKernels();

}  // namespace loom::ag::detail

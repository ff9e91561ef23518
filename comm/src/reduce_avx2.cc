// Reduction kernels built with -mavx2 -mfma -mf16c; only called when the CPU has them.
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "half.h"
#include "reduce_isa.h"

namespace loom::comm::avx2 {
#define LOOM_KERNELS_F16C 1
#include "reduce_kernels.inc"

ReduceFn lookupKernel(DType dtype, ReduceOp op) {
  return lookup(dtype, op);
}
void divideKernel(void* data, size_t n, DType dtype, int64_t divisor) {
  divide(data, n, dtype, divisor);
}
}  // namespace loom::comm::avx2
